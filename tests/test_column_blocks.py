"""Several-pass reductions over the leading axis of a 2-D loop (logsumexp, softmax,
variance over axis 0) run in blocks of columns (codegen.rowblocks.column_blockable),
against the reference interpreter; and column kernels whose reduced axes all have size 1.
About 25 s (one kernel per function, shape class and dtype)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.executable import _KernelStep


def lse0(x):
    return fnp.logsumexp(x, axis=0)


def softmax0(x):
    return fnp.exp(x - fnp.logsumexp(x, axis=0))


def variance0(x):
    return fnp.mean((x - fnp.mean(x, axis=0)) ** 2, axis=0) + fnp.max(x, axis=0)


FUNCTIONS = {"lse0": lse0, "softmax0": softmax0, "variance0": variance0}


def _blocked(f, x) -> bool:
    plan = fg.jit(f).lower(x).executable.plan
    sources = [s.source for s in plan if isinstance(s, _KernelStep)]
    return any(s.column and "for rb in range(lo, hi" in s.source for s in sources)


@settings(max_examples=20, deadline=None)
@given(
    n0=st.sampled_from([1, 2, 3, 70, 130]),
    n1=st.sampled_from([1, 3, 64, 65, 200]),
    name=st.sampled_from(sorted(FUNCTIONS)),
    dtype=st.sampled_from([np.float32, np.float64]),
    special=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_column_blocks_match_reference(n0, n1, name, dtype, special, seed):
    """Partial last blocks (65, 200 columns against blocks of 64), one and many rows,
    infinities and NaNs in some columns. Oracle: the reference interpreter."""
    f = FUNCTIONS[name]
    x = np.random.default_rng(seed).standard_normal((n0, n1)).astype(dtype)
    if special and x.size > 2:
        x.flat[0], x.flat[x.size // 2], x.flat[-1] = np.inf, np.nan, -np.inf
    got = fg.jit(f)(x)
    want = fg.jit(f, fuse=False)(x)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if n0 > 1 and n1 > 1 and name != "variance0":
        assert _blocked(f, x)


@pytest.mark.parametrize("shape", [(1, 8), (1, 3, 2), (1, 1), (1, 2100)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reduced_axes_of_size_one(shape, dtype):
    """A column kernel's row value that keeps the loop's whole shape (every reduced axis of
    size 1, keepdims) is written at each kept position (it was written at the last
    element's only, leaving the rest of the output uninitialized)."""
    x = np.random.default_rng(3).standard_normal(shape).astype(dtype)

    def f(x):
        return fnp.max(x, axis=0, keepdims=True) + 0, fnp.sum(x, axis=0), lse0(x)

    for got, want in zip(fg.jit(f)(x), fg.jit(f, fuse=False)(x), strict=True):
        np.testing.assert_array_equal(got, want)
