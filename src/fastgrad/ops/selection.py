"""Picking parts of arrays: take, take_along_axis (and its update, put_along_axis),
diagonals and triangles, select and nan_to_num.

Compositions of indexing (gather, whose VJP is scatter_add), slices of a flattened view
(a diagonal is every (m + 1)-th element), and `where`, which fuses.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, normalize_axis, reshape, sum
from fastgrad.ops.elementwise import clip, isnan, where
from fastgrad.ops.indexing import getitem
from fastgrad.ops.manipulation import moveaxis, part
from fastgrad.ops.piecewise import remainder
from fastgrad.ops.scatter import update
from fastgrad.ops.shape import ravel, slice_scatter

__all__ = [
    "diag", "diagflat", "diagonal", "nan_to_num", "put_along_axis", "select", "take",
    "take_along_axis", "trace", "tril", "triu",
]  # fmt: skip


def _array(x: Any) -> Any:
    return x if isinstance(x, Tracer) else np.asarray(x)


def _index_array(indices: Any, what: str) -> Any:
    indices = _array(indices)
    if not isinstance(indices, Tracer) and indices.size == 0:
        indices = indices.astype(np.intp)  # an empty list is an empty index, as in NumPy
    if aval_of(indices).dtype.kind not in "iu":
        raise IndexError(f"{what}: indices must be integers, got {aval_of(indices).dtype}")
    return indices


# ---------------------------------------------------------------- take


def take(a: Any, indices: Any, axis: Any = None, mode: str = "raise") -> Any:
    """Elements of `a` at `indices` along `axis` (of the flattened array when None), as
    ``numpy.take``; `mode` "raise" checks bounds, "wrap" and "clip" bring indices in.

    >>> take(np.array([[1.0, 2.0], [3.0, 4.0]]), [1, 1, 0], axis=1)
    array([[2., 2., 1.],
           [4., 4., 3.]])
    """
    a = _array(a)
    if axis is None:
        a, axis = ravel(a), 0
    axis = normalize_axis(operator.index(axis), a.ndim)[0]
    scalar = isinstance(indices, int | np.integer)
    indices = _index_array(indices, "take")
    n = a.shape[axis]
    if mode == "wrap":
        indices = remainder(indices, n) if n else indices
    elif mode == "clip":
        indices = clip(indices, 0, max(n - 1, 0))
    elif mode != "raise":
        raise ValueError(f"take: mode must be 'raise', 'wrap' or 'clip', got {mode!r}")
    if scalar and not isinstance(indices, Tracer):
        indices = int(indices)
    return getitem(a, (slice(None),) * axis + (indices,))


def along_axis(shape: tuple[int, ...], indices: Any, axis: int) -> tuple[Any, ...]:
    """The integer-array index that picks `indices` along `axis` and keeps every other
    axis: aranges broadcasting against `indices` (NumPy's take_along_axis)."""
    ndim = len(shape)
    return tuple(
        indices if a == axis else np.arange(d).reshape((1,) * a + (d,) + (1,) * (ndim - a - 1))
        for a, d in enumerate(shape)
    )


def take_along_axis(arr: Any, indices: Any, axis: Any = -1) -> Any:
    """Pick values along `axis` at `indices` (same number of dimensions as `arr`,
    broadcasting on the others), as ``numpy.take_along_axis``; with argsort, it sorts.

    >>> x = np.array([[3.0, 1.0, 2.0]])
    >>> take_along_axis(x, np.argsort(x, axis=1), axis=1)
    array([[1., 2., 3.]])
    """
    arr = _array(arr)
    indices = _index_array(indices, "take_along_axis")
    if axis is None:
        if indices.ndim != 1:
            raise ValueError("take_along_axis: with axis=None, indices must be 1-D")
        arr, axis = ravel(arr), 0
    if indices.ndim != arr.ndim:
        raise ValueError(
            f"take_along_axis: indices ({indices.ndim} dimensions) and arr "
            f"({arr.ndim}) must have the same number of dimensions"
        )
    axis = normalize_axis(operator.index(axis), arr.ndim)[0]
    return getitem(arr, along_axis(arr.shape, indices, axis))


def put_along_axis(
    arr: Any, indices: Any, values: Any, axis: Any, inplace: bool = True, mode: str = "set"
) -> Any:
    """A copy of `arr` with `values` put at `indices` along `axis` (indexed as in
    `take_along_axis`), differentiable in `arr` and `values`. NumPy writes into `arr`; a
    traced array cannot change, so, as in JAX, pass ``inplace=False`` and use the result.
    `mode` is the `x.at[...]` update: "set" (the last of repeated indices lands), "add",
    "multiply", "min" or "max".

    >>> put_along_axis(np.zeros((2, 3)), np.array([[2], [0]]), 1.0, axis=1, inplace=False)
    array([[0., 0., 1.],
           [1., 0., 0.]])
    """
    if inplace:
        raise ValueError(
            "put_along_axis: fastgrad never changes an array in place; pass inplace=False "
            "and use the returned array"
        )
    if mode not in ("set", "add", "multiply", "min", "max"):
        raise ValueError(
            f"put_along_axis: mode must be 'set', 'add', 'multiply', 'min' or 'max', got {mode!r}"
        )
    arr = _array(arr)
    indices = _index_array(indices, "put_along_axis")
    if axis is None:
        if indices.ndim != 1:
            raise ValueError("put_along_axis: with axis=None, indices must be 1-D")
        return reshape(put_along_axis(ravel(arr), indices, values, 0, False, mode), arr.shape)
    if indices.ndim != arr.ndim:
        raise ValueError(
            f"put_along_axis: indices ({indices.ndim} dimensions) and arr "
            f"({arr.ndim}) must have the same number of dimensions"
        )
    axis = normalize_axis(operator.index(axis), arr.ndim)[0]
    return update(arr, along_axis(arr.shape, indices, axis), mode, values)


# ---------------------------------------------------------------- diagonals, triangles


def diagonal(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Any:
    """The diagonal of the (axis1, axis2) planes, as a last axis (``numpy.diagonal``).

    >>> diagonal(np.arange(9.0).reshape(3, 3), offset=1)
    array([1., 5.])
    """
    a = _array(a)
    if a.ndim < 2:
        raise ValueError("diagonal needs an array of at least 2 dimensions")
    i, j = (normalize_axis(operator.index(x), a.ndim)[0] for x in (axis1, axis2))
    if i == j:
        raise ValueError(f"diagonal: axis1 and axis2 must differ, got {axis1} and {axis2}")
    a = moveaxis(a, (i, j), (-2, -1))
    *lead, n, m = a.shape
    offset = operator.index(offset)
    length = max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m))
    # In the flattened (n * m) plane, the diagonal is every (m + 1)-th element.
    start = offset if offset >= 0 else -offset * m
    flat = reshape(a, (*lead, n * m))
    return part(flat, len(lead), start, start + length * (m + 1) - m if length else start, m + 1)


