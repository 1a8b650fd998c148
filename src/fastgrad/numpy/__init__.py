"""NumPy-like functions that work on plain arrays and on traced values alike.

`import fastgrad.numpy as fnp`. Each function checks and normalizes its arguments
(broadcasting, dtype promotion, axes, indices), then applies primitives; on plain arrays
it computes the result with NumPy at once. The functions live with their primitives in
the op families of fastgrad.ops; this namespace gathers them, with NumPy's constants and
array-creation functions (which give plain arrays).
"""

from numpy import (  # noqa: F401  re-exported: constants and array creation
    arange,
    e,
    empty,
    eye,
    float32,
    float64,
    full,
    inf,
    int32,
    int64,
    linspace,
    nan,
    newaxis,
    ones,
    pi,
    zeros,
)

from fastgrad.numpy import linalg  # noqa: F401  fnp.linalg
from fastgrad.ops import FAMILIES as _FAMILIES
from fastgrad.ops.complex_numbers import *  # noqa: F403
from fastgrad.ops.elementwise import *  # noqa: F403
from fastgrad.ops.indexing import *  # noqa: F403
from fastgrad.ops.math import *  # noqa: F403
from fastgrad.ops.products import *  # noqa: F403
from fastgrad.ops.reduction import *  # noqa: F403
from fastgrad.ops.shape import *  # noqa: F403

_NUMPY_NAMES = [
    "arange", "e", "empty", "eye", "float32", "float64", "full", "inf", "int32", "int64",
    "linspace", "nan", "newaxis", "ones", "pi", "zeros",
]  # fmt: skip

__all__ = sorted(
    {name for family in _FAMILIES for name in family.__all__} | set(_NUMPY_NAMES) | {"linalg"}
)
