"""The op families: one module per family holds each primitive's record (type rule, NumPy
reference, VJP, JVP, loop expression, input domain) beside the functions that apply it.

Adding an op touches one family module: its record, its function, and its name in the
module's `__all__` (which fastgrad.numpy re-exports; the linear-algebra and SciPy families
keep theirs empty, their names listed by fastgrad.numpy.linalg and fastgrad.scipy
instead). Families build on fastgrad.ops.base
and on families listed before them here; importing this package registers every record
and installs the functions a tracer's operators call, `x.at`, and how NumPy's own
functions called on a tracer map to them (fastgrad.ops.numpy_interop).
"""

import functools

from fastgrad.core.array_methods import install_array_functions
from fastgrad.core.primitive import REGISTRY
from fastgrad.ops import (
    array_api,
    bessel,
    complex_numbers,
    construction,
    cumulative,
    debug,
    decompositions,
    determinant,
    einsum,
    elementwise,
    index_tools,
    indexing,
    integer_ops,
    linalg,
    manipulation,
    math,
    matrix_calculus,
    matrix_functions,
    nan_reductions,
    numerical,
    numpy_extras,
    numpy_interop,
    piecewise,
    products,
    reduction,
    sampling,
    scatter,
    selection,
    shape,
    sorting,
    special,
    special_incomplete,
    statistics,
    stats,
)

FAMILIES = (
    elementwise, math, piecewise, shape, reduction, indexing, scatter, manipulation,
    selection, products, einsum, sorting, cumulative, construction, statistics,
    nan_reductions, numerical, index_tools, integer_ops, debug, complex_numbers, linalg,
    decompositions, determinant, matrix_functions, matrix_calculus, numpy_extras, special,
    special_incomplete, bessel, stats, sampling, array_api,
)  # fmt: skip

_FUNCTIONS = {name: getattr(family, name) for family in FAMILIES for name in family.__all__}
install_array_functions(
    _FUNCTIONS
    | {
        "getitem": indexing.getitem,
        "at": scatter.IndexUpdates,
        "array_ufunc": functools.partial(numpy_interop.array_ufunc, _FUNCTIONS),
        "array_function": functools.partial(numpy_interop.array_function, _FUNCTIONS),
    }
)

__all__ = ["FAMILIES", "REGISTRY"]
