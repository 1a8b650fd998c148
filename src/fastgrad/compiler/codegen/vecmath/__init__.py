"""Branch-free float64/float32 exp, log, tanh, sin, ... that Numba loops auto-vectorize.

Numba lowers math.exp, np.sin, ... to scalar libm calls, which LLVM cannot vectorize, so
fused elementwise kernels run far below memory bandwidth. These njit functions (range
reduction, polynomial, selects, exponent by bit cast) keep a calling loop SIMD, and match
NumPy to ~1 ulp with its special values. Look them up in FUNCTIONS[(np_name, dtype_name)].
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from fastgrad.compiler.codegen import math_names
from fastgrad.compiler.codegen.vecmath import exp_log, power, trig
from fastgrad.compiler.codegen.vecmath.tables import TRIG_BOUNDED_LIMIT

_SUFFIXES = tuple(math_names.DTYPES.values())
__all__ = [
    "FUNCTIONS",
    "BOUNDED_TRIG",
    "FLOAT32_IN_FLOAT64",
    "TRIG_BOUNDED_LIMIT",
    *(f"{name}_{suffix}" for name in math_names.NAMES for suffix in _SUFFIXES),
    *(f"{name}_bounded_{suffix}" for name in math_names.BOUNDED_NAMES for suffix in _SUFFIXES),
    *(f"{name}_{suffix}" for name in math_names.BINARY_NAMES for suffix in _SUFFIXES),
]
_HELPERS = ("div2", "int_to_float", "exp_reduce", "scale2")


def _build(F: type) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(functions, bounded trig variants, helpers) for float type F, by NumPy name."""
    shared = exp_log.build(F)
    functions, bounded = trig.build(F, shared)
    helpers = {name: shared.pop(name) for name in _HELPERS}
    return shared | functions, bounded, helpers


_F64, _F64_BOUNDED, _F64_HELPERS = _build(np.float64)
_F32, _F32_BOUNDED, _ = _build(np.float32)
# float32 power is float64's rounded once, so both come from the float64 helpers.
_F64["power"], _F32["power"] = power.build(_F64 | _F64_HELPERS)

exp_f64 = _F64["exp"]
exp_f32 = _F32["exp"]
expm1_f64 = _F64["expm1"]
expm1_f32 = _F32["expm1"]
log_f64 = _F64["log"]
log_f32 = _F32["log"]
log1p_f64 = _F64["log1p"]
log1p_f32 = _F32["log1p"]
tanh_f64 = _F64["tanh"]
tanh_f32 = _F32["tanh"]
sin_f64 = _F64["sin"]
sin_f32 = _F32["sin"]
cos_f64 = _F64["cos"]
cos_f32 = _F32["cos"]
tan_f64 = _F64["tan"]
tan_f32 = _F32["tan"]
sinh_f64 = _F64["sinh"]
sinh_f32 = _F32["sinh"]
cosh_f64 = _F64["cosh"]
cosh_f32 = _F32["cosh"]
arctan_f64 = _F64["arctan"]
arctan_f32 = _F32["arctan"]
sigmoid_f64 = _F64["sigmoid"]
sigmoid_f32 = _F32["sigmoid"]
logaddexp_f64 = _F64["logaddexp"]
logaddexp_f32 = _F32["logaddexp"]
power_f64 = _F64["power"]
power_f32 = _F32["power"]
sin_bounded_f64 = _F64_BOUNDED["sin"]
sin_bounded_f32 = _F32_BOUNDED["sin"]
cos_bounded_f64 = _F64_BOUNDED["cos"]
cos_bounded_f32 = _F32_BOUNDED["cos"]
tan_bounded_f64 = _F64_BOUNDED["tan"]
tan_bounded_f32 = _F32_BOUNDED["tan"]

#: (numpy function name, dtype name) -> Numba dispatcher, e.g. ("exp", "float32").
#: Every entry is accurate over the whole domain of its dtype.
#: "sigmoid" is the logistic function 1 / (1 + exp(-x)) (scipy.special.expit); "power" and
#: "logaddexp" take two arguments (np.power, np.logaddexp).
FUNCTIONS: dict[tuple[str, str], numba.core.registry.CPUDispatcher] = {
    (name, dtype): table[name]
    for dtype, table in (("float64", _F64), ("float32", _F32))
    for name in table
}

#: Faster sin/cos/tan (no table gathers, ~3x on Cascade Lake) that are exact only for
#: |x| < TRIG_BOUNDED_LIMIT and return NaN beyond it. For kernels that can prove or
#: check (e.g. with an OR-reduced flag and a rerun) that their arguments stay in range.
BOUNDED_TRIG: dict[tuple[str, str], numba.core.registry.CPUDispatcher] = {
    (name, dtype): table[name]
    for dtype, table in (("float64", _F64_BOUNDED), ("float32", _F32_BOUNDED))
    for name in table
}
#: Functions whose float32 version computes in float64 and rounds once (cheaper than
#: float32 pair arithmetic at the same accuracy): its loop has float64 vector code.
FLOAT32_IN_FLOAT64 = frozenset({"tanh"})

# The code generator knows the helpers by name (codegen.math_names): they must agree.
assert set(FUNCTIONS) == math_names.VECTOR_MATH
assert set(BOUNDED_TRIG) == math_names.BOUNDED_TRIG
