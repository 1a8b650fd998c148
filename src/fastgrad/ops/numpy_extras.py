"""NumPy functions composed of other families' functions: insert, apply_along_axis,
apply_over_axes and polyfit. Public under fastgrad.numpy; each is differentiable wherever
the functions it is made of are.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, broadcast_to, normalize_axis, reshape, sum
from fastgrad.ops.manipulation import moveaxis
from fastgrad.ops.math import sqrt
from fastgrad.ops.matrix_functions import lstsq
from fastgrad.ops.numerical import vander
from fastgrad.ops.selection import take
from fastgrad.ops.shape import concatenate, expand_dims, ravel, stack, transpose

__all__ = ["apply_along_axis", "apply_over_axes", "insert", "polyfit"]


def _array(x: Any) -> Any:
    return x if isinstance(x, Tracer) else np.asarray(x)


def insert(arr: Any, obj: Any, values: Any, axis: Any = None) -> Any:
    """`arr` with `values` inserted before the positions `obj` (an int, a slice or a
    sequence of ints: concrete) along `axis` (of the flattened array when None), as
    ``numpy.insert``; differentiable in `arr` and `values`.

    >>> insert(np.array([1.0, 2.0, 3.0]), [1, 3], np.array([9.0, 8.0]))
    array([1., 9., 2., 3., 8.])
    """
    if isinstance(obj, Tracer):
        raise TypeError("insert: obj (the positions) must be concrete, not traced")
    arr, values = _array(arr), _array(values)
    if axis is None:
        arr, axis = ravel(arr), 0
    axis = normalize_axis(operator.index(axis), aval_of(arr).ndim, "insert axis")[0]
    shape, dtype = aval_of(arr).shape, aval_of(arr).dtype
    n, vshape = shape[axis], aval_of(values).shape
    # NumPy's own insert on markers says where each element of the result comes from: the
    # original element i is marker i, the k-th inserted one marker n + k.
    positions = np.insert(np.zeros(shape, np.int8), obj, np.zeros(vshape, np.int8), axis)
    added = positions.shape[axis] - n
    source = np.insert(np.arange(n), obj, np.arange(n, n + added) if added else [])
    values = astype(values, dtype)
    if np.ndim(obj) == 0 and not isinstance(obj, slice):
        # One position: values' first axis runs along `axis` (NumPy's rule).
        values = reshape(values, (1,) * (len(shape) - len(vshape)) + vshape)
        values = moveaxis(values, 0, axis)
    slab = broadcast_to(values, shape[:axis] + (added,) + shape[axis + 1 :])
    return take(concatenate([arr, slab], axis=axis), source.astype(np.int64), axis=axis)


def apply_along_axis(func1d: Callable[..., Any], axis: int, arr: Any, *args: Any,
                     **kwargs: Any) -> Any:  # fmt: skip
    """`func1d` applied to each 1-D slice of `arr` along `axis`, as
    ``numpy.apply_along_axis``: the slice's axis becomes the axes of func1d's result.
    Traced, each slice is one call (the loop is unrolled in the trace; for many slices
    write func1d on whole arrays, or use fg.vmap).

    >>> apply_along_axis(lambda v: v[-1] - v[0], 1, np.array([[1.0, 4.0], [2.0, 7.0]]))
    array([3., 5.])
    """
    arr = _array(arr)
    axis = normalize_axis(operator.index(axis), aval_of(arr).ndim, "apply_along_axis axis")[0]
    moved = moveaxis(arr, axis, -1)
    outer = aval_of(moved).shape[:-1]
    if not all(outer):
        raise ValueError(f"apply_along_axis: cannot apply to the 0 slices of shape {outer}")
    rows = reshape(moved, (-1, aval_of(moved).shape[-1]))
    results = [_array(func1d(rows[i], *args, **kwargs)) for i in range(aval_of(rows).shape[0])]
    out = stack(results)
    inner = aval_of(out).shape[1:]
    out = reshape(out, outer + inner)
    # The result's axes go where `axis` was.
    order = list(range(axis)) + [len(outer) + k for k in range(len(inner))]
    order += list(range(axis, len(outer)))
    return transpose(out, tuple(order))


def apply_over_axes(func: Callable[[Any, int], Any], a: Any, axes: Any) -> Any:
    """`func(a, axis)` applied for each axis in `axes` in turn, each result kept with a's
    number of dimensions, as ``numpy.apply_over_axes``.

    >>> apply_over_axes(sum, np.arange(6.0).reshape(2, 3), [0, 1])
    array([[15.]])
    """
    a = _array(a)
    for axis in (axes,) if isinstance(axes, int | np.integer) else axes:
        ndim = aval_of(a).ndim
        axis = normalize_axis(operator.index(axis), ndim, "apply_over_axes axes")[0]
        result = _array(func(a, axis))
        if aval_of(result).ndim == ndim - 1:
            result = expand_dims(result, axis)
        elif aval_of(result).ndim != ndim:
            raise ValueError(
                "apply_over_axes: func must return an array of the same number of dimensions "
                f"or one fewer, got {aval_of(result).ndim} for {ndim}"
            )
        a = result
    return a


def polyfit(x: Any, y: Any, deg: int, rcond: Any = None, full: bool = False, w: Any = None,
            cov: bool = False) -> Any:  # fmt: skip
    """The least-squares polynomial of degree `deg` through (x, y), highest power first, as
    ``numpy.polyfit`` (y may hold several columns); differentiable in x, y and the
    weights `w`. With `full=True` also (residuals, rank, singular values, rcond) of the
    scaled problem; `cov=True` is not supported.

    >>> polyfit(np.array([0.0, 1.0, 2.0]), np.array([1.0, 3.0, 5.0]), 1).round(12)
    array([2., 1.])
    """
    if cov:
        raise NotImplementedError("polyfit: cov=True is not supported; use full=True")
    deg = operator.index(deg)
    if deg < 0:
        raise ValueError(f"polyfit: deg must be at least 0, got {deg}")
    x, y = _array(x), _array(y)
    if aval_of(x).ndim != 1 or aval_of(y).ndim not in (1, 2) or (
            aval_of(y).shape[0] != aval_of(x).shape[0]):  # fmt: skip
        raise ValueError(
            f"polyfit: x must be 1-D and y (M,) or (M, K) of x's length, got shapes "
            f"{aval_of(x).shape} and {aval_of(y).shape}"
        )
    lhs, rhs = vander(x, deg + 1), y
    if aval_of(lhs).dtype != aval_of(y).dtype:
        rhs = astype(y, aval_of(lhs).dtype)
    if rcond is None:
        rcond = aval_of(x).shape[0] * np.finfo(aval_of(lhs).dtype).eps
    if w is not None:
        w = _array(w)
        if aval_of(w).shape != aval_of(x).shape:
            raise ValueError(f"polyfit: w must have x's shape {aval_of(x).shape}")
        lhs = lhs * expand_dims(w, 1)
        rhs = rhs * (w if aval_of(rhs).ndim == 1 else expand_dims(w, 1))
    # Columns scaled to unit norm, as NumPy does, for a better conditioned problem.
    scale = sqrt(sum(lhs * lhs, axis=0))
    c, residuals, rank, s = lstsq(lhs / scale, rhs, rcond)
    c = c / (scale if aval_of(c).ndim == 1 else expand_dims(scale, 1))
    return (c, residuals, rank, s, rcond) if full else c
