"""Column loops whose operands span the reduced axis but are broadcast over kept ones run
in blocks of rows in the vector lanes (codegen.lanecolumns): against the reference
interpreter and NumPy, forward and backward, sums (float32 in runs), max and min with
NaN, partial blocks, size-1 and short kept axes, a non-contiguous input, keepdims."""

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from oracle import fused_matches_reference, kernel_sources


def _lanes(f, *args):
    """Whether a kernel of f's plan runs in this form (its blocks of transposed rows)."""
    return any("B = np.empty((nb, np.uint64(64)" in source for source in kernel_sources(f, *args))


def _columns(x, means, c, reduce):
    """M4's backward loop: (x[:, None, :] - means) * c[:, :, None] reduced over N."""
    z = (x[:, None, :] - means) * c[:, :, None]
    return reduce(z, axis=0), reduce(z * x[:, None, :], axis=0, keepdims=True)


REDUCE = {"sum": fnp.sum, "max": fnp.max, "min": fnp.min}


@settings(max_examples=8, deadline=None)
@given(
    n=st.sampled_from([2, 63, 65, 130, 5000]),
    k=st.sampled_from([1, 3, 8]),
    d=st.sampled_from([1, 2]),
    op=st.sampled_from(list(REDUCE)),
    view=st.booleans(),
    nan=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
@example(n=5000, k=8, d=2, op="sum", view=True, nan=False, dtype=np.float32, seed=0)
@example(n=130, k=8, d=2, op="max", view=False, nan=True, dtype=np.float64, seed=1)
def test_lane_columns_match_reference(n, k, d, op, view, nan, dtype, seed):
    draw = np.random.default_rng(seed)
    x = draw.uniform(-3, 3, (d, n) if view else (n, d)).astype(dtype)
    x = x.T if view else x
    means = draw.uniform(-1, 1, (k, d)).astype(dtype)
    c = draw.uniform(-1, 1, (n, k)).astype(dtype)
    if nan:
        c[draw.integers(n), draw.integers(k)] = np.nan
    reduce = REDUCE[op]
    args = (x, means, c)
    if k > 1 and d > 1:
        assert _lanes(lambda *a: _columns(*a, reduce), *args)

    def f(*args):
        loss = lambda *a: fnp.sum(_columns(*a, reduce)[0])  # noqa: E731
        return fg.grad(loss, argnums=(0, 1, 2))(*args), _columns(*args, reduce)

    tol = 2e-5 if dtype == np.float32 else 1e-12
    fused = fused_matches_reference(f, args, tol, tol * n)
    z = (x[:, None, :].astype(np.float64) - means) * c[:, :, None]
    numpy = {"sum": np.sum, "max": np.max, "min": np.min}[op]
    np.testing.assert_allclose(fused[-2], numpy(z, axis=0), rtol=tol, atol=tol * n)


def test_float32_sums_follow_the_run_policy():
    """Integer terms whose every lane run is exact in float32: the result is the exact sum
    rounded once (a float32 accumulator over all 2^20 rows would lose the low bits)."""
    n = 1 << 20
    x = np.full((n, 2), 4097.0, np.float32)
    c = np.ones((n, 8), np.float32)
    means = np.zeros((8, 2), np.float32)
    total = fg.jit(lambda x, m, c: _columns(x, m, c, fnp.sum)[0])(x, means, c)
    assert _lanes(lambda x, m, c: _columns(x, m, c, fnp.sum)[0], x, means, c)
    np.testing.assert_array_equal(total, np.float32(4097.0 * n))
