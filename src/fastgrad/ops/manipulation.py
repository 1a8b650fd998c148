"""Rearranging arrays: flip, rot90, roll, repeat, tile, append, pad, moveaxis, atleast_Nd,
the split and stack families.

No primitives here: each function is slices, reshapes, transposes, broadcasts and
concatenations (fastgrad.ops.shape), so gradients of every order come from theirs, and on
plain arrays the same code computes NumPy's result.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, broadcast_shapes, broadcast_to, normalize_axis, reshape
from fastgrad.ops.indexing import getitem
from fastgrad.ops.shape import concatenate, ravel, slice_array, transpose

__all__ = [
    "append", "array_split", "atleast_1d", "atleast_2d", "atleast_3d", "block",
    "broadcast_arrays", "column_stack", "delete", "dsplit", "dstack", "flip", "fliplr",
    "flipud", "hsplit", "hstack", "moveaxis", "pad", "repeat", "roll", "rollaxis", "rot90",
    "row_stack", "split", "tile", "vsplit", "vstack",
]  # fmt: skip


def _array(x: Any) -> Any:
    return x if isinstance(x, Tracer) else np.asarray(x)


def _axis(axis: Any, ndim: int) -> int:
    return normalize_axis(operator.index(axis), ndim)[0]


def part(x: Any, axis: int, start: int, stop: int | None, step: int = 1) -> Any:
    """`x[..., start:stop:step, ...]` along `axis`, with Python's slice rules."""
    shape = aval_of(x).shape
    span = slice(start, stop, step).indices(shape[axis])
    return slice_array(x, tuple(span if a == axis else (0, d, 1) for a, d in enumerate(shape)))


# ---------------------------------------------------------------- reordering


def flip(m: Any, axis: Any = None) -> Any:
    """Reverse the order of elements along `axis` (all axes when None).

    >>> flip(np.arange(6.0).reshape(2, 3), axis=1)
    array([[2., 1., 0.],
           [5., 4., 3.]])
    """
    m = _array(m)
    axes = normalize_axis(axis, m.ndim)
    spans = tuple(
        slice(None, None, -1).indices(d) if a in axes else (0, d, 1) for a, d in enumerate(m.shape)
    )
    return slice_array(m, spans)


def fliplr(m: Any) -> Any:
    """Reverse the order of columns (axis 1); `m` must be at least 2-D.

    >>> fliplr(np.array([[1, 2], [3, 4]]))
    array([[2, 1],
           [4, 3]])
    """
    if aval_of(m).ndim < 2:
        raise ValueError("fliplr needs an array of at least 2 dimensions")
    return flip(m, 1)


def flipud(m: Any) -> Any:
    """Reverse the order of rows (axis 0); `m` must be at least 1-D.

    >>> flipud(np.array([1, 2, 3]))
    array([3, 2, 1])
    """
    if aval_of(m).ndim < 1:
        raise ValueError("flipud needs an array of at least 1 dimension")
    return flip(m, 0)


def rot90(m: Any, k: int = 1, axes: Sequence[int] = (0, 1)) -> Any:
    """Rotate by 90 degrees `k` times in the plane of `axes`, from the first towards the
    second, as ``numpy.rot90``.

    >>> rot90(np.array([[1.0, 2.0], [3.0, 4.0]]))
    array([[2., 4.],
           [1., 3.]])
    """
    m = _array(m)
    axes = tuple(axes)
    if len(axes) != 2:
        raise ValueError(f"rot90: axes must name 2 axes, got {axes}")
    a, b = (_axis(x, m.ndim) for x in axes)
    if a == b:
        raise ValueError(f"rot90: axes {axes} must be different")
    k = operator.index(k) % 4
    if k == 0:
        return m
    if k == 2:
        return flip(m, (a, b))
    order = list(range(m.ndim))
    order[a], order[b] = order[b], order[a]
    return transpose(flip(m, b), order) if k == 1 else flip(transpose(m, order), b)


