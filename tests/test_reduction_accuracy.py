"""float32 sums follow the accumulation policy (docs/conventions.md, "Accuracy of
reductions": runs of at most codegen.runs.RUN terms in float32, the runs' totals, and
every longer chain, in float64) in every kernel form that reduces: one pass and several
passes over rows, blocks of short rows and of columns, raveled and nested column loops,
merged axes, full reductions (partials per chunk, serial and parallel) and full
reductions of row values.

The terms are integers of at most 2^13 in magnitude (products of integers of at most
2^6 and 2^7, differences of integers below 2^13 or within 2^12 of 0, computed exactly by
NumPy and the kernels alike), so every float32 run total (below 2^24) is exact and every
float64 sum is: under the policy the result is the exact sum rounded once, and the test
asks for that float32 value exactly. Axes of 2^19 terms of one sign, where a float32
accumulator (a vector lane's 8192 terms reach 2^25) rounds away more than an ulp of the
result. About 60 s, most of it compiling one kernel per form.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.executable import _KernelStep


def _centred(x, axis):
    return x - fnp.max(x, axis=axis, keepdims=True)


def _np_centred(x, axis):
    return x - np.max(x, axis=axis, keepdims=True)


# name -> (function of x and y, the float32 terms it sums (NumPy), the axes it sums over,
# shape of x, shape of y, a piece of the kernel source that marks the form)
FORMS = {
    "rows, one pass": (
        lambda x, y: fnp.sum(x * y, axis=-1),
        lambda x, y: x * y,
        -1,
        (2, 1 << 19),
        (2, 1 << 19),
        "for i1 in range",
    ),
    "rows, two passes": (
        lambda x, y: fnp.sum(_centred(x, -1), axis=-1),
        lambda x, y: _np_centred(x, -1),
        -1,
        (2, 1 << 19),
        (1,),
        "for i1 in range",
    ),
    "rows, full reduction after a row pass": (
        lambda x, y: fnp.sum(_centred(x, -1)),
        lambda x, y: _np_centred(x, -1),
        None,
        (2, 1 << 19),
        (1,),
        "p0[c] =",
    ),
    "blocks of short rows": (
        lambda x, y: fnp.sum(x * y, axis=-1),
        lambda x, y: x * y,
        -1,
        (1 << 12, 8),
        (1 << 12, 8),
        "for rb in range(lo, hi",
    ),
    "blocks of short rows, all axes": (
        lambda x, y: fnp.sum(_centred(x, -1)),
        lambda x, y: _np_centred(x, -1),
        None,
        (1 << 14, 8),
        (1,),
        "for rb in range(lo, hi",
    ),
    "blocks of columns": (
        lambda x, y: fnp.sum(_centred(x, 0), axis=0),
        lambda x, y: _np_centred(x, 0),
        0,
        (1 << 19, 3),
        (1,),
        "for rb in range(lo, hi",
    ),
    "columns, raveled": (
        lambda x, y: fnp.sum(x * y, axis=0),
        lambda x, y: x * y,
        0,
        (1 << 19, 3),
        (1 << 19, 3),
        "for p in range(plo",
    ),
    "columns, nested": (
        lambda x, y: fnp.sum(x * y, axis=(0, 1)),
        lambda x, y: x * y,
        (0, 1),
        (1 << 10, 1 << 9, 2),
        (1 << 9, 2),
        "[lo:hi] = f64(0)",  # its accumulators, a part of each per chunk
    ),
    "merged axes": (
        lambda x, y: fnp.sum(_centred(x, (1, 2)), axis=(1, 2)),
        lambda x, y: _np_centred(x, (1, 2)),
        (1, 2),
        (2, 1 << 10, 1 << 9),
        (1,),
        ".reshape(",
    ),
    "all axes": (
        lambda x, y: fnp.sum(x * y),
        lambda x, y: x * y,
        None,
        (1 << 19,),
        (1 << 19,),
        "p0[c] =",
    ),
    "all axes, parallel partials": (
        lambda x, y: fnp.sum(x * y),
        lambda x, y: x * y,
        None,
        (1 << 18,),
        (1 << 18,),
        "prange",
    ),
    "all axes of row values": (
        lambda x, y: fnp.sum(fnp.sum(x, axis=-1) * y),
        None,  # two levels of sums: checked against the row sums' float64 sum
        None,
        (1 << 12, 16),
        (1 << 12,),
        "s0 = radd(s0, ",
    ),
}


def _data(kind: str, shape: tuple[int, ...], rng: np.random.Generator, bits: int) -> np.ndarray:
    """Integers below 2^bits: of one sign ("positive") or both ("signed")."""
    low = 0 if kind == "positive" else -(1 << bits)
    return rng.integers(low, 1 << bits, shape).astype(np.float32)


def _source(f, *args) -> str:
    plan = fg.jit(f).lower(*args).executable.plan
    return "\n".join(s.source.source for s in plan if isinstance(s, _KernelStep))


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(sorted(FORMS)),
    kind=st.sampled_from(["positive", "signed"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_float32_sums_are_exact_sums_rounded_once(name, kind, seed):
    f, terms, axis, x_shape, y_shape, marker = FORMS[name]
    rng = np.random.default_rng(seed)
    products = y_shape != (1,)
    x = _data(kind, x_shape, rng, 6 if products else 13 if kind == "positive" else 12)
    y = _data(kind, y_shape, rng, 7)
    got = fg.jit(f)(x, y)
    if terms is None:  # a sum over rows of (row sums, exact in float32) * y
        rows = x.astype(np.float64).sum(axis=-1).astype(np.float32)
        want = np.float32((rows * y).astype(np.float64).sum())
    else:
        t = terms(x, y)
        assert np.abs(t).max() <= 2**13  # a run of 1024 stays below 2^24
        want = t.astype(np.float64).sum(axis=axis).astype(np.float32)  # exact, then rounded
    np.testing.assert_array_equal(got, want, err_msg=name)
    assert marker in _source(f, x, y), name  # the form this case is meant to test


@pytest.mark.parametrize("axis", [0, -1, None])
def test_float64_sums_unchanged(axis):
    """float64 sums keep their float64 accumulator (no wider type in the kernel)."""
    x = np.random.default_rng(1).standard_normal((1 << 10, 70))
    got = fg.jit(lambda x: fnp.sum(x, axis=axis))(x)
    np.testing.assert_allclose(got, np.sum(x, axis=axis), rtol=1e-12, atol=1e-11)
    assert "f64(0)" in _source(lambda x: fnp.sum(x, axis=axis), x)
