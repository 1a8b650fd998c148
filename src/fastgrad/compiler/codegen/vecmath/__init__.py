"""Branch-free float64/float32 exp, log, tanh, sin, ... that Numba loops auto-vectorize.

Numba lowers math.exp, np.sin, ... to scalar libm calls, which LLVM cannot vectorize, so
fused elementwise kernels run far below memory bandwidth. These njit functions (range
reduction, polynomial, selects, exponent by bit cast) keep a calling loop SIMD, and match
NumPy to ~1 ulp with its special values. Look them up in FUNCTIONS[(np_name, dtype_name)],
or by name (`exp_f64`, `sin_bounded_f32`, `power_f32`), as kernels import them.

Each float type's functions are built when a name of that type is first asked for (the
module's `__getattr__`), and power (whose float32 is float64's rounded once) when a kernel
imports it, not at import: a warm process's float64 kernels of exp, sin and tanh got their
helpers in 7-8 ms of CPU against 15-18 building all 77 functions of both types (bytecode
cached), on the compile thread's way to a first call that waits for its kernels.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from fastgrad.compiler.codegen import math_names
from fastgrad.compiler.codegen.vecmath import exp_log, trig
from fastgrad.compiler.codegen.vecmath.tables import TRIG_BOUNDED_LIMIT

_SUFFIXES = tuple(math_names.DTYPES.values())
_DTYPES = {suffix: dtype for dtype, suffix in math_names.DTYPES.items()}
__all__ = [
    "FUNCTIONS",
    "BOUNDED_TRIG",
    "TRIG_BOUNDED_LIMIT",
    *(f"{name}_{suffix}" for name in math_names.NAMES for suffix in _SUFFIXES),
    *(f"{name}_bounded_{suffix}" for name in math_names.BOUNDED_NAMES for suffix in _SUFFIXES),
    *(f"{name}_{suffix}" for name in math_names.BINARY_NAMES for suffix in _SUFFIXES),
]
_HELPERS = ("div2", "int_to_float", "exp_reduce", "scale2")
_LOCK = threading.RLock()  # two threads asking at once build a type once
_BUILT: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # dtype name -> tables
_HELPERS_F64: dict[str, Any] = {}  # float64's functions and helpers, which power uses
_POWER: dict[str, Any] = {}  # dtype name -> power


def _build(F: type) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(functions, bounded trig variants, helpers) for float type F, by NumPy name."""
    shared = exp_log.build(F)
    functions, bounded = trig.build(F, shared)
    helpers = {name: shared.pop(name) for name in _HELPERS}
    return shared | functions, bounded, helpers


def _tables(dtype: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(functions, bounded trig variants) of `dtype` ("float64", "float32"), built once;
    power apart (`_power`)."""
    with _LOCK:
        if dtype not in _BUILT:
            functions, bounded, helpers = _build(np.float64 if dtype == "float64" else np.float32)
            if dtype == "float64":
                _HELPERS_F64.update(functions | helpers)
            # The code generator knows the helpers by name (codegen.math_names).
            assert {(name, dtype) for name in (*functions, "power")} == {
                pair for pair in math_names.VECTOR_MATH if pair[1] == dtype
            }
            assert {(name, dtype) for name in bounded} == {
                pair for pair in math_names.BOUNDED_TRIG if pair[1] == dtype
            }
            _BUILT[dtype] = functions, bounded
        return _BUILT[dtype]


def _power(dtype: str) -> Any:
    """Power for `dtype`: float32's is float64's rounded once, so both come from the
    float64 helpers (its module imports `fractions`, ~2 ms: only kernels with a power)."""
    with _LOCK:
        if not _POWER:
            _tables("float64")
            from fastgrad.compiler.codegen.vecmath import power

            _POWER.update(zip(math_names.DTYPES, power.build(_HELPERS_F64), strict=True))
        return _POWER[dtype]


def __getattr__(attribute: str) -> Any:
    """One function by name (`exp_f64`, `sin_bounded_f32`), or for both types
    FUNCTIONS: (numpy function name, dtype name) -> Numba dispatcher, e.g. ("exp",
    "float32"), every entry accurate over the whole domain of its dtype ("sigmoid" is
    the logistic function 1 / (1 + exp(-x)), scipy.special.expit; "power" and
    "logaddexp" take two arguments), and BOUNDED_TRIG: the faster sin/cos/tan (no table
    gathers, ~3x on Cascade Lake) exact only for |x| < TRIG_BOUNDED_LIMIT, NaN beyond it,
    for kernels that can prove or check (an OR-reduced flag and a rerun) that their
    arguments stay in range. Built on first use, then kept as a global of the module."""
    if attribute in ("FUNCTIONS", "BOUNDED_TRIG"):
        which = attribute == "BOUNDED_TRIG"
        value: Any = {
            (name, dtype): function
            for dtype in math_names.DTYPES
            for name, function in _tables(dtype)[which].items()
        }
        if not which:
            value |= {("power", dtype): _power(dtype) for dtype in math_names.DTYPES}
    else:
        stem, _, suffix = attribute.rpartition("_")
        if suffix not in _DTYPES or not stem:
            raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
        dtype = _DTYPES[suffix]
        functions, bounded = _tables(dtype)
        bounded_name = stem.removesuffix("_bounded")
        if stem == "power":
            value = _power(dtype)
        elif stem in functions:
            value = functions[stem]
        elif bounded_name != stem and bounded_name in bounded:
            value = bounded[bounded_name]
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    globals()[attribute] = value
    return value