def roll(a: Any, shift: Any, axis: Any = None) -> Any:
    """Shift elements along `axis` cyclically (of the flattened array when None).

    >>> roll(np.arange(5.0), 2)
    array([3., 4., 0., 1., 2.])
    """
    a = _array(a)
    if axis is None:
        return reshape(roll(ravel(a), shift, 0), a.shape)
    shifts, axes = np.broadcast_arrays(np.asarray(shift), np.asarray(axis))
    if shifts.dtype.kind not in "iu" or axes.dtype.kind not in "iu" or shifts.ndim > 1:
        raise TypeError(f"roll: shift and axis must be ints or 1-D sequences of ints, got {shift}")
    total = dict.fromkeys(range(a.ndim), 0)
    for s, ax in zip(shifts.ravel().tolist(), axes.ravel().tolist(), strict=True):
        total[_axis(ax, a.ndim)] += s
    for ax, s in total.items():
        n = a.shape[ax]
        if n and s % n:
            s %= n
            a = concatenate([part(a, ax, n - s, n), part(a, ax, 0, n - s)], ax)
    return a


def moveaxis(a: Any, source: Any, destination: Any) -> Any:
    """Move axes to new positions, the others keeping their order, as ``numpy.moveaxis``.

    >>> moveaxis(np.zeros((2, 3, 4)), 0, -1).shape
    (3, 4, 2)
    """
    a = _array(a)
    src = [_axis(s, a.ndim) for s in np.atleast_1d(source).tolist()]
    dst = [_axis(d, a.ndim) for d in np.atleast_1d(destination).tolist()]
    if len(src) != len(dst):
        raise ValueError("moveaxis: source and destination must name the same number of axes")
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError("moveaxis: source and destination must not repeat an axis")
    order = [n for n in range(a.ndim) if n not in src]
    for d, s in sorted(zip(dst, src, strict=True)):
        order.insert(d, s)
    return transpose(a, order)


def rollaxis(a: Any, axis: int, start: int = 0) -> Any:
    """Move `axis` to just before position `start`, as ``numpy.rollaxis`` (moveaxis is
    clearer).

    >>> rollaxis(np.zeros((2, 3, 4)), 2).shape
    (4, 2, 3)
    """
    a = _array(a)
    axis = _axis(axis, a.ndim)
    start = operator.index(start)
    if not -a.ndim <= start <= a.ndim:
        raise ValueError(f"rollaxis: start {start} must be in [{-a.ndim}, {a.ndim}]")
    start = start + a.ndim if start < 0 else start
    start = start - 1 if axis < start else start
    return a if axis == start else moveaxis(a, axis, start)


def broadcast_arrays(*args: Any) -> tuple[Any, ...]:
    """The arguments broadcast to their common shape.

    >>> [x.shape for x in broadcast_arrays(np.zeros((2, 1)), np.zeros(3))]
    [(2, 3), (2, 3)]
    """
    shape = broadcast_shapes(*(aval_of(x).shape for x in args), what="broadcast_arrays")
    return tuple(broadcast_to(x, shape) for x in args)


# ---------------------------------------------------------------- copies


