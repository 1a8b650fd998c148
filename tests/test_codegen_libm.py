"""No scalar libm call in a generated loop: every transcendental a fused kernel computes
(NAMES, BINARY_NAMES with traced operands, their derivatives) comes from vecmath, so LLVM
keeps the loop SIMD. A libm call left in a vectorized loop (a float32 `x ** y` was powf)
becomes one scalar call per lane.

Each kernel's source is compiled afresh (its machine code may come from the disk cache,
which keeps no assembly) and its assembly searched for calls to libm's functions. About
20 s: three functions per dtype (the forward unary functions' loops are test_vecmath's
test_loop_vectorizes).
"""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import kernel_cache

_LIBM = (
    "sin|cos|tan|sinh|cosh|tanh|asin|acos|atan|atan2|exp|exp2|expm1|log|log2|log10|log1p|"
    "pow|cbrt|hypot|fmod|erf|erfc|sqrt|sincos"
)
# x86 assembly calls an external function through a register loaded with its address
# (`movabsq $powf, %rax`) or by name (`call powf@PLT`).
_CALL = re.compile(rf"(?:\$|call\w*\s+)((?:{_LIBM})f?)\b")


def _unary(x, y):
    return (
        fnp.exp(x) + fnp.expm1(y) + fnp.log(x) + fnp.log1p(x) + fnp.tanh(y)
        + fnp.sin(y) * fnp.cos(x) + fnp.tan(y) + fnp.sinh(y) + fnp.cosh(x)
        + fnp.arctan(y) + fnp.sigmoid(y)
    )  # fmt: skip


def _binary(x, y):
    return x**y + fnp.logaddexp(x, y) + x**2.5


FUNCTIONS = {
    "binary": _binary,
    "unary-sum-grad": fg.grad(lambda x, y: fnp.sum(_unary(x, y)), argnums=(0, 1)),
    "binary-sum-grad": fg.grad(lambda x, y: fnp.sum(_binary(x, y)), argnums=(0, 1)),
}


def _assembly(source: str) -> str:
    """The assembly of a kernel that has run, its source compiled again (machine code
    loaded from the disk cache keeps no assembly) for the signature it ran with."""
    signature = kernel_cache.load_kernel(source).signatures[0]
    namespace: dict = {}
    exec(compile(source, "<libm check>", "exec"), namespace)
    dispatcher = namespace["kernel"]
    dispatcher.compile(signature)
    return dispatcher.inspect_asm(signature)


@pytest.mark.skipif(
    numba.config.CPU_NAME not in (None, "host"), reason="NUMBA_CPU_NAME targets another CPU"
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_no_scalar_libm_calls(name, dtype):
    rng = np.random.default_rng(0)
    x = (np.abs(rng.standard_normal(1000)) + 0.5).astype(dtype)
    y = rng.standard_normal(1000).astype(dtype)
    jitted = fg.jit(FUNCTIONS[name])
    jitted(x, y)
    sources = jitted.lower(x, y).kernels
    assert sources
    for source in sources:
        calls = sorted(set(_CALL.findall(_assembly(source))))
        assert not calls, f"{name} {np.dtype(dtype).name}: libm calls {calls} in\n{source}"
