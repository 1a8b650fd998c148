"""NumPy-like functions that work on plain arrays and on traced values alike.

`import fastgrad.numpy as fnp`. Each function checks and normalizes its arguments
(broadcasting, dtype promotion, axes, indices), then applies primitives; on plain arrays
it computes the result with NumPy at once. The functions live with their primitives in
the op families of fastgrad.ops; this namespace gathers them, with NumPy's constants and
array-creation functions (which give plain arrays). A name it lacks raises an
AttributeError that lists the closest names it has.
"""

from numpy import (  # noqa: F401  re-exported: constants and array creation
    e,
    empty,
    eye,
    float32,
    float64,
    identity,
    inf,
    int32,
    int64,
    nan,
    newaxis,
    ones,
    pi,
    tri,
    zeros,
)

from fastgrad.numpy import linalg  # noqa: F401  fnp.linalg
from fastgrad.ops import FAMILIES as _FAMILIES
from fastgrad.ops.array_api import *  # noqa: F403
from fastgrad.ops.complex_numbers import *  # noqa: F403
from fastgrad.ops.construction import *  # noqa: F403
from fastgrad.ops.cumulative import *  # noqa: F403
from fastgrad.ops.einsum import *  # noqa: F403
from fastgrad.ops.elementwise import *  # noqa: F403
from fastgrad.ops.index_tools import *  # noqa: F403
from fastgrad.ops.indexing import *  # noqa: F403
from fastgrad.ops.integer_ops import *  # noqa: F403
from fastgrad.ops.manipulation import *  # noqa: F403
from fastgrad.ops.math import *  # noqa: F403
from fastgrad.ops.nan_reductions import *  # noqa: F403
from fastgrad.ops.numerical import *  # noqa: F403
from fastgrad.ops.numpy_extras import *  # noqa: F403
from fastgrad.ops.numpy_interop import missing_name as _missing_name
from fastgrad.ops.piecewise import *  # noqa: F403
from fastgrad.ops.products import *  # noqa: F403
from fastgrad.ops.reduction import *  # noqa: F403
from fastgrad.ops.scatter import *  # noqa: F403
from fastgrad.ops.selection import *  # noqa: F403
from fastgrad.ops.shape import *  # noqa: F403
from fastgrad.ops.sorting import *  # noqa: F403
from fastgrad.ops.statistics import *  # noqa: F403

_NUMPY_NAMES = [
    "e", "empty", "eye", "float32", "float64", "identity", "inf", "int32", "int64", "nan",
    "newaxis", "ones", "pi", "tri", "zeros",
]  # fmt: skip

# fnp.linalg is the submodule imported above; __all__ lists functions only.
__all__ = sorted({name for family in _FAMILIES for name in family.__all__} | set(_NUMPY_NAMES))


def __getattr__(name: str) -> object:
    message = f"module 'fastgrad.numpy' has no attribute {name!r}"
    if not name.startswith("__"):
        message += ": " + _missing_name(name, __all__)
    raise AttributeError(message)


def __dir__() -> list[str]:
    return list(__all__)
