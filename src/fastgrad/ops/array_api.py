"""NumPy 2's names from the array API standard (acos, pow, concat, permute_dims, vecdot,
cumulative_sum, unstack, ...; and numpy.linalg's cross, diagonal, outer, trace, ...) and a
few small relatives (fabs, fix, modf, divmod, ldexp, float_power, signbit, empty_like,
ndim, shape, size): each is a function fastgrad already has, under NumPy's other name or
with one more step, so the families stay the one place each op is defined.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, normalize_axis, sum
from fastgrad.ops.cumulative import cumprod, cumsum
from fastgrad.ops.elementwise import abs, isinf, logical_and, multiply, where
from fastgrad.ops.linalg import matrix_transpose
from fastgrad.ops.manipulation import part
from fastgrad.ops.math import (
    arccos,
    arccosh,
    arcsin,
    arcsinh,
    arctan,
    arctan2,
    arctanh,
    power,
)
from fastgrad.ops.piecewise import copysign, floor_divide, remainder, trunc
from fastgrad.ops.products import cross, matmul, outer, tensordot
from fastgrad.ops.selection import diagonal, trace
from fastgrad.ops.shape import concatenate, expand_dims, ravel, squeeze, transpose, zeros_like
from fastgrad.ops.special import i0
from fastgrad.ops.statistics import all, any

__all__ = [
    "acos", "acosh", "array_equal", "array_equiv", "asin", "asinh", "atan", "atan2", "atanh",
    "concat", "cumulative_prod", "cumulative_sum", "divmod", "empty_like", "fabs", "fix",
    "float_power", "i0", "iscomplex", "iscomplexobj", "isin", "isneginf", "isposinf",
    "isreal", "isrealobj", "isscalar", "ldexp", "matrix_transpose", "matvec", "modf", "ndim",
    "permute_dims", "positive", "pow", "shape", "signbit", "size", "unstack", "vecdot",
    "vecmat",
]  # fmt: skip

# The array API's names for NumPy's inverse trigonometric functions and power.
acos, acosh, asin, asinh = arccos, arccosh, arcsin, arcsinh
atan, atan2, atanh, pow = arctan, arctan2, arctanh, power


def _array(x: Any) -> Any:
    return x if isinstance(x, Tracer) else np.asarray(x)


def concat(arrays: Sequence[Any], /, *, axis: int | None = 0) -> Any:
    """Join arrays along `axis` (flattened first when None), as ``numpy.concat``.

    >>> concat([np.ones(2), np.zeros(1)])
    array([1., 1., 0.])
    """
    if axis is None:
        return concatenate([_array(a).reshape(-1) for a in arrays])
    return concatenate(arrays, axis)


def permute_dims(a: Any, /, axes: Any = None) -> Any:
    """Permute the axes of `a` (reverse them when None), as ``numpy.permute_dims``.

    >>> permute_dims(np.zeros((2, 3, 4)), (2, 0, 1)).shape
    (4, 2, 3)
    """
    return transpose(a, axes)


def unstack(x: Any, /, *, axis: int = 0) -> tuple[Any, ...]:
    """The slices of `x` along `axis`, as a tuple (``numpy.unstack``, the inverse of stack).

    >>> unstack(np.array([[1.0, 2.0], [3.0, 4.0]]), axis=1)
    (array([1., 3.]), array([2., 4.]))
    """
    x = _array(x)
    axis = normalize_axis(operator.index(axis), aval_of(x).ndim)[0]
    return tuple(squeeze(part(x, axis, k, k + 1), axis) for k in range(aval_of(x).shape[axis]))


def vecdot(x1: Any, x2: Any, /, *, axis: int = -1) -> Any:
    """The dot products of the vectors along `axis`, broadcasting the other axes, as
    ``numpy.vecdot`` (for real arrays).

    >>> vecdot(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([1.0, 1.0]))
    array([3., 7.])
    """
    return sum(multiply(x1, x2), axis)


def matvec(x1: Any, x2: Any, /) -> Any:
    """Matrix-vector products over broadcast stacks, as ``numpy.matvec``: the matrices are
    x1's last two axes, the vectors x2's last.

    >>> matvec(np.eye(2) * 2, np.array([1.0, 3.0]))
    array([2., 6.])
    """
    return squeeze(matmul(x1, expand_dims(x2, -1)), -1)


def vecmat(x1: Any, x2: Any, /) -> Any:
    """Vector-matrix products over broadcast stacks, as ``numpy.vecmat`` (for real arrays).

    >>> vecmat(np.array([1.0, 3.0]), np.eye(2) * 2)
    array([2., 6.])
    """
    return squeeze(matmul(expand_dims(x1, -2), x2), -2)


def _cumulative(scan: Any, initial: float, x: Any, axis: Any, dtype: Any, include: bool) -> Any:
    x = _array(x)
    if axis is None:
        if aval_of(x).ndim > 1:
            raise ValueError("cumulative: axis must be given for arrays of more than 1 dimension")
        axis = 0
    out = scan(x, axis, dtype)
    if not include:
        return out
    axis = normalize_axis(operator.index(axis), aval_of(out).ndim)[0]
    first = zeros_like(part(out, axis, 0, 1)) + initial
    return concatenate([first, out], axis)


def cumulative_sum(
    x: Any, /, *, axis: Any = None, dtype: Any = None, include_initial: bool = False
) -> Any:
    """The cumulative sum along `axis`, as ``numpy.cumulative_sum`` (with a leading 0 when
    `include_initial`).

    >>> cumulative_sum(np.array([1.0, 2.0, 3.0]), include_initial=True)
    array([0., 1., 3., 6.])
    """
    return _cumulative(cumsum, 0.0, x, axis, dtype, include_initial)


def cumulative_prod(
    x: Any, /, *, axis: Any = None, dtype: Any = None, include_initial: bool = False
) -> Any:
    """The cumulative product along `axis`, as ``numpy.cumulative_prod`` (with a leading 1
    when `include_initial`).

    >>> cumulative_prod(np.array([1.0, 2.0, 3.0]))
    array([1., 2., 6.])
    """
    return _cumulative(cumprod, 1.0, x, axis, dtype, include_initial)


def fabs(x: Any) -> Any:
    """The absolute value as a float (``numpy.fabs``); integers become float64.

    >>> fabs(np.array([-1, 2]))
    array([1., 2.])
    """
    x = _array(x)
    return abs(x if aval_of(x).dtype.kind == "f" else astype(x, np.float64))


def positive(x: Any) -> Any:
    """`+x`: the values themselves (``numpy.positive``).

    >>> positive(np.array([-1.0, 2.0]))
    array([-1.,  2.])
    """
    return _array(x)


def signbit(x: Any) -> Any:
    """Whether the sign bit is set (negative numbers and -0.0), as ``numpy.signbit``; a
    boolean array, never differentiated.

    >>> signbit(np.array([-0.0, 0.0, -2.0]))
    array([ True, False,  True])
    """
    x = _array(x)
    if aval_of(x).dtype.kind != "f":
        return x < 0
    return copysign(1.0, x) < 0


def empty_like(x: Any, dtype: Any = None) -> Any:
    """An array of x's shape (and dtype, unless given) whose values are not to be relied
    on, as ``numpy.empty_like``; here they are zeros.

    >>> empty_like(np.ones(2)).shape
    (2,)
    """
    return zeros_like(x, dtype)


def fix(x: Any) -> Any:
    """Round toward zero, as ``numpy.fix`` (``trunc``); derivative 0.

    >>> fix(np.array([-1.5, 2.7]))
    array([-1.,  2.])
    """
    return trunc(x)


def modf(x: Any) -> tuple[Any, Any]:
    """The fractional and integral parts, both with x's sign, as ``numpy.modf``; the
    fractional part has derivative 1.

    >>> modf(np.array([-1.5, 2.25]))
    (array([-0.5 ,  0.25]), array([-1.,  2.]))
    """
    whole = trunc(x)
    finite = where(isinf(x), 0.0, x)  # inf - inf would be NaN; NumPy's part there is +-0
    return copysign(finite - trunc(finite), x), whole


def divmod(x: Any, y: Any) -> tuple[Any, Any]:  # noqa: A001  NumPy's name
    """``(floor_divide(x, y), remainder(x, y))``, as ``numpy.divmod``.

    >>> divmod(np.array([7.0, -7.0]), 2.0)
    (array([ 3., -4.]), array([1., 1.]))
    """
    return floor_divide(x, y), remainder(x, y)


def ldexp(x: Any, n: Any) -> Any:
    """``x * 2**n`` for integer `n`, as ``numpy.ldexp``; differentiable in x.

    >>> ldexp(np.array([1.5, 1.0]), np.array([2, -1]))
    array([6. , 0.5])
    """
    x = _array(x)
    n = _array(n)
    if aval_of(n).dtype.kind not in "iub":
        raise TypeError(f"ldexp: n must be integers, got {aval_of(n).dtype}")
    x = x if aval_of(x).dtype.kind == "f" else astype(x, np.float64)
    return x * power(2.0, astype(n, aval_of(x).dtype))


def float_power(x: Any, y: Any) -> Any:
    """``x ** y`` computed in float64 at least, as ``numpy.float_power``.

    >>> float_power(np.array([2, 3]), 2)
    array([4., 9.])
    """
    x, y = _array(x), _array(y)
    return power(astype(x, np.promote_types(aval_of(x).dtype, np.float64)), y)


def isposinf(x: Any) -> Any:
    """Where x is +inf, as ``numpy.isposinf``.

    >>> isposinf(np.array([np.inf, -np.inf, 1.0]))
    array([ True, False, False])
    """
    x = _array(x)
    return logical_and(isinf(x), x > 0)


def isneginf(x: Any) -> Any:
    """Where x is -inf, as ``numpy.isneginf``.

    >>> isneginf(np.array([np.inf, -np.inf, 1.0]))
    array([False,  True, False])
    """
    x = _array(x)
    return logical_and(isinf(x), x < 0)


def ndim(a: Any) -> int:
    """The number of dimensions of `a` (traced or not), as ``numpy.ndim``.

    >>> ndim([[1.0, 2.0]])
    2
    """
    return aval_of(_array(a)).ndim


def shape(a: Any) -> tuple[int, ...]:
    """The shape of `a` (traced or not), as ``numpy.shape``.

    >>> shape([[1.0, 2.0]])
    (1, 2)
    """
    return aval_of(_array(a)).shape


def size(a: Any, axis: int | None = None) -> int:
    """The number of elements of `a`, or its length along `axis`, as ``numpy.size``.

    >>> size(np.zeros((2, 3)), 1)
    3
    """
    sizes = aval_of(_array(a)).shape
    if axis is None:
        return int(np.prod(sizes))
    return sizes[normalize_axis(operator.index(axis), len(sizes))[0]]


# ---------------------------------------------------------------- predicates
# Traced values are real (fastgrad has no complex dtype), so the complex tests answer
# from the dtype.


def iscomplexobj(x: Any) -> bool:
    """Whether `x` has a complex dtype (never, traced), as ``numpy.iscomplexobj``.

    >>> iscomplexobj(np.array([1 + 0j]))
    True
    """
    return not isinstance(x, Tracer) and bool(np.iscomplexobj(x))


def isrealobj(x: Any) -> bool:
    """Whether `x` has no complex dtype, as ``numpy.isrealobj``.

    >>> isrealobj(np.array([1.0]))
    True
    """
    return not iscomplexobj(x)


def iscomplex(x: Any) -> Any:
    """Where the imaginary part is nonzero (nowhere, for a real or traced array), as
    ``numpy.iscomplex``.

    >>> iscomplex(np.array([1 + 1j, 2 + 0j]))
    array([ True, False])
    """
    return zeros_like(x, np.bool_) if isinstance(x, Tracer) else np.iscomplex(x)


def isreal(x: Any) -> Any:
    """Where the imaginary part is zero (everywhere, for a real or traced array), as
    ``numpy.isreal``.

    >>> isreal(np.array([1 + 1j, 2 + 0j]))
    array([False,  True])
    """
    return ~zeros_like(x, np.bool_) if isinstance(x, Tracer) else np.isreal(x)


def isscalar(element: Any) -> bool:
    """Whether `element` is a scalar (a Python or NumPy number, not an array; a traced
    value is an array), as ``numpy.isscalar``.

    >>> isscalar(3.0), isscalar(np.array(3.0))
    (True, False)
    """
    return not isinstance(element, Tracer) and bool(np.isscalar(element))


def array_equal(a1: Any, a2: Any, equal_nan: bool = False) -> Any:
    """Whether `a1` and `a2` have one shape and equal elements, as ``numpy.array_equal``:
    a Python bool on plain arrays, a traced boolean scalar on traced ones.

    >>> array_equal(np.array([1.0, 2.0]), [1.0, 2.0])
    True
    """
    a1, a2 = _array(a1), _array(a2)
    if aval_of(a1).shape != aval_of(a2).shape:
        return False
    same = a1 == a2
    if equal_nan and aval_of(a1).dtype.kind == "f":
        same = same | logical_and(a1 != a1, a2 != a2)
    return _all(same)


def array_equiv(a1: Any, a2: Any) -> Any:
    """Whether `a1` and `a2` broadcast to one shape with equal elements, as
    ``numpy.array_equiv``.

    >>> array_equiv(np.array([[1.0, 1.0]]), 1.0)
    True
    """
    a1, a2 = _array(a1), _array(a2)
    try:
        np.broadcast_shapes(aval_of(a1).shape, aval_of(a2).shape)
    except ValueError:
        return False
    return _all(a1 == a2)


def _all(x: Any) -> Any:
    return all(x) if isinstance(x, Tracer) else bool(np.all(x))


def isin(element: Any, test_elements: Any, invert: bool = False) -> Any:
    """Where `element` is one of `test_elements`, as ``numpy.isin``; both may be traced
    (the test compares every pair, so keep `test_elements` small).

    >>> isin(np.array([1, 2, 3]), [2, 4])
    array([False,  True, False])
    """
    element, tests = _array(element), ravel(_array(test_elements))
    found = any(expand_dims(element, -1) == tests, axis=-1)
    return ~found if invert else found


# ---------------------------------------------------------------- numpy.linalg's array API
# These take the matrices or vectors in the last axes, as numpy.linalg's do; fastgrad.numpy
# .linalg lists them under NumPy's names.


def linalg_cross(x1: Any, x2: Any, /, *, axis: int = -1) -> Any:
    """The cross product of 3-vectors along `axis` (``numpy.linalg.cross``).

    >>> linalg_cross(np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0]))
    array([0., 0., 1.])
    """
    for name, x in (("x1", x1), ("x2", x2)):
        if aval_of(_array(x)).shape[axis] != 3:
            raise ValueError(f"linalg.cross: {name} must have 3 elements along axis {axis}")
    return cross(x1, x2, axis=axis)


def linalg_diagonal(x: Any, /, *, offset: int = 0) -> Any:
    """The diagonals of the matrices in the last two axes (``numpy.linalg.diagonal``).

    >>> linalg_diagonal(np.arange(4.0).reshape(2, 2))
    array([0., 3.])
    """
    return diagonal(x, offset, -2, -1)


def linalg_trace(x: Any, /, *, offset: int = 0, dtype: Any = None) -> Any:
    """The traces of the matrices in the last two axes (``numpy.linalg.trace``).

    >>> float(linalg_trace(np.arange(4.0).reshape(2, 2)))
    3.0
    """
    return trace(x, offset, -2, -1, dtype)


def linalg_outer(x1: Any, x2: Any, /) -> Any:
    """The outer product of two 1-D arrays (``numpy.linalg.outer``).

    >>> linalg_outer(np.array([1.0, 2.0]), np.array([3.0, 4.0]))
    array([[3., 4.],
           [6., 8.]])
    """
    for name, x in (("x1", x1), ("x2", x2)):
        if aval_of(_array(x)).ndim != 1:
            raise ValueError(f"linalg.outer: {name} must be 1-D, got {aval_of(_array(x)).shape}")
    return outer(x1, x2)


def linalg_tensordot(x1: Any, x2: Any, /, *, axes: Any = 2) -> Any:
    """``tensordot`` with keyword-only `axes` (``numpy.linalg.tensordot``).

    >>> linalg_tensordot(np.ones((2, 3)), np.ones((3, 4)), axes=1).shape
    (2, 4)
    """
    return tensordot(x1, x2, axes)
