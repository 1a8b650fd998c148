"""Indexing: `x[...]` with slices, ints, None, Ellipsis, concrete boolean masks and integer
arrays. Basic indexing lowers to slice and reshape (fastgrad.ops.shape); integer arrays to
`gather`, whose VJP is `scatter_add` (duplicate indices accumulate).
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import REGISTRY, Primitive, at, register
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.ops.base import batch_size, lift, reshape, with_batch
from fastgrad.ops.shape import format_slice, slice_array, transpose

__all__: list[str] = []  # x[...] reaches getitem through the tracer

# ---------------------------------------------------------------- records


# Integer-array indexing: `index` holds ("slice", start, stop, step) or ("array", k) per
# leading axis (k numbers the index-array operands); NumPy's placement rule decides where
# the broadcast index dimensions go.
def index_tuple(index: Any, arrays: Sequence[Any]) -> tuple[Any, ...]:
    """The NumPy index that the `index` spec stands for, with `arrays` as index arrays."""
    return tuple(
        arrays[e[1]] if e[0] == "array" else slice(e[1], e[2] if e[2] >= 0 else None, e[3])
        for e in index
    )


def gather_shape(x_shape: tuple[int, ...], index: Any, idx_shapes: list[tuple[int, ...]]) -> Any:
    try:
        bshape = np.broadcast_shapes(*idx_shapes)
    except ValueError:
        raise IndexError(
            f"index arrays of shapes {idx_shapes} cannot be broadcast together"
        ) from None
    positions = [i for i, e in enumerate(index) if e[0] == "array"]
    if not positions:  # slices only (an index update may have no index array)
        return tuple(len(range(*e[1:])) for e in index) + tuple(x_shape[len(index) :])
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    sliced = [(i, len(range(e[1], e[2], e[3]))) for i, e in enumerate(index) if e[0] == "slice"] + [
        (i, d) for i, d in enumerate(x_shape) if i >= len(index)
    ]
    if adjacent:
        before = [d for i, d in sliced if i < positions[0]]
        after = [d for i, d in sliced if i > positions[-1]]
        return tuple(before) + tuple(bshape) + tuple(after)
    return tuple(bshape) + tuple(d for _, d in sliced)


def _gather_eval(x: Aval, *idx: Aval, index: Any) -> Aval:
    for a in idx:
        if a.dtype.kind not in "iu":
            raise IndexError(f"index arrays must be integers, got {a}")
    return Aval(gather_shape(x.shape, index, [a.shape for a in idx]), x.dtype, x.weak)


def _scatter_add_impl(
    g: np.ndarray, *idx: np.ndarray, shape: Any, index: Any, out: np.ndarray | None = None
) -> np.ndarray:
    """`out`: an array of `shape` to add into after zeroing it (the NumPy tier's dead
    buffer: zeroing memory already touched costs less than np.zeros' fresh pages)."""
    if out is None:
        out = np.zeros(shape, g.dtype)
    else:
        out[...] = 0
    np.add.at(out, index_tuple(index, idx), g)
    return out


def _scatter_add_eval(g: Aval, *idx: Aval, shape: Any, index: Any) -> Aval:
    expected = gather_shape(tuple(shape), index, [a.shape for a in idx])
    if expected != g.shape:
        raise ValueError(f"scatter_add: cotangent {g.shape} does not match gather {expected}")
    return Aval(tuple(shape), g.dtype, g.weak)


def format_index(args: list[str], index: Any, first: int) -> str:
    """The `index` spec as it would be written, index arrays named by `args[first:]`."""
    return ", ".join(args[first + e[1]] if e[0] == "array" else format_slice(*e[1:]) for e in index)


def _format_gather(args: list[str], params: dict[str, Any]) -> str:
    return f"{args[0]}[{format_index(args, params['index'], 1)}]"


# ---- batching: the batch becomes one more index array, an iota over a new leading axis
# of x (or, with x shared, a leading axis of the index arrays); the output's axes are
# then put back in the order one example's would have, after the batch axis.


def _axis_names(index: Any, x_ndim: int, nd: int, batch: str | None) -> list[Any]:
    """The axes of a gather's output, named: "B" for the batch, ("b", i) for the index
    arrays' broadcast axes, ("s", axis) for a sliced or trailing axis of x. `batch` is
    "lead" when the batch is an index array before axis 0, "arrays" when the index arrays
    carry it, None for one example."""
    positions = [i for i, e in enumerate(index) if e[0] == "array"]
    if batch == "lead":
        positions = [-1, *positions]
    sliced = [("s", i) for i, e in enumerate(index) if e[0] == "slice"]
    sliced += [("s", i) for i in range(len(index), x_ndim)]
    arrays = (["B"] if batch else []) + [("b", i) for i in range(nd)]
    if not positions:
        return sliced
    if positions == list(range(positions[0], positions[-1] + 1)):  # adjacent: in place
        return (
            [s for s in sliced if s[1] < positions[0]]
            + arrays
            + [s for s in sliced if s[1] > positions[-1]]
        )
    return arrays + sliced


def batch_index(
    lead: bool, idx: Sequence[Any], idx_batched: Sequence[bool], index: Any, size: int, x_ndim: int
) -> tuple[list[Any], tuple[Any, ...], list[int]]:
    """A gather `index` with batched `idx` arrays and, if `lead`, a batch axis added in
    front of x (`x_ndim` axes in one example): the index arrays, the index, and the
    permutation that takes the batched gather's output to (batch, one example's output)."""
    shapes = [
        aval_of(a).shape[1:] if b else aval_of(a).shape
        for a, b in zip(idx, idx_batched, strict=True)
    ]
    nd = len(np.broadcast_shapes(*shapes)) if shapes else 0
    arrays = [
        reshape(a, (size,) + (1,) * (nd - len(s)) + s) if b else a
        for a, b, s in zip(idx, idx_batched, shapes, strict=True)
    ]
    if lead:
        iota = np.arange(size).reshape((size,) + (1,) * nd)
        arrays = [lift(iota), *arrays]
        index = (("array", 0), *(("array", e[1] + 1) if e[0] == "array" else e for e in index))
    batch = "lead" if lead else "arrays"
    got = _axis_names(index[1:] if lead else index, x_ndim, nd, batch)
    want = ["B", *_axis_names(index[1:] if lead else index, x_ndim, nd, None)]
    return arrays, tuple(index), [got.index(name) for name in want]


def _gather_batch(batched: Sequence[bool], x: Any, *idx: Any, index: Any) -> Any:
    size = batch_size(batched, (x, *idx))
    x_ndim = aval_of(x).ndim - batched[0]
    arrays, index2, perm = batch_index(batched[0], idx, batched[1:], index, size, x_ndim)
    return transpose(gather(x, arrays, index2), perm)


def _scatter_add_batch(batched: Sequence[bool], g: Any, *idx: Any, shape: Any, index: Any) -> Any:
    size = batch_size(batched, (g, *idx))
    g = g if batched[0] else with_batch(g, size)
    arrays, index2, perm = batch_index(True, idx, batched[1:], index, size, len(shape))
    g = transpose(g, [int(a) for a in np.argsort(perm)])
    return scatter_add(g, arrays, (size, *shape), index2)


# Special points: repeated indices (their cotangents add up), negative and empty index
# arrays, infinities and nan in the gathered values.
_X = np.array([[1.5, -2.0, 0.5, 4.0], [3.0, np.inf, np.nan, -0.5], [0.0, 2.0, 1.0, -1.0]])
_I = np.array([0, 2, 2, 1])
_J = np.array([3, 1, 1, -4])
_BOTH = (("array", 0), ("array", 1))

register(
    Primitive(
        "gather",
        _gather_eval,
        lambda x, *idx, index: x[index_tuple(index, idx)],
        lambda g, out, x, *idx, index: (
            scatter_add(g, idx, x.shape, index),
            *(None for _ in idx),
        ),
        # Index arrays are integers: only the gathered operand has a tangent.
        lambda t, out, x, *idx, index: gather(t[0], idx, index),
        _gather_batch,
        kind="other",
        format=_format_gather,
        special_points=(
            at(_X, _I, _J, index=_BOTH),
            at(_X, np.arange(3), np.array([1, 1, 2]), index=_BOTH),  # the row-pick pattern
            at(_X, np.array([[1, 1], [0, 2]]), index=(("slice", 0, 3, 1), ("array", 0))),
            at(_X, np.zeros(0, np.int64), index=(("array", 0),)),
        ),
    )
)
register(
    Primitive(
        "scatter_add",
        _scatter_add_eval,
        _scatter_add_impl,
        lambda g, out, x, *idx, shape, index: (
            gather(g, idx, index),
            *(None for _ in idx),
        ),
        lambda t, out, x, *idx, shape, index: scatter_add(t[0], idx, shape, index),
        _scatter_add_batch,
        kind="other",
        special_points=(
            at(_X[0], _I, _J, shape=(3, 4), index=_BOTH),
            at(_X[1, :3], np.arange(3), np.array([1, 1, 2]), shape=(3, 4), index=_BOTH),
            at(np.zeros(0), np.zeros(0, np.int64), shape=(3,), index=(("array", 0),)),
        ),
    )
)


# ---------------------------------------------------------------- functions


def gather(x: Any, idx: Sequence[Any], index: Any) -> Any:
    """`x[...]` with integer index arrays `idx` placed as described by `index`."""
    return bind(REGISTRY["gather"], x, *idx, index=tuple(index))


def scatter_add(g: Any, idx: Sequence[Any], shape: tuple[int, ...], index: Any) -> Any:
    """Zeros of `shape` with `g` added at the gathered positions (the VJP of gather)."""
    return bind(REGISTRY["scatter_add"], g, *idx, shape=tuple(shape), index=tuple(index))


def _is_index_array(entry: Any) -> bool:
    return isinstance(entry, Tracer | np.ndarray | list) or (
        isinstance(entry, np.generic) and not isinstance(entry, np.integer | np.bool_)
    )


def getitem(x: Any, index: Any) -> Any:
    """`x[index]`: basic slicing, None, Ellipsis, and integer-array indexing.

    >>> getitem(np.arange(12.0).reshape(3, 4), (np.arange(3), np.array([0, 3, 1])))
    array([0., 7., 9.])
    """
    if type(index) is int and type(x) is Tracer and x.ndim:
        return _row(x, index)
    if not isinstance(index, tuple):
        index = (index,)
    if not isinstance(x, Tracer) and not any(isinstance(entry, Tracer) for entry in index):
        return np.asarray(x)[index]
    shape = aval_of(x).shape
    index = normalize_index(index, shape)
    if any(_is_index_array(entry) for entry in index):
        spec, arrays = index_spec(shape, index, "integer-array indexing")
        return gather(x, arrays, spec)
    return _basic_index(x, index, shape)


def _row(x: Tracer, i: int) -> Any:
    """`x[i]` for a Python int `i`: `_basic_index`'s nodes without normalizing an index
    (`xs[t]` in an unrolled loop: ~10 us of its ~15 us)."""
    shape = x.shape
    i = _check_int(i, shape[0], 0)
    spans = ((i, i + 1, 1), *((0, n, 1) for n in shape[1:]))
    return bind(REGISTRY["reshape"], slice_array(x, spans), shape=shape[1:])


def normalize_index(index: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """`index` with one entry per axis (None aside): Ellipsis expanded, concrete boolean
    masks replaced by the integer arrays they stand for, trailing axes filled with `:`."""
    if not isinstance(index, tuple):
        index = (index,)
    if builtins.sum(entry is Ellipsis for entry in index) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = builtins.sum(
        aval_of(entry).ndim if _is_bool_mask(entry) else 1
        for entry in index
        if entry is not None and entry is not Ellipsis
    )
    if consumed > len(shape):
        raise IndexError(f"too many indices ({consumed}) for an array of shape {shape}")
    if Ellipsis in [entry for entry in index if not isinstance(entry, Tracer | np.ndarray)]:
        i = next(i for i, entry in enumerate(index) if entry is Ellipsis)
        index = index[:i] + (slice(None),) * (len(shape) - consumed) + index[i + 1 :]
    index = tuple(_expand_mask(entry) for entry in index)
    index = tuple(
        i for entry in index for i in (entry if isinstance(entry, _MaskParts) else (entry,))
    )
    return index + (slice(None),) * (
        len(shape) - builtins.sum(entry is not None for entry in index)
    )


class _MaskParts(tuple):  # type: ignore[type-arg]
    """The integer arrays a concrete boolean mask stands for."""


def _is_bool_mask(entry: Any) -> bool:
    return isinstance(entry, Tracer | np.ndarray) and aval_of(entry).dtype == np.bool_


def _expand_mask(entry: Any) -> Any:
    if isinstance(entry, list):
        entry = np.asarray(entry)
    if _is_bool_mask(entry):
        if isinstance(entry, Tracer):
            raise IndexError(
                "indexing with a traced boolean mask would give a data-dependent shape; use "
                "where(mask, x, 0) instead, or pass the mask as a static argument"
            )
        return _MaskParts(np.nonzero(entry))
    return entry


def _check_int(i: int, n: int, axis: int) -> int:
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
    return i % n


def _basic_index(x: Any, index: tuple[Any, ...], shape: tuple[int, ...]) -> Any:
    spans, out_shape, axis = [], [], 0
    for entry in index:
        if entry is None:
            out_shape.append(1)
            continue
        n = shape[axis]
        if isinstance(entry, slice):
            start, stop, step = entry.indices(n)
            spans.append((start, stop, step))
            out_shape.append(len(range(start, stop, step)))
        else:
            i = _check_int(operator.index(entry), n, axis)
            spans.append((i, i + 1, 1))
        axis += 1
    return reshape(slice_array(x, tuple(spans)), tuple(out_shape))


def index_spec(
    shape: tuple[int, ...], index: Any, what: str
) -> tuple[tuple[tuple[Any, ...], ...], list[Any]]:
    """Gather's form of `index` into an array of `shape`: per axis ("slice", start, stop,
    step) or ("array", k), and the index arrays (ints become 0-d ones), checked when
    concrete. `what` names the operation in errors."""
    index = normalize_index(index, shape)
    if any(entry is None for entry in index):
        raise IndexError(f"None (newaxis) is not supported in {what}")
    spec: list[tuple[Any, ...]] = []
    arrays: list[Any] = []
    for axis, entry in enumerate(index):
        if isinstance(entry, slice):
            spec.append(("slice", *entry.indices(shape[axis])))
            continue
        if isinstance(entry, int | np.integer):
            entry = np.asarray(_check_int(int(entry), shape[axis], axis))
        elif not isinstance(entry, Tracer):
            entry = np.asarray(entry)
            if entry.dtype.kind not in "iu":
                raise IndexError(f"index arrays must be integers, got dtype {entry.dtype}")
            if entry.size and (entry.min() < -shape[axis] or entry.max() >= shape[axis]):
                raise IndexError(
                    f"index array out of bounds for axis {axis} with size {shape[axis]}"
                )
        spec.append(("array", len(arrays)))
        arrays.append(lift(entry))
    return tuple(spec), arrays
