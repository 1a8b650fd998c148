"""vecmath's power (x**y for exponents that are not constant-reducible) against NumPy: the
special values exactly (zeros and their signs, infinities, nan, negative bases), values
within an ulp of NumPy and of a wider-precision reference on hypothesis and swept inputs,
float32 and float64; the loop vectorizes; fused kernels use it and agree with the
reference interpreter."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.codegen import vecmath as vm
from test_vecmath import (
    _PACKED,
    HIGH_PRECISION_LONGDOUBLE,
    _host_has_avx2,
    error_vs_exact,
    ulp_distance,
)

DTYPES = [np.float64, np.float32]
ID = {np.float64: "f64", np.float32: "f32"}
# NumPy's pow is within ~0.5 ulp of exact, ours within ~0.9 (measured over 1.2M inputs
# per dtype with |y*log|x|| up to the overflow threshold): at most 1 ulp apart. NumPy's
# float32 power on AVX-512 builds may differ more, as its log does (test_vecmath).
TOL_NUMPY = 4
TOL_EXACT = 1.0

_LOOPS: dict = {}


def binary(name, x, y):
    """vecmath's two-argument `name` of two arrays of one dtype, in a jitted loop."""
    key = (name, x.dtype.name)
    if key not in _LOOPS:
        f = vm.FUNCTIONS[key]

        @numba.njit(error_model="numpy")
        def loop(x, y, out):
            for i in range(x.size):
                out[i] = f(x[i], y[i])

        _LOOPS[key] = loop
    out = np.empty_like(x)
    _LOOPS[key](np.ascontiguousarray(x), np.ascontiguousarray(y), out)
    return out


def power(x, y):
    """vecmath's power of two arrays of one dtype, evaluated in a jitted loop."""
    return binary("power", x, y)


def numpy_power(x, y):
    with np.errstate(all="ignore"):
        return np.power(x, y)


def exact_power(x, y):
    wide = np.longdouble if x.dtype == np.float64 else np.float64
    with np.errstate(all="ignore"):
        return np.power(x.astype(wide), y.astype(wide))


def _special_grid(dtype):
    fi = np.finfo(dtype)
    values = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, -0.5, 2.0, -2.0, 3.0]
    values += [-3.0, 2.5, -2.5, 1e-3, float(fi.tiny), float(fi.smallest_subnormal)]
    values += [-float(fi.smallest_subnormal), float(fi.max), -float(fi.max), 2.0**60]
    values += [-(2.0**60), 2.0**24 + 2, 2.0**53 + 2, -(2.0**24 + 1), 1 + float(fi.eps)]
    values += [1 - float(fi.epsneg), -1 - float(fi.eps)]
    v = np.array(values, np.float64).astype(dtype)
    x, y = np.meshgrid(v, v)
    return x.ravel(), y.ravel()


@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
def test_special_values_equal_numpy(dtype):
    """Every pair of zeros, ones, infinities, nan, negative bases with odd, even and
    non-integer exponents, extremes and subnormals: NumPy's result, the sign of zero
    and of infinity included."""
    x, y = _special_grid(dtype)
    ours, ref = power(x, y), numpy_power(x, y)
    # Special operands must agree exactly. Results that over/underflow from finite
    # operands are compared in ulps, as in test_vecmath: inf is one ulp above the largest
    # float and 0 one below the smallest subnormal (a result at a rounding tie there,
    # 2^-150 in float32, may round to either side).
    exact = ~np.isfinite(x) | ~np.isfinite(y) | (x == 0) | (y == 0) | (np.abs(x) == 1)
    exact |= np.isnan(ref)
    for i in np.nonzero(exact)[0]:
        assert np.isnan(ours[i]) == np.isnan(ref[i]), (x[i], y[i], ours[i], ref[i])
        if not np.isnan(ref[i]):
            same = ours[i] == ref[i] and np.signbit(ours[i]) == np.signbit(ref[i])
            assert same, (x[i], y[i], ours[i], ref[i])
    assert ulp_distance(ours, ref).max() <= TOL_NUMPY


