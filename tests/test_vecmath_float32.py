"""float32 vector math in float32 lanes: dense sweeps of every k-th float32 against
float64 NumPy, and the loops' code free of float64.

test_vecmath.py samples random bit patterns and ranges; these walk the bit patterns of a
range in order, so no stretch of inputs (a polynomial's hand-over point, a binade where
rounding errors add up) is skipped.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from fastgrad.compiler.codegen import vecmath as vm

# The promise of test_vecmath.TOL_EXACT: within 1.1 ulp of the exact result.
TOL_EXACT = 1.1


@numba.njit(error_model="numpy")
def _tanh_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = vm.tanh_f32(x[i])


def _sweep(lo: float, hi: float, step: int) -> np.ndarray:
    """Every `step`-th float32 from lo to hi (0 <= lo < hi), by bit pattern."""
    bits = np.arange(
        np.float32(lo).view(np.int32), np.float32(hi).view(np.int32), step, dtype=np.int32
    )
    return bits.view(np.float32)


def _ulps(y: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|y - exact| in ulps of exact rounded to float32."""
    spacing = np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    return np.abs(y.astype(np.float64) - exact) / spacing


@pytest.mark.parametrize(
    "lo,hi,step",
    [
        (0.0, 2.0**-20, 4099),
        (2.0**-20, 0.9, 61),
        (0.9, 1.1, 3),
        (1.1, 10.5, 61),
        (10.5, 1e38, 9973),
    ],
)
def test_tanh_sweep(lo, hi, step):
    """Across the polynomial's hand-over to 1 - 2/(e^2a + 1) at 1 (every third float
    there), its saturation to 1 and down to the subnormals; odd in x."""
    x = _sweep(lo, hi, step)
    x = np.concatenate([x, -x])
    y = np.empty_like(x)
    _tanh_loop(x, y)
    err = _ulps(y, np.tanh(x.astype(np.float64)))
    i = int(np.argmax(err))
    assert err[i] <= TOL_EXACT, f"{err[i]} ulp at x={x[i]!r} -> {y[i]!r}"
    assert np.array_equal(np.signbit(y), np.signbit(x))


def test_tanh_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.0, -1.0], np.float32)
    y = np.empty_like(x)
    _tanh_loop(x, y)
    want = np.tanh(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(y, want, equal_nan=True)
    assert np.array_equal(np.signbit(y[:2]), [False, True])
