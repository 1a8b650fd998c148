"""Shared checks for the fastgrad.numpy function tables (test_manipulation, test_sorting,
test_einsum, test_statistics, test_construction).

A case is a function, its NumPy reference and its arguments; a table is a set of
builders, each drawing a case with hypothesis, and a dict of fixed cases to compile
(`table_tests` makes the two tests each table runs). `check_case` compares the
value on plain arrays and traced under `jit` (reference interpreter) with NumPy's, in
float32 and float64 (dtype and shape included), and checks derivatives at orders 1 and 2,
forward and reverse, against finite differences. `check_fused` runs the compiled kernels
on one case per function and compares them with NumPy and with the unfused gradient.
Hypothesis shapes here include size-0 and size-1 axes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.pytree import flatten
from fastgrad.testing import check_grads

TOL = {np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12}


def shapes(min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 4):
    """Array shapes, including 0-d, size-0 and size-1 axes."""
    return hnp.array_shapes(
        min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
    )


def axes_of(draw, ndim):
    """None, an axis, or a tuple of distinct axes of an array of `ndim` dimensions."""
    if ndim == 0:
        return None
    return draw(
        st.none()
        | st.integers(-ndim, ndim - 1)
        | st.permutations(range(ndim)).flatmap(
            lambda p: st.integers(1, ndim).map(lambda k: tuple(p[:k]))
        )
    )


def values(shape, lo: float = -2.0, hi: float = 2.0, unique: bool = False):
    """float64 arrays of `shape` in [lo, hi]; `unique` keeps values apart (no ties, where
    finite differences would straddle a kink)."""
    if unique:
        # Ranks 0..n-1 in random order, each moved by a part of a step that is not linear
        # in the rank (so no two columns are exactly linear in each other), into [lo, hi].
        n = int(np.prod(shape))

        def spread(p):
            ranks = np.asarray(p, float).reshape(shape)
            jitter = 0.25 + 0.5 * (((ranks + 1) ** 1.5 * 0.6180339887) % 1.0)
            return lo + (hi - lo) * (ranks + jitter) / max(n, 1)

        return st.permutations(list(range(n))).map(spread)
    return hnp.arrays(np.float64, shape, elements=st.floats(lo, hi, width=64))


def _cast(args, dtype):
    return tuple(
        a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args
    )


def assert_same(got, expected, dtype, what=""):
    got_leaves, _ = flatten(got if not isinstance(got, np.ndarray) else (got,))
    exp_leaves, _ = flatten(expected if not isinstance(expected, np.ndarray) else (expected,))
    assert len(got_leaves) == len(exp_leaves), what
    tol = TOL[np.dtype(dtype)]
    for g, e in zip(got_leaves, exp_leaves, strict=True):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape, (what, g.shape, e.shape)
        assert g.dtype == e.dtype, (what, g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=what)


def _floats(out) -> bool:
    leaves, _ = flatten(out if not isinstance(out, np.ndarray) else (out,))
    return any(np.asarray(x).dtype.kind == "f" for x in leaves)


def check_case(fn, ref, args, order: int = 2, dtypes=(np.float32, np.float64), eps=None):
    """Values eager and traced (float32 and float64) against `ref`, and gradients' dtypes;
    derivatives at orders 1 to `order`, forward and reverse, against finite differences
    (float64)."""
    for dtype in dtypes:
        xs = _cast(args, dtype)
        with np.errstate(all="ignore"):
            expected = ref(*xs)
        out = fn(*xs)
        assert_same(out, expected, dtype, "eager")
        assert_same(fg.jit(fn, fuse=False)(*xs), expected, dtype, "traced")
        float_args = tuple(i for i, a in enumerate(xs) if np.asarray(a).dtype.kind == "f")
        if order and float_args and _floats(out):
            grads = fg.grad(_loss(fn), argnums=float_args)(*xs)
            assert [g.dtype for g in grads] == [xs[i].dtype for i in float_args]
    xs = _cast(args, np.float64)
    if order and _floats(fn(*xs)) and any(np.asarray(a).dtype.kind == "f" for a in xs):
        check_grads(fn, xs, order=order, modes=("fwd", "rev"), eps=eps)


def _loss(fn):
    def loss(*a):
        leaves, _ = flatten(fn(*a))
        return sum(fnp.sum(fnp.sin(x)) for x in leaves if x.dtype.kind == "f")

    return loss


def check_fused(fn, ref, args):
    """The compiled function against NumPy (float32 and float64), and its compiled
    gradient (float64) against the reference interpreter's."""
    for dtype in (np.float32, np.float64):
        xs = _cast(args, dtype)
        with np.errstate(all="ignore"):
            expected = ref(*xs)
        assert_same(fg.jit(fn)(*xs), expected, dtype, "fused")
    float_args = tuple(i for i, a in enumerate(xs) if np.asarray(a).dtype.kind == "f")
    if float_args and _floats(fn(*xs)):
        grad = fg.grad(_loss(fn), argnums=float_args)
        assert_same(fg.jit(grad)(*xs), fg.jit(grad, fuse=False)(*xs), dtype, "fused grad")


def table_tests(builders, compiled):
    """The tests of one table: every builder's cases against NumPy with derivatives, and
    every fixed case compiled. Assign them to module-level `test_...` names."""
    cases = {b.__name__: b for b in builders}

    @pytest.mark.parametrize("name", sorted(cases))
    @given(data=st.data())
    def test_matches_numpy_with_gradients(name, data):
        fn, ref, args = cases[name](data.draw)
        check_case(fn, ref, args)

    @pytest.mark.parametrize("name", sorted(compiled))
    def test_compiled(name):
        check_fused(*compiled[name])

    return test_matches_numpy_with_gradients, test_compiled


def assert_rejected(call, error, match, x):
    """`call(x)` raises `error` matching `match`, on a plain array and traced."""
    with pytest.raises(error, match=match):
        call(x)
    with pytest.raises(error, match=match):
        fg.jit(call)(x)
