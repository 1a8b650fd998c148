"""Building arrays: linspace, logspace and geomspace with traced endpoints, meshgrid, full
with a traced fill value, arange (static), copy, and NumPy's window functions (static).

With only concrete arguments each is NumPy's own function; with traced ones it is a
composition (a ramp times a step plus the start), differentiable in every traced value.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, broadcast_shapes, broadcast_to, is_traced, promote, reshape
from fastgrad.ops.elementwise import abs, floor, sign
from fastgrad.ops.manipulation import moveaxis, part
from fastgrad.ops.math import exp, log, power
from fastgrad.ops.shape import asarray, concatenate, ravel

__all__ = [
    "arange", "bartlett", "blackman", "copy", "full", "geomspace", "hamming", "hanning",
    "kaiser", "linspace", "logspace", "meshgrid",
]  # fmt: skip

# Windows of a static length: NumPy's own functions give the same plain arrays.
bartlett, blackman, hamming, hanning, kaiser = (
    np.bartlett,
    np.blackman,
    np.hamming,
    np.hanning,
    np.kaiser,
)


def linspace(
    start: Any,
    stop: Any,
    num: int = 50,
    endpoint: bool = True,
    retstep: bool = False,
    dtype: Any = None,
    axis: int = 0,
) -> Any:
    """`num` evenly spaced values from `start` to `stop`, as ``numpy.linspace``; `start`
    and `stop` (scalars or arrays) may be traced, `num` is static.

    >>> import fastgrad as fg
    >>> fg.grad(lambda b: linspace(0.0, b, 5)[1])(2.0)  # the second point is b / 4
    array(0.25)
    """
    num = operator.index(num)
    if num < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    if not is_traced(start, stop):
        return np.linspace(start, stop, num, endpoint, retstep, dtype, axis)  # type: ignore[call-overload]
    start, stop = asarray(start), asarray(stop)
    common, _ = promote([aval_of(start), aval_of(stop), Aval((), np.dtype(float), weak=True)])
    common = common if common.kind == "f" else np.dtype(np.float64)
    start, stop = astype(start, common), astype(stop, common)
    shape = broadcast_shapes(aval_of(start).shape, aval_of(stop).shape, what="linspace")
    div = num - 1 if endpoint else num
    delta = stop - start
    ramp = np.arange(num, dtype=common).reshape((num,) + (1,) * len(shape))
    step = delta / div if div > 0 else delta * np.nan
    y = (ramp * step if div > 0 else ramp * delta) + start
    if endpoint and num > 1:  # the last point is `stop` exactly, as in NumPy
        last = reshape(broadcast_to(stop, shape), (1, *shape))
        y = concatenate([part(y, 0, 0, num - 1), last], 0)
    y = moveaxis(y, 0, axis)
    if dtype is not None:
        dtype = np.dtype(dtype)
        y = astype(floor(y) if dtype.kind in "iu" else y, dtype)
    return (y, step) if retstep else y


def logspace(
    start: Any,
    stop: Any,
    num: int = 50,
    endpoint: bool = True,
    base: Any = 10.0,
    dtype: Any = None,
    axis: int = 0,
) -> Any:
    """`base ** linspace(start, stop, num)`, as ``numpy.logspace``; traced values allowed.

    >>> logspace(0.0, 2.0, 3)
    array([  1.,  10., 100.])
    """
    if not is_traced(start, stop, base):
        return np.logspace(start, stop, num, endpoint, base, dtype, axis)
    y = linspace(start, stop, num, endpoint, axis=axis)
    base = base if isinstance(base, int | float) else asarray(base)  # a number stays weak
    if aval_of(base).ndim:
        base = moveaxis(reshape(base, (1, *aval_of(base).shape)), 0, axis)
    out = power(base, y)
    return out if dtype is None else astype(out, dtype)


def geomspace(
    start: Any, stop: Any, num: int = 50, endpoint: bool = True, dtype: Any = None, axis: int = 0
) -> Any:
    """`num` values from `start` to `stop` evenly spaced on a log scale, as
    ``numpy.geomspace``; `start` and `stop` (of one sign, nonzero) may be traced.

    >>> geomspace(1.0, 1000.0, 4)
    array([   1.,   10.,  100., 1000.])
    """
    if not is_traced(start, stop):
        return np.geomspace(start, stop, num, endpoint, dtype, axis)
    start, stop = asarray(start), asarray(stop)
    y = exp(linspace(log(abs(start)), log(abs(stop)), num, endpoint)) * sign(start)
    n = aval_of(y).shape[0]
    # The ends are start and stop exactly, as in NumPy.
    shape = (1, *aval_of(y).shape[1:])
    ends = [broadcast_to(reshape(start, (1, *aval_of(start).shape)), shape)]
    if n > 1:
        middle = part(y, 0, 1, n - 1 if endpoint else n)
        last = [broadcast_to(reshape(stop, (1, *aval_of(stop).shape)), shape)] if endpoint else []
        y = concatenate(ends + [middle] + last, 0)
    elif n == 1:
        y = ends[0]
    y = moveaxis(y, 0, axis)
    return y if dtype is None else astype(y, dtype)


def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None) -> Any:
    """``numpy.arange``. Its length depends on its arguments, so they must be static; for
    a traced start or step, use ``start + step * arange(n)``.

    >>> arange(3), arange(0.0, 1.0, 0.25)
    (array([0, 1, 2]), array([0.  , 0.25, 0.5 , 0.75]))
    >>> fg.grad(lambda s: fnp.sum(s + 0.5 * arange(4)))(1.0)
    array(4.)
    """
    if is_traced(start, stop, step):
        raise TypeError(
            "arange: the number of values depends on start, stop and step, so they cannot be "
            "traced; use start + step * fnp.arange(n) with a static n"
        )
    args = [a for a in (start, stop, step) if a is not None]
    return np.arange(*args, dtype=dtype)


def full(shape: Any, fill_value: Any, dtype: Any = None) -> Any:
    """An array of `shape` filled with `fill_value` (which may be a traced scalar or an
    array broadcast to `shape`).

    >>> full((2,), 7.0)
    array([7., 7.])
    """
    if not isinstance(fill_value, Tracer):
        return np.full(shape, fill_value, dtype)
    shape = (operator.index(shape),) if np.ndim(shape) == 0 else tuple(shape)
    value = fill_value if dtype is None else astype(fill_value, dtype)
    return broadcast_to(value, shape)


def meshgrid(*xi: Any, copy: bool = True, sparse: bool = False, indexing: str = "xy") -> Any:
    """Coordinate arrays from 1-D coordinate vectors, as ``numpy.meshgrid`` ("xy" or "ij"
    indexing, optionally sparse); a tuple of arrays.

    >>> [g.tolist() for g in meshgrid(np.array([1.0, 2.0]), np.array([3.0]))]
    [[[1.0, 2.0]], [[3.0, 3.0]]]
    """
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    if not is_traced(*xi):
        return np.meshgrid(*xi, copy=copy, sparse=sparse, indexing=indexing)  # type: ignore[call-overload]
    ndim = len(xi)
    grids = []
    for i, x in enumerate(xi):
        shape = [1] * ndim
        shape[i] = -1
        if indexing == "xy" and ndim > 1 and i < 2:  # the first two axes swap
            shape[0], shape[1] = shape[1], shape[0]
        grids.append(reshape(ravel(asarray(x)), tuple(shape)))
    if not sparse:
        full_shape = broadcast_shapes(*(aval_of(g).shape for g in grids), what="meshgrid")
        grids = [broadcast_to(g, full_shape) for g in grids]
    return tuple(grids)


def copy(a: Any) -> Any:
    """A copy of `a`. A traced value is never modified in place, so it is returned as it is.

    >>> copy([1.0, 2.0])
    array([1., 2.])
    """
    return a if isinstance(a, Tracer) else np.array(a, copy=True)
