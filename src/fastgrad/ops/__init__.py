"""The op families: one module per family holds each primitive's record (type rule, NumPy
reference, VJP, JVP, loop expression, input domain) beside the functions that apply it.

Adding an op touches one family module: its record, its function, and its name in the
module's `__all__` (which fastgrad.numpy re-exports). Families build on fastgrad.ops.base
and on families listed before them here; importing this package registers every record
and installs the functions a tracer's operators call.
"""

from fastgrad.core.primitive import REGISTRY
from fastgrad.core.tracing import install_array_functions
from fastgrad.ops import (
    construction,
    cumulative,
    einsum,
    elementwise,
    indexing,
    manipulation,
    math,
    piecewise,
    products,
    reduction,
    selection,
    shape,
    sorting,
    statistics,
)

FAMILIES = (
    elementwise,
    math,
    piecewise,
    shape,
    reduction,
    indexing,
    manipulation,
    selection,
    products,
    einsum,
    sorting,
    cumulative,
    construction,
    statistics,
)

install_array_functions(
    {name: getattr(family, name) for family in FAMILIES for name in family.__all__}
    | {"getitem": indexing.getitem}
)

__all__ = ["FAMILIES", "REGISTRY"]