def repeat(a: Any, repeats: Any, axis: Any = None) -> Any:
    """Repeat each element `repeats` times along `axis` (of the flattened array when None);
    `repeats` is an int or one static int per element.

    >>> repeat(np.array([1.0, 2.0]), [1, 3])
    array([1., 2., 2., 2.])
    """
    a = _array(a)
    if axis is None:
        a, axis = ravel(a), 0
    axis = _axis(axis, a.ndim)
    if isinstance(repeats, Tracer):
        raise TypeError(
            "repeat: traced repeats would give a shape that depends on values; pass them as "
            "static ints"
        )
    counts = np.asarray(repeats)
    counts = counts.astype(np.intp) if counts.size == 0 else counts
    if counts.dtype.kind not in "iu" or counts.ndim > 1 or np.any(counts < 0):
        raise ValueError(f"repeat: repeats must be non-negative ints, got {repeats!r}")
    n = a.shape[axis]
    if counts.size == 1:
        # Each element copied: a new axis after `axis`, broadcast, merged back.
        r = int(counts.reshape(()))
        spread = reshape(a, a.shape[: axis + 1] + (1,) + a.shape[axis + 1 :])
        spread = broadcast_to(spread, a.shape[: axis + 1] + (r,) + a.shape[axis + 1 :])
        return reshape(spread, a.shape[:axis] + (n * r,) + a.shape[axis + 1 :])
    if counts.shape != (n,):
        raise ValueError(f"repeat: {counts.size} repeats for an axis of size {n}")
    index = (slice(None),) * axis + (np.repeat(np.arange(n), counts),)
    return getitem(a, index)


def tile(a: Any, reps: Any) -> Any:
    """`a` repeated `reps` times along each axis, as ``numpy.tile``.

    >>> tile(np.array([1.0, 2.0]), (2, 2))
    array([[1., 2., 1., 2.],
           [1., 2., 1., 2.]])
    """
    a = _array(a)
    reps = tuple(operator.index(r) for r in np.atleast_1d(reps).tolist())
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: reps must be non-negative, got {reps}")
    ndim = builtins.max(a.ndim, len(reps))
    shape = (1,) * (ndim - a.ndim) + a.shape
    reps = (1,) * (ndim - len(reps)) + reps
    interleaved = tuple(x for r, d in zip(reps, shape, strict=True) for x in (1, d))
    spread = broadcast_to(
        reshape(a, interleaved),
        tuple(x for r, d in zip(reps, shape, strict=True) for x in (r, d)),
    )
    return reshape(spread, tuple(r * d for r, d in zip(reps, shape, strict=True)))


def append(arr: Any, values: Any, axis: Any = None) -> Any:
    """`values` appended to `arr` along `axis` (both flattened when None).

    >>> append(np.array([1.0, 2.0]), [[3.0], [4.0]])
    array([1., 2., 3., 4.])
    """
    arr, values = _array(arr), _array(values)
    if axis is None:
        return concatenate([ravel(arr), ravel(values)], 0)
    return concatenate([arr, values], axis)


# ---------------------------------------------------------------- padding

_PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def delete(arr: Any, obj: Any, axis: Any = None) -> Any:
    """`arr` without the entries `obj` (an index, a slice, indices or a boolean mask,
    concrete) along `axis` (of the flattened array when None), as ``numpy.delete``.

    >>> delete(np.array([1.0, 2.0, 3.0]), [0, 2])
    array([2.])
    """
    if isinstance(obj, Tracer):
        raise TypeError("delete: obj must be concrete (the result's shape depends on it)")
    arr = _array(arr)
    if axis is None:
        arr, axis = reshape(arr, (-1,)), 0
    axis = _axis(axis, arr.ndim)
    keep = np.delete(np.arange(arr.shape[axis]), obj)
    return getitem(arr, (slice(None),) * axis + (keep,))


