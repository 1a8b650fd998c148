"""The (NumPy function, dtype) pairs the vector-math helpers implement, by name only.

The code generator decides from these which calls go to a helper, so generating a kernel
imports no Numba; `codegen.vecmath` builds the helpers themselves, is imported by the
kernels it serves, and checks that it builds exactly these.
"""

from __future__ import annotations

NAMES = (
    "exp",
    "expm1",
    "log",
    "log1p",
    "tanh",
    "sin",
    "cos",
    "tan",
    "sinh",
    "cosh",
    "arctan",
    "sigmoid",
)
BINARY_NAMES = ("power", "logaddexp")  # two arguments
BOUNDED_NAMES = ("sin", "cos", "tan")
DTYPES = {"float64": "f64", "float32": "f32"}  # dtype name -> suffix of the helper's name

#: Every (function, dtype name) with a helper, e.g. ("exp", "float32").
VECTOR_MATH = frozenset((name, dtype) for name in NAMES + BINARY_NAMES for dtype in DTYPES)
#: The pairs with a faster variant exact only for |x| < 2**30 (vecmath.BOUNDED_TRIG).
BOUNDED_TRIG = frozenset((name, dtype) for name in BOUNDED_NAMES for dtype in DTYPES)