def _operands(dtype, n, seed):
    """Bases over the whole positive and negative range with exponents up to the size
    that overflows (y*log|x| up to +-log(max)); a quarter of the exponents integers."""
    rng = np.random.default_rng(seed)
    lmax = float(np.log(np.finfo(dtype).max))
    x = np.exp(rng.uniform(-lmax, lmax, n)) * rng.choice([-1.0, 1.0], n)
    t = np.maximum(np.abs(np.log(np.abs(x))), 1e-3)
    y = rng.uniform(-lmax, lmax, n) / t * rng.uniform(0, 1, n) ** 3
    y[: n // 4] = np.round(y[: n // 4])
    x[n // 2 :] = 1 + rng.uniform(-0.4, 0.4, n - n // 2)  # near one, large exponents
    y[n // 2 :] = rng.uniform(-200, 200, n - n // 2)
    return x.astype(dtype), y.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
def test_sweep_within_an_ulp(dtype):
    x, y = _operands(dtype, 40_000, seed=7)
    ours = power(x, y)
    assert ulp_distance(ours, numpy_power(x, y)).max() <= TOL_NUMPY
    if dtype == np.float64 and not HIGH_PRECISION_LONGDOUBLE:
        return  # no float64 reference
    err = error_vs_exact(ours, exact_power(x, y))
    i = int(np.argmax(err))
    assert err[i] <= TOL_EXACT, f"{err[i]} ulp at x={x[i]!r}, y={y[i]!r} -> {ours[i]!r}"


@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_hypothesis_values_match_numpy(dtype, data):
    n = data.draw(st.integers(1, 16))
    values = st.floats(width=32 if dtype == np.float32 else 64)  # nan, infs, subnormals
    x = data.draw(arrays(dtype, n, elements=values))
    y = data.draw(arrays(dtype, n, elements=values | st.integers(-40, 40).map(float)))
    ours, ref = power(x, y), numpy_power(x, y)
    assert np.array_equal(np.isnan(ours), np.isnan(ref))
    assert ulp_distance(ours, ref).max() <= TOL_NUMPY, (x, y, ours, ref)


@pytest.mark.skipif(not _host_has_avx2(), reason="host CPU lacks AVX2/FMA: no packed code")
@pytest.mark.skipif(
    numba.config.CPU_NAME not in (None, "host"), reason="NUMBA_CPU_NAME targets another CPU"
)
@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
def test_loop_vectorizes(dtype):
    """Packed FMAs in the loop: LLVM vectorized it (a scalar pow call would prevent that);
    float32 computes in float64, so its packed code is double."""
    x = np.linspace(0.1, 3.0, 64, dtype=dtype)
    power(x, x)
    loop = _LOOPS[("power", np.dtype(dtype).name)]
    asm = loop.inspect_asm(loop.signatures[0])
    assert "pd" in {m.group(1) for m in _PACKED.finditer(asm)}, "no packed FMA in the loop"


@settings(max_examples=10, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    n=st.integers(1, 40),
    exponent=st.sampled_from([2.7, -0.3, 1 / 3, 20.5]),
    seed=st.integers(0, 2**32 - 1),
)
def test_fused_kernels_use_it(dtype, n, exponent, seed):
    """x**y with a traced y and x**c with a non-reducible constant, forward and backward:
    kernels call vecmath's power (no `**` left: a libm pow in a vector loop is one scalar
    call per lane), and agree with the reference interpreter."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.05, 3, n).astype(dtype)
    y = rng.uniform(-3, 3, n).astype(dtype)

    def f(x, y):
        return fnp.sum(x**y * fnp.tanh(x)) + fnp.sum((x + 1) ** exponent)

    rtol = 2e-5 if dtype == np.float32 else 1e-12
    for fun in (f, fg.grad(f, argnums=(0, 1))):
        fused = fg.pytree.flatten(fg.jit(fun)(x, y))[0]
        reference = fg.pytree.flatten(fg.jit(fun, fuse=False)(x, y))[0]
        for a, b in zip(fused, reference, strict=True):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
    kernels = fg.jit(f).lower(x, y).kernels
    assert any(f"power_{ID[dtype]}" in k for k in kernels)
    assert not any("**" in k for k in kernels)