def pad(array: Any, pad_width: Any, mode: str = "constant", **kwargs: Any) -> Any:
    """Pad `array` as ``numpy.pad`` does, in modes "constant" (with `constant_values`,
    which may be traced), "edge", "reflect", "symmetric" and "wrap".

    >>> pad(np.array([1.0, 2.0, 3.0]), (2, 1), mode="reflect")
    array([3., 2., 1., 2., 3., 2.])
    """
    array = _array(array)
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode {mode!r} is not supported; supported: {', '.join(_PAD_MODES)}")
    allowed = {"constant_values"} if mode == "constant" else {"reflect_type"}
    if set(kwargs) - allowed:
        raise TypeError(f"pad: mode {mode!r} takes no argument {sorted(set(kwargs) - allowed)}")
    if kwargs.get("reflect_type", "even") != "even":
        raise ValueError("pad: only reflect_type='even' is supported")
    widths = np.asarray(pad_width)
    if widths.dtype.kind not in "iu":
        raise TypeError(f"pad: pad_width must be ints, got {pad_width!r}")
    try:
        widths = np.broadcast_to(widths, (array.ndim, 2))
    except ValueError:
        raise ValueError(
            f"pad: pad_width {pad_width!r} does not fit an array of {array.ndim} dimensions"
        ) from None
    if np.any(widths < 0):
        raise ValueError(f"pad: pad_width must be non-negative, got {pad_width!r}")
    values = kwargs.get("constant_values", 0)
    fills = _fill_values(values, array) if mode == "constant" else None
    for axis, (before, after) in enumerate(widths.tolist()):
        if not before and not after:
            continue
        if fills is not None:
            array = _pad_constant(array, axis, before, after, fills[axis])
        else:
            n = array.shape[axis]
            if n == 0:
                raise ValueError(f"pad: cannot extend an empty axis {axis} in mode {mode!r}")
            source = np.pad(np.arange(n), (before, after), mode=mode)  # type: ignore[call-overload]
            array = _gather_runs(array, axis, source)
    return array


def _fill_values(values: Any, array: Any) -> list[tuple[Any, Any]]:
    """(before, after) fill values per axis, in the array's dtype."""
    if isinstance(values, Tracer):
        if values.ndim:
            raise ValueError("pad: a traced constant_values must be a scalar")
        value = astype(values, array.dtype)
        return [(value, value)] * array.ndim
    pairs = np.broadcast_to(np.asarray(values), (array.ndim, 2))
    return [
        (np.asarray(b).astype(array.dtype), np.asarray(e).astype(array.dtype))
        for b, e in pairs.tolist()
    ]


def _pad_constant(x: Any, axis: int, before: int, after: int, fill: tuple[Any, Any]) -> Any:
    pieces = []
    for width, value in ((before, fill[0]), (None, None), (after, fill[1])):
        if width is None:
            pieces.append(x)
        elif width:
            shape = list(x.shape)
            shape[axis] = width
            pieces.append(broadcast_to(value, tuple(shape)))
    return concatenate(pieces, axis)


def _gather_runs(x: Any, axis: int, source: np.ndarray) -> Any:
    """x taken at positions `source` along `axis`, as slices of runs of consecutive (or
    repeated) positions: views and copies rather than a gather."""
    pieces, i = [], 0
    while i < len(source):
        j, step = i, int(source[i + 1] - source[i]) if i + 1 < len(source) else 1
        if step not in (-1, 0, 1):
            step = 1
        while j + 1 < len(source) and source[j + 1] - source[j] == step:
            j += 1
        start = int(source[i])
        if step == 0:
            one = part(x, axis, start, start + 1)
            shape = list(x.shape)
            shape[axis] = j - i + 1
            pieces.append(broadcast_to(one, tuple(shape)))
        else:
            stop = int(source[j]) + step
            pieces.append(part(x, axis, start, stop if stop >= 0 else None, step))
        i = j + 1
    return concatenate(pieces, axis)


# ---------------------------------------------------------------- splitting


def array_split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Any]:
    """Split into pieces along `axis`: `n` pieces as equal as can be (the first ones one
    longer), or at the given indices.

    >>> [p.tolist() for p in array_split(np.arange(5.0), 3)]
    [[0.0, 1.0], [2.0, 3.0], [4.0]]
    """
    ary = _array(ary)
    axis = _axis(axis, ary.ndim)
    n = ary.shape[axis]
    if isinstance(indices_or_sections, int | np.integer):
        sections = int(indices_or_sections)
        if sections <= 0:
            raise ValueError(f"array_split: number of sections must be positive, got {sections}")
        size, extra = divmod(n, sections)
        bounds = np.cumsum([0] + [size + 1] * extra + [size] * (sections - extra)).tolist()
    else:
        bounds = [0, *(operator.index(i) for i in indices_or_sections), n]
    return [part(ary, axis, s, e) for s, e in zip(bounds[:-1], bounds[1:], strict=True)]