def diag(v: Any, k: int = 0) -> Any:
    """The k-th diagonal of a 2-D array, or a 2-D array with 1-D `v` on its k-th diagonal.

    >>> diag(np.array([1.0, 2.0]), k=1)
    array([[0., 1., 0.],
           [0., 0., 2.],
           [0., 0., 0.]])
    """
    v = _array(v)
    k = operator.index(k)
    if v.ndim == 2:
        return diagonal(v, k)
    if v.ndim != 1:
        raise ValueError(f"diag needs a 1-D or 2-D array, got {v.ndim} dimensions")
    n = v.shape[0] + abs(k)
    if v.shape[0] == 0:
        return np.zeros((n, n), v.dtype)
    # Place v at every (n + 1)-th element of the flattened matrix.
    start = k if k >= 0 else -k * n
    index = ((start, start + (v.shape[0] - 1) * (n + 1) + 1, n + 1),)
    return reshape(slice_scatter(v, (n * n,), index), (n, n))


def diagflat(v: Any, k: int = 0) -> Any:
    """A 2-D array with the flattened `v` on its k-th diagonal.

    >>> diagflat(np.array([1.0, 2.0]))
    array([[1., 0.],
           [0., 2.]])
    >>> diagflat(np.array([3.0]), k=1)
    array([[0., 3.],
           [0., 0.]])
    """
    return diag(ravel(_array(v)), k)


def trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None) -> Any:
    """The sum along a diagonal, as ``numpy.trace``.

    >>> float(trace(np.arange(9.0).reshape(3, 3)))
    12.0
    """
    d = diagonal(a, offset, axis1, axis2)
    return sum(d if dtype is None else astype(d, dtype), axis=-1)


def _triangle(m: Any, k: int, lower: bool, what: str) -> Any:
    m = _array(m)
    if m.ndim == 0:
        raise ValueError(f"{what} needs an array of at least 1 dimension")
    rows, cols = m.shape[-2:] if m.ndim > 1 else m.shape * 2
    k = operator.index(k)
    mask = np.tri(rows, cols, k, dtype=bool) if lower else ~np.tri(rows, cols, k - 1, dtype=bool)
    return where(mask, m, np.zeros((), m.dtype))


def tril(m: Any, k: int = 0) -> Any:
    """`m` with the elements above the k-th diagonal zeroed (of each matrix of a stack).

    >>> tril(np.ones((2, 3)))
    array([[1., 0., 0.],
           [1., 1., 0.]])
    """
    return _triangle(m, k, True, "tril")


def triu(m: Any, k: int = 0) -> Any:
    """`m` with the elements below the k-th diagonal zeroed (of each matrix of a stack).

    >>> triu(np.ones((3, 3)))
    array([[1., 1., 1.],
           [0., 1., 1.],
           [0., 0., 1.]])
    >>> fg.grad(lambda m: fnp.sum(triu(m, k=1)))(np.ones((2, 2)))
    array([[0., 1.],
           [0., 0.]])
    """
    return _triangle(m, k, False, "triu")


# ---------------------------------------------------------------- choosing values


def select(condlist: Sequence[Any], choicelist: Sequence[Any], default: Any = 0) -> Any:
    """Per element, the choice of the first condition that holds, else `default`.

    >>> x = np.array([-2.0, 0.5, 3.0])
    >>> select([x < 0, x < 1], [-x, x * 10], default=x)
    array([2., 5., 3.])
    """
    condlist, choicelist = list(condlist), list(choicelist)
    if len(condlist) != len(choicelist):
        raise ValueError(
            f"select: {len(condlist)} conditions for {len(choicelist)} choices; they must match"
        )
    if not condlist:
        raise ValueError("select needs at least one condition")
    for i, c in enumerate(condlist):
        if aval_of(_array(c)).dtype != np.bool_:
            raise TypeError(f"select: condition {i} must be a boolean array")
    out = default
    for c, v in zip(reversed(condlist), reversed(choicelist), strict=True):
        out = where(c, v, out)
    return out


def nan_to_num(
    x: Any, copy: bool = True, nan: float = 0.0, posinf: Any = None, neginf: Any = None
) -> Any:
    """NaN replaced by `nan`, infinities by `posinf`/`neginf` (default: the dtype's largest
    finite values); gradient 1 where `x` is finite, 0 where it is replaced.

    >>> nan_to_num(np.array([np.nan, np.inf, -1.0]))
    array([ 0.00000000e+000,  1.79769313e+308, -1.00000000e+000])
    """
    x = _array(x)
    if x.dtype.kind != "f":
        return x
    big = np.finfo(x.dtype).max
    top = big if posinf is None else posinf
    bottom = -big if neginf is None else neginf
    x = where(isnan(x), nan, x)
    x = where(x == np.inf, top, x)
    return where(x == -np.inf, bottom, x)
