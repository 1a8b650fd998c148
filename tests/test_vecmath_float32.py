"""float32 vector math in float32 lanes: dense sweeps of every k-th float32 against
float64 NumPy, and the loops' code free of float64.

test_vecmath.py samples random bit patterns and ranges; these walk the bit patterns of a
range in order, so no stretch of inputs (a polynomial's hand-over point, a binade where
rounding errors add up) is skipped.
"""

from __future__ import annotations

import re

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


def _loop_of(name):
    f = getattr(vm, name)

    @numba.njit(error_model="numpy")
    def loop(x, out):
        for i in range(x.shape[0]):
            out[i] = f(x[i])

    return loop


@pytest.mark.parametrize("lo,hi", [(85.0, 89.0), (-104.0, -85.0), (-89.0, -85.0)])
def test_exp_sweep_over_and_underflow(lo, hi):
    """Every float32 where exp overflows, underflows to subnormals and to 0: the two-step
    scaling (scale2_f32) rounds once on each side of n = 0."""
    x = _sweep(min(abs(lo), abs(hi)), max(abs(lo), abs(hi)), 7)
    x = x if lo > 0 else -x
    y = np.empty_like(x)
    _loop_of("exp_f32")(x, y)
    with np.errstate(over="ignore"):
        exact = np.exp(x.astype(np.float64))
    finite = exact < np.finfo(np.float32).max
    assert np.all(np.isinf(y[~finite]))
    # subnormal results: an ulp is the smallest subnormal
    spacing = np.maximum(
        np.spacing(np.abs(exact[finite].astype(np.float32))).astype(np.float64),
        float(np.finfo(np.float32).smallest_subnormal),
    )
    err = np.abs(y[finite] - exact[finite]) / spacing
    assert err.max() <= TOL_EXACT, (err.max(), x[finite][np.argmax(err)])


@pytest.mark.parametrize("name", ["exp_f32", "tanh_f32", "sigmoid_f32", "sin_bounded_f32"])
def test_float32_loops_keep_32_bit_integer_lanes(name):
    """The exponent and quadrant arithmetic of float32 helpers stays in 32-bit integer
    lanes: a 64-bit lane (a shift of a sign-extended int, a float64 bit pattern read
    whole) halves the lanes of that arithmetic and adds shuffles to narrow it back."""
    loop = _loop_of(name)
    x = np.linspace(0.1, 3.0, 64, dtype=np.float32)
    loop(x, np.empty_like(x))
    ir = loop.inspect_llvm(loop.signatures[0])
    assert not re.search(r"= (?:add|sub|shl|ashr|lshr|and|or|icmp \w+) <\d+ x i64>", ir)