def split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Any]:
    """Split into equal pieces along `axis` (an error if they cannot be equal), or at the
    given indices.

    >>> split(np.arange(6.0), 3)
    [array([0., 1.]), array([2., 3.]), array([4., 5.])]
    >>> split(np.arange(6.0), [1, 4])
    [array([0.]), array([1., 2., 3.]), array([4., 5.])]
    >>> fg.grad(lambda x: fnp.sum(split(x, 2)[1]))(np.zeros(4))
    array([0., 0., 1., 1.])
    """
    if isinstance(indices_or_sections, int | np.integer):
        n = aval_of(ary).shape[_axis(axis, aval_of(ary).ndim)]
        if indices_or_sections <= 0 or n % indices_or_sections:
            raise ValueError(
                f"split: an axis of size {n} does not split into {indices_or_sections} equal "
                "pieces (array_split allows unequal ones)"
            )
    return array_split(ary, indices_or_sections, axis)


def hsplit(ary: Any, indices_or_sections: Any) -> list[Any]:
    """Split along axis 1 (axis 0 for 1-D arrays).

    >>> [piece.tolist() for piece in hsplit(np.array([[1.0, 2.0], [3.0, 4.0]]), 2)]
    [[[1.0], [3.0]], [[2.0], [4.0]]]
    """
    ndim = aval_of(ary).ndim
    if ndim == 0:
        raise ValueError("hsplit needs an array of at least 1 dimension")
    return split(ary, indices_or_sections, 1 if ndim > 1 else 0)


def vsplit(ary: Any, indices_or_sections: Any) -> list[Any]:
    """Split along axis 0; `ary` must be at least 2-D.

    >>> vsplit(np.array([[1.0, 2.0], [3.0, 4.0]]), 2)
    [array([[1., 2.]]), array([[3., 4.]])]
    """
    if aval_of(ary).ndim < 2:
        raise ValueError("vsplit needs an array of at least 2 dimensions")
    return split(ary, indices_or_sections, 0)


def dsplit(ary: Any, indices_or_sections: Any) -> list[Any]:
    """Split along axis 2; `ary` must be at least 3-D.

    >>> [piece.shape for piece in dsplit(np.zeros((2, 2, 4)), [1])]
    [(2, 2, 1), (2, 2, 3)]
    """
    if aval_of(ary).ndim < 3:
        raise ValueError("dsplit needs an array of at least 3 dimensions")
    return split(ary, indices_or_sections, 2)


# ---------------------------------------------------------------- at least N-d, stacking


def _at_least(arys: tuple[Any, ...], ndim: int) -> Any:
    out = []
    for a in arys:
        a = _array(a)
        if a.ndim == 0:
            a = reshape(a, (1,) * ndim)
        elif a.ndim == 1 and ndim > 1:  # NumPy's placement: (n,) -> (1, n) -> (1, n, 1)
            a = reshape(a, ((1,) + a.shape + (1,))[:ndim])
        elif a.ndim == 2 and ndim == 3:  # (m, n) -> (m, n, 1)
            a = reshape(a, a.shape + (1,))
        out.append(a)
    return out[0] if len(out) == 1 else tuple(out)


def atleast_1d(*arys: Any) -> Any:
    """Each argument as an array of at least 1 dimension (a tuple for several).

    >>> atleast_1d(1.0)
    array([1.])
    >>> [a.shape for a in atleast_1d(1.0, np.ones((2, 2)))]
    [(1,), (2, 2)]
    """
    return _at_least(arys, 1)


def atleast_2d(*arys: Any) -> Any:
    """Each argument with at least 2 dimensions: (n,) becomes (1, n).

    >>> atleast_2d(np.array([1.0, 2.0]))
    array([[1., 2.]])
    """
    return _at_least(arys, 2)


