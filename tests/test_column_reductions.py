"""Reductions over leading axes (column kernels) against the reference interpreter: column
sums and maxima with full reductions in the same loop, small trailing dimensions, NaNs;
and against NumPy at shapes hypothesis draws."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.executable import _KernelStep
from fastgrad.testing import strategies as fst

rng = np.random.default_rng(11)


def bias_loss(b, m):
    z = fnp.tanh(m + b)
    return fnp.sum(z * z) + fnp.mean(fnp.min(m * 3, axis=0))


def column_stats(m):
    return fnp.max(m, axis=0), fnp.sum(fnp.max(m, axis=0)), fnp.sum(m * 2)


def small_trailing(x):
    return fnp.sum(x * x, axis=0), fnp.max(x, axis=(0, 1)), fnp.sum(fnp.exp(x), axis=0).sum()


CASES = [
    (
        fg.value_and_grad(bias_loss),
        lambda dt: (
            rng.standard_normal(7),
            rng.standard_normal((9, 7)),
        ),
    ),
    (small_trailing, lambda dt: (rng.standard_normal((37, 8, 2)),)),
    (column_stats, lambda dt: (rng.standard_normal((13, 6)),)),
    (lambda x: fnp.sum(x, axis=(0, 1)), lambda dt: (rng.standard_normal((5, 6, 3, 2)),)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_reference(case, dtype):
    fun, make = CASES[case]
    args = tuple(a.astype(dtype) for a in make(dtype))
    fused = fg.pytree.flatten(fg.jit(fun)(*args))[0]
    reference = fg.pytree.flatten(fg.jit(fun, fuse=False)(*args))[0]
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for f, r in zip(fused, reference, strict=True):
        assert np.asarray(f).dtype == np.asarray(r).dtype
        np.testing.assert_allclose(f, r, rtol=tol, atol=tol)
    plan = fg.jit(fun).lower(*args).executable.plan
    assert any(s.source.column for s in plan if isinstance(s, _KernelStep))


def test_nan_propagates_through_column_max_and_full_sum():
    m = rng.standard_normal((6, 4))
    m[3, 2] = np.nan
    col, total, s = fg.jit(column_stats)(m)
    np.testing.assert_array_equal(np.isnan(col), [False, False, True, False])
    assert np.isnan(total) and np.isnan(s)


@settings(max_examples=20, deadline=None)
@given(
    shape=fst.shapes(min_dims=2, max_dims=3, max_side=9),
    lead=st.integers(1, 2),
    op=st.sampled_from(["sum", "max"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    data=st.data(),
)
def test_leading_axes_reduced_at_any_shape(shape, lead, op, dtype, data):
    """Reduce the first `lead` axes of an elementwise expression, with a full sum of it in
    the same loop. Oracle: NumPy on the same maths, in float64."""
    lead = min(lead, len(shape) - 1)
    axes = tuple(range(lead))
    x = data.draw(fst.arrays(shape, dtype))
    reduce = getattr(fnp, op)

    def f(x):
        z = fnp.tanh(x) * x + 1
        return reduce(z, axis=axes), fnp.sum(z)

    col, total = fg.jit(f)(x)
    z = np.tanh(x.astype(np.float64)) * x + 1
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert col.dtype == dtype and col.shape == shape[lead:]
    np.testing.assert_allclose(col, getattr(np, op)(z, axis=axes), rtol=tol, atol=tol)
    np.testing.assert_allclose(total, z.sum(), rtol=tol, atol=tol * z.size)
    plan = fg.jit(f).lower(x).executable.plan
    assert any(s.source.column for s in plan if isinstance(s, _KernelStep))


def _raveled(f, *args):
    """Whether `f`'s column kernel runs over raveled operands, or in blocks of rows in the
    vector lanes (codegen.lanecolumns), not the nested form."""
    plan = fg.jit(f).lower(*args).executable.plan
    column = [s.source.source for s in plan if isinstance(s, _KernelStep) and s.source.column]
    assert column
    return all("e = base + p" in source or "j * np.uint64(64) + r" in source for source in column)


@settings(max_examples=12, deadline=None)
@given(
    lead=st.sampled_from([(1,), (3,), (37,), (1100,), (4, 70)]),
    kept=st.sampled_from([(1,), (2,), (3,), (8, 2), (16,), (70,), (2100,)]),
    op=st.sampled_from(["sum", "max", "min", "prod"]),
    bias=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_raveled_columns_match_reference(lead, kept, op, bias, dtype, seed):
    """Reduced over its leading axes with rows of one or many (m) loop rows, a partial last
    row, several blocks of rows and several tiles of positions (2100 > one tile); a
    kept-shaped operand, an elementwise output and a full sum in the same loop.
    Oracle: the reference interpreter."""
    shape = lead + kept
    if np.prod(shape) > 80000:  # keep the examples small
        shape = (3, *kept)
    draw = np.random.default_rng(seed)  # large arrays: too slow to draw element-wise
    x = draw.uniform(-2, 2, shape).astype(dtype)
    b = draw.uniform(-2, 2, kept).astype(dtype)
    axes = tuple(range(len(shape) - len(kept)))
    reduce = getattr(fnp, op)

    def f(x, b):
        z = fnp.tanh(x + b) if bias else x * 0.5 + 0.25
        return reduce(z, axis=axes), fnp.sum(z * z), z * 3

    _matches_reference_raveled(f, x, b)


def _matches_reference_raveled(f, x, y):
    fused, reference = fg.jit(f)(x, y), fg.jit(f, fuse=False)(x, y)
    tol = 2e-4 if x.dtype == np.float32 else 1e-11
    for u, r in zip(fused, reference, strict=True):
        assert u.dtype == r.dtype and u.shape == r.shape
        np.testing.assert_allclose(u, r, rtol=tol, atol=tol * max(1, x.size**0.5))
    assert _raveled(f, x, y)


def test_raveled_columns_read_strided_inputs():
    # A transposed input is not C-contiguous: the kernel ravels a copy of it.
    x = rng.standard_normal((8, 300))
    out = fg.jit(lambda x: fnp.max(x * 2, axis=0))(x.T)
    np.testing.assert_array_equal(out, (x.T * 2).max(axis=0))
    assert _raveled(lambda x: fnp.max(x * 2, axis=0), x.T)


def test_nan_in_the_partial_last_row():
    x = rng.standard_normal((101, 3))  # rows of 21 loop rows: the last one partial
    x[100, 1] = np.nan
    col = fg.jit(lambda x: fnp.max(x, axis=0))(x)
    np.testing.assert_array_equal(np.isnan(col), [False, True, False])
    np.testing.assert_array_equal(col[[0, 2]], x.max(axis=0)[[0, 2]])


@settings(max_examples=6, deadline=None)
@given(
    lead=st.sampled_from([(1,), (3,), (37,), (301,), (2, 3)]),
    kept=st.sampled_from([(8, 2), (3, 1), (2, 5), (1, 4), (70,), (4, 3, 2)]),
    mask=st.integers(0, 63),
    spans=st.booleans(),
    op=st.sampled_from(["sum", "max", "min"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    nan=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_operands_broadcast_over_kept_axes(lead, kept, mask, spans, op, dtype, nan, seed):
    """Operands broadcast over some kept axes, spanning the reduced axes (read through a
    table of offsets: the mixture likelihood's x[:, None, :] in bench M4) or not (tiled
    along a row), with rows of many loop rows and a partial last one; a NaN propagates
    through max and min. Oracle: the reference interpreter."""
    shape = lead + kept
    keep = tuple(1 if mask >> k & 1 else d for k, d in enumerate(kept))
    draw = np.random.default_rng(seed)
    x = draw.uniform(-2, 2, shape).astype(dtype)
    y = draw.uniform(-2, 2, (lead if spans else (1,) * len(lead)) + keep).astype(dtype)
    if nan:
        x.reshape(-1)[draw.integers(x.size)] = np.nan
    axes = tuple(range(len(lead)))
    reduce = getattr(fnp, op)

    def f(x, y):
        z = (x - y) * y
        return reduce(z, axis=axes), fnp.sum(z * x, axis=axes)

    _matches_reference_raveled(f, x, y)


def test_broadcast_over_some_reduced_axes_keeps_the_nested_form():
    # (4, 1, 8, 2) against (4, 5, 8, 2) reduced over its first two axes: its offset is not
    # a multiple of the raveled row.
    x, y = rng.standard_normal((4, 5, 8, 2)), rng.standard_normal((4, 1, 8, 2))

    def f(x, y):
        return fnp.sum(x * y, axis=(0, 1))

    np.testing.assert_allclose(fg.jit(f)(x, y), (x * y).sum(axis=(0, 1)), rtol=1e-12)
    assert not _raveled(f, x, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_several_blocks_of_rows(dtype):
    # 210,003 elements: rows of 21 loop rows, 3 blocks of them, the last row partial; a NaN
    # in the middle block and a maximum in the last row.
    x = rng.standard_normal((70001, 3)).astype(dtype)
    x[40000, 0], x[70000, 2] = np.nan, 100

    def f(x):
        return fnp.max(x, axis=0), fnp.sum(x * 0.5, axis=0), fnp.min(x, axis=0)

    fused, reference = fg.jit(f)(x), fg.jit(f, fuse=False)(x)
    np.testing.assert_array_equal(fused[0], reference[0])  # maxima and minima are exact
    np.testing.assert_array_equal(fused[2], reference[2])
    assert np.isnan(fused[0][0]) and fused[0][2] == 100 and np.isnan(fused[2][0])
    # Sums in another order: against the float64 sum, within float32's rounding of 70,001
    # terms (the reference's sequential sum is no closer).
    exact = (x.astype(np.float64) * 0.5).sum(axis=0)
    tol = 2e-2 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(fused[1][1:], exact[1:], atol=tol)
    assert np.isnan(fused[1][0])
    assert _raveled(f, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_column_extrema_with_infinities_and_nans(dtype):
    # K = 3 positions in rows of 96 (m = 32 loop rows, a multiple of the vector width):
    # +-inf, NaN in the partial last row and in a full one; NumPy is the oracle, exactly.
    x = rng.standard_normal((1001, 3)).astype(dtype)
    x[5, 0], x[700, 0], x[17, 1], x[1000, 2], x[3, 2] = np.inf, -np.inf, np.nan, np.nan, -np.inf

    def f(x):
        return fnp.max(x, axis=0), fnp.min(x, axis=0), fnp.max(-x, axis=0)

    for u, r in zip(fg.jit(f)(x), (x.max(0), x.min(0), (-x).max(0)), strict=True):
        np.testing.assert_array_equal(u, r)
    assert _raveled(f, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_column_kernel_with_a_fold_numbered_like_a_dtype(dtype):
    """Ten chained tanh with a bias each: the gradients of the biases are folded in a
    column kernel whose 32nd or 64th value used to be named `f32` or `f64`, the dtype
    every kernel imports (Numba refused the kernel; the loop ran NumPy with a warning)."""
    data = rng.standard_normal((600, 4)).astype(dtype)
    w = (rng.standard_normal((4, 8)) * 0.3).astype(dtype)
    b = (rng.standard_normal(8) * 0.3).astype(dtype)

    def loss(w, b):
        h = data @ w
        for _ in range(10):
            h = fnp.tanh(h + b)
        return fnp.mean(h * h)

    got = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))(w, b)
    want = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)), fuse=False)(w, b)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for a, e in zip(fg.pytree.flatten(got)[0], fg.pytree.flatten(want)[0], strict=True):
        np.testing.assert_allclose(a, e, rtol=tol, atol=tol)
