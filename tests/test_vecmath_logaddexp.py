"""vecmath's logaddexp (softplus is logaddexp(x, 0)) against NumPy: special values exactly
(infinities of either sign, equal arguments, nan), other values within a few ulps of the
larger of the result and the bigger argument (both compute max + log1p(exp(-|x - y|)),
whose sum cancels where the result is near 0); fused kernels call it, never NumPy's
scalar logaddexp, and agree with the reference interpreter. ~10 s (two helper compiles).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from test_vecmath import _PACKED, _host_has_avx2
from test_vecmath_power import _LOOPS, binary

DTYPES = [np.float64, np.float32]
inf, nan = np.inf, np.nan
SPECIAL = [
    (0.3, 0.3), (0.0, 0.0), (-0.0, 0.0), (1.0, 2.0), (1000.0, 0.0), (-1000.0, 0.0),
    (1e30, 1e30), (40.0, -40.0), (88.0, 88.5), (-88.0, -87.0), (1e-30, 0.0),
    (inf, 1.0), (1.0, inf), (-inf, 1.0), (inf, inf), (-inf, -inf), (inf, -inf),
    (-inf, inf), (nan, 1.0), (1.0, nan), (nan, inf), (-inf, nan),
]  # fmt: skip


def logaddexp(x, y):
    return binary("logaddexp", x, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values_are_numpys(dtype):
    x, y = (np.array(v, dtype) for v in zip(*SPECIAL, strict=True))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(logaddexp(x, y), np.logaddexp(x, y))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.5, 30.0, 1e4])
def test_values_are_within_a_few_ulps_of_numpy(dtype, scale):
    rng = np.random.default_rng(int(scale))
    x, y = ((rng.standard_normal(20_000) * scale).astype(dtype) for _ in range(2))
    ours, ref = logaddexp(x, y), np.logaddexp(x, y)
    assert ours.dtype == dtype
    # both round max + log1p(...) once more than they would if the sum did not cancel
    size = np.maximum(np.abs(ref), np.maximum(np.abs(x), np.abs(y)).clip(min=np.log(2)))
    assert np.max(np.abs(ours - ref) / np.spacing(size.astype(dtype))) <= 4


@pytest.mark.parametrize("dtype", DTYPES)
def test_softplus_kernels_call_the_vector_helper(dtype):
    def loss(x, y):
        return fnp.mean(fnp.logaddexp(x, 0.0) - y * x) + fnp.sum(fnp.logaddexp(x, y))

    rng = np.random.default_rng(3)
    x, y = ((rng.standard_normal(1000) * 20).astype(dtype) for _ in range(2))
    x[:4] = [inf, -inf, 0.0, 1e4]
    f = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))
    sources = "\n".join(f.lower(x, y).kernels)
    assert "np.logaddexp" not in sources and "logaddexp_f" in sources
    value, grads = f(x, y)
    ref_value, ref_grads = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)), fuse=False)(x, y)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(value, ref_value, rtol=tol)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_loop_vectorizes(dtype):
    """Packed floating-point instructions in the loop: a scalar libm call would keep LLVM
    from vectorizing it."""
    if numba.config.CPU_NAME not in (None, "host") or not _host_has_avx2():
        pytest.skip("packed code is checked on this host's AVX2 or wider")
    x = np.linspace(-3.0, 3.0, 64, dtype=dtype)
    logaddexp(x, x[::-1].copy())
    loop = _LOOPS[("logaddexp", np.dtype(dtype).name)]
    asm = loop.inspect_asm(loop.signatures[0])
    packed = {m.group(1) for m in _PACKED.finditer(asm)}
    assert ("ps" if dtype == np.float32 else "pd") in packed, "no packed arithmetic"