def atleast_3d(*arys: Any) -> Any:
    """Each argument with at least 3 dimensions: (n,) becomes (1, n, 1), (m, n) (m, n, 1).

    >>> atleast_3d(np.ones(3)).shape, atleast_3d(np.ones((2, 3))).shape
    ((1, 3, 1), (2, 3, 1))
    """
    return _at_least(arys, 3)


def _listed(tup: Any, what: str) -> list[Any]:
    if isinstance(tup, Tracer) or not isinstance(tup, Sequence):
        raise TypeError(f"{what} takes a sequence of arrays (a list or a tuple)")
    if not tup:
        raise ValueError(f"{what} needs at least one array")
    return list(tup)


def vstack(tup: Sequence[Any]) -> Any:
    """Stack arrays vertically: along axis 0, 1-D arrays as rows.

    >>> vstack([np.array([1.0, 2.0]), np.array([3.0, 4.0])])
    array([[1., 2.],
           [3., 4.]])
    """
    return concatenate([atleast_2d(a) for a in _listed(tup, "vstack")], 0)


row_stack = vstack


def hstack(tup: Sequence[Any]) -> Any:
    """Stack arrays horizontally: along axis 1, or 0 for 1-D arrays.

    >>> hstack([np.array([1.0, 2.0]), np.array([3.0])])
    array([1., 2., 3.])
    >>> fg.grad(lambda x: fnp.sum(hstack([x, 2 * x])))(np.zeros(2))
    array([3., 3.])
    """
    arrays = [atleast_1d(a) for a in _listed(tup, "hstack")]
    return concatenate(arrays, 0 if arrays[0].ndim == 1 else 1)


def dstack(tup: Sequence[Any]) -> Any:
    """Stack arrays along axis 2, after making each at least 3-D.

    >>> dstack([np.ones((2, 2)), np.zeros((2, 2))]).shape
    (2, 2, 2)
    """
    return concatenate([atleast_3d(a) for a in _listed(tup, "dstack")], 2)


def column_stack(tup: Sequence[Any]) -> Any:
    """Stack 1-D arrays as columns (and 2-D arrays as they are) along axis 1.

    >>> column_stack([np.array([1.0, 2.0]), np.array([3.0, 4.0])])
    array([[1., 3.],
           [2., 4.]])
    """
    arrays = [_array(a) for a in _listed(tup, "column_stack")]
    return concatenate([reshape(a, (-1, 1)) if a.ndim < 2 else a for a in arrays], 1)


def _depth(x: Any) -> int:
    if isinstance(x, tuple):
        raise TypeError("block: arrays must be nested lists, not tuples (as in NumPy)")
    if not isinstance(x, list):
        return 0
    if not x:
        raise ValueError("block: a list in arrays is empty")
    depths = {_depth(e) for e in x}
    if len(depths) != 1:
        raise ValueError("block: the lists in arrays must be nested to one depth")
    return 1 + depths.pop()


def block(arrays: Any) -> Any:
    """One array assembled from nested lists of blocks, as ``numpy.block``: the innermost
    lists are joined along the last axis, the next ones along the one before, ...

    >>> block([[np.eye(2), np.zeros((2, 1))], [np.ones((1, 2)), np.ones((1, 1))]])
    array([[1., 0., 0.],
           [0., 1., 0.],
           [1., 1., 1.]])
    """
    depth = _depth(arrays)

    def leaves(x: Any) -> list[Any]:
        return [leaf for e in x for leaf in leaves(e)] if isinstance(x, list) else [x]

    ndim = builtins.max([depth] + [aval_of(_array(leaf)).ndim for leaf in leaves(arrays)])

    def assemble(x: Any, level: int) -> Any:
        if not isinstance(x, list):
            x = _array(x)
            return reshape(x, (1,) * (ndim - x.ndim) + x.shape)
        return concatenate([assemble(e, level + 1) for e in x], level - depth - 1)

    return assemble(arrays, 1) if depth else _array(arrays)
