"""Sorting: sort (a primitive with NumPy's values), argsort, argpartition and
searchsorted (integer results, never differentiated), partition built on argpartition,
and digitize built on searchsorted.

A sort moves each value to a new place, so its derivative moves the cotangent back: the
VJP scatters `g` to the places a stable argsort names, the JVP gathers the tangent from
them. Tied values are told apart by their position, as in JAX: the first of equal inputs
takes the first of their places in the output.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, at, register
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.ops.base import batch_shift_axis, is_traced, normalize_axis
from fastgrad.ops.indexing import scatter_add
from fastgrad.ops.selection import along_axis, take_along_axis
from fastgrad.ops.shape import ravel, stack

__all__ = ["argpartition", "argsort", "digitize", "partition", "searchsorted", "sort"]

_KINDS = (None, "quicksort", "mergesort", "heapsort", "stable")

# ---------------------------------------------------------------- records


def _same_eval(x: Aval, *, axis: int) -> Aval:
    if not 0 <= axis < x.ndim:
        raise ValueError(f"sort: axis {axis} is out of bounds for shape {x.shape}")
    return x


def _index_eval(x: Aval, *, axis: int, **params: Any) -> Aval:
    _same_eval(x, axis=axis)
    return Aval(x.shape, np.dtype(np.intp))


def _order(x: Any, axis: int) -> Any:
    """The stable sorting permutation of `x` along `axis`."""
    return bind(ARGSORT, x, axis=axis, kind="stable")


def _sort_vjp(g: Any, out: Any, x: Any, *, axis: int) -> tuple[Any]:
    idx = along_axis(x.shape, _order(x, axis), axis)
    spec = tuple(("array", k) for k in range(x.ndim))
    return (scatter_add(g, idx, x.shape, spec),)


# Special points: ties (the gradient follows the stable order), infinities, nan (sorted
# last), size-0 and size-1 axes.
inf, nan = np.inf, np.nan
_V = np.array([[1.5, -2.0, 0.5], [3.0, 0.25, -1.0]])
_TIES = np.array([[1.0, 2.0, 1.0, 1.0], [0.0, -0.0, 3.0, 0.0]])
_NONFINITE = np.array([[inf, -inf, 0.5, nan], [nan, 1.0, nan, -inf]])
SORT = register(
    Primitive(
        "sort",
        _same_eval,
        lambda x, *, axis: np.sort(x, axis=axis),
        _sort_vjp,
        lambda t, out, x, *, axis: take_along_axis(t[0], _order(x, axis), axis),
        batch=batch_shift_axis("sort"),
        kind="other",
        special_points=(
            at(_V, axis=1),
            at(_V, axis=0),
            at(_TIES, axis=1, convention="sort-ties"),
            # One infinity per point: the oracle contracts the output with a cotangent,
            # and inf - inf there would be nan.
            at(np.array([[inf, -1.0, 0.5, 2.0]]), axis=1),
            at(np.array([[0.5, -inf, 2.0]]), axis=1),
            at(np.zeros((2, 0)), axis=1),
            at(_V[:, :1], axis=1),
        ),
    )
)
ARGSORT = register(
    Primitive(
        "argsort",
        _index_eval,
        lambda x, *, axis, kind: np.argsort(x, axis=axis, kind=kind),
        None,
        batch=batch_shift_axis("argsort"),
        kind="other",
        special_points=tuple(
            at(x, axis=1, kind=k) for x in (_V, _TIES, _NONFINITE) for k in ("stable", None)
        ),
    )
)
ARGPARTITION = register(
    Primitive(
        "argpartition",
        _index_eval,
        lambda x, *, axis, kth: np.argpartition(x, kth, axis=axis),
        None,
        batch=batch_shift_axis("argpartition"),
        kind="other",
        # The order within each side of kth is NumPy's choice: points without ties there.
        special_points=(at(_V, axis=1, kth=1), at(_NONFINITE[:1], axis=1, kth=2)),
    )
)


def _search_eval(a: Aval, v: Aval, *, side: str) -> Aval:
    return Aval(v.shape, np.dtype(np.intp))


def _searchsorted_batch(batched: Any, a: Any, v: Any, *, side: str) -> Any:
    """Batched values search the one sorted array at once; batched sorted arrays (rare)
    are searched one example at a time, the results stacked."""
    if not batched[0]:
        return bind(SEARCHSORTED, a, v, side=side)
    size = aval_of(a).shape[0]
    return stack(
        [bind(SEARCHSORTED, a[i], v[i] if batched[1] else v, side=side) for i in range(size)]
    )


SEARCHSORTED = register(
    Primitive(
        "searchsorted",
        _search_eval,
        lambda a, v, *, side: np.searchsorted(a, v, side=side),
        None,
        batch=_searchsorted_batch,
        kind="other",
        special_points=tuple(
            at(np.array([-inf, 0.0, 1.0, 1.0, 2.0, nan]), np.array(v), side=side)
            for v in ([1.0, 0.5, -0.0], [inf, -inf, nan], [[3.0, -1.0]])
            for side in ("left", "right")
        ),
    )
)


# ---------------------------------------------------------------- functions


def _prepared(a: Any, axis: Any, what: str) -> tuple[Any, int]:
    a = a if isinstance(a, Tracer) else np.asarray(a)
    if axis is None:
        return ravel(a), 0
    if a.ndim == 0:
        raise ValueError(f"{what}: axis {axis} is out of bounds for a 0-d array")
    return a, normalize_axis(operator.index(axis), a.ndim)[0]


def _kind(kind: Any, stable: Any) -> Any:
    if kind not in _KINDS:
        raise ValueError(f"sort kind must be one of {_KINDS[1:]}, got {kind!r}")
    return "stable" if stable else kind


def sort(a: Any, axis: Any = -1, kind: Any = None, *, stable: Any = None) -> Any:
    """A sorted copy of `a` along `axis` (of the flattened array when None), NaNs last.

    The gradient follows each value to its place; equal values keep their order (JAX's
    convention), whatever `kind` says.

    >>> sort(np.array([[3.0, 1.0, 2.0]]))
    array([[1., 2., 3.]])
    """
    _kind(kind, stable)
    a, axis = _prepared(a, axis, "sort")
    return bind(SORT, a, axis=axis)


def argsort(a: Any, axis: Any = -1, kind: Any = None, *, stable: Any = None) -> Any:
    """The indices that sort `a` along `axis`, as ``numpy.argsort``; never differentiated.

    >>> argsort(np.array([3.0, 1.0, 2.0]))
    array([1, 2, 0])
    """
    kind = _kind(kind, stable)
    a, axis = _prepared(a, axis, "argsort")
    return bind(ARGSORT, a, axis=axis, kind=kind)


def _kth(kth: Any, n: int) -> tuple[int, ...]:
    if isinstance(kth, Tracer):
        raise TypeError("partition: kth must be static ints, not a traced value")
    ks = tuple(operator.index(k) for k in np.atleast_1d(kth).tolist())
    for k in ks:
        if not -n <= k < n:
            raise ValueError(f"partition: kth {k} is out of bounds for an axis of size {n}")
    return tuple(k % n for k in ks)


def argpartition(a: Any, kth: Any, axis: Any = -1) -> Any:
    """Indices that partition `a` along `axis` around the `kth` element(s), as
    ``numpy.argpartition``; never differentiated.

    >>> int(argpartition(np.array([3.0, 1.0, 2.0]), 0)[0])
    1
    """
    a, axis = _prepared(a, axis, "argpartition")
    return bind(ARGPARTITION, a, axis=axis, kth=_kth(kth, a.shape[axis]))


def partition(a: Any, kth: Any, axis: Any = -1) -> Any:
    """`a` rearranged along `axis` so that the `kth` element is where sorting would put it,
    smaller ones before and larger ones after, as ``numpy.partition``; differentiable (each
    value carries its gradient to its place).

    >>> partition(np.array([3.0, 4.0, 1.0, 2.0]), 1)[1]
    np.float64(2.0)
    """
    a, axis = _prepared(a, axis, "partition")
    return take_along_axis(a, argpartition(a, kth, axis), axis)


def searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None) -> Any:
    """Where each of `v` would go in the sorted 1-D `a` to keep it sorted (the first such
    place for side "left", the last for "right"), as ``numpy.searchsorted``; integer
    results, never differentiated.

    >>> searchsorted(np.array([1.0, 2.0, 3.0]), np.array([2.0, 0.5]), side="right")
    array([2, 0])
    """
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    a = a if isinstance(a, Tracer) else np.asarray(a)
    v = v if isinstance(v, Tracer) else np.asarray(v)
    if aval_of(a).ndim != 1:
        raise ValueError(f"searchsorted: a must be 1-D, got shape {aval_of(a).shape}")
    if sorter is not None:
        a = take_along_axis(a, sorter if isinstance(sorter, Tracer) else np.asarray(sorter), 0)
    return bind(SEARCHSORTED, a, v, side=side)


def digitize(x: Any, bins: Any, right: bool = False) -> Any:
    """The index of the bin each of `x` falls in, for increasing or decreasing 1-D `bins`
    (a bin holds its left edge, or its right one with `right`), as ``numpy.digitize``;
    never differentiated.

    >>> digitize(np.array([0.5, 1.0, 2.5]), np.array([1.0, 2.0, 3.0]))
    array([0, 1, 2])
    """
    bins = bins if isinstance(bins, Tracer) else np.asarray(bins)
    if aval_of(bins).ndim != 1:
        raise ValueError(f"digitize: bins must be 1-D, got shape {aval_of(bins).shape}")
    if is_traced(bins):
        raise TypeError(
            "digitize: bins must be concrete (whether they increase or decrease decides the "
            "search); pass them as a static value, or use fnp.searchsorted"
        )
    steps = np.diff(bins)
    if not (np.all(steps >= 0) or np.all(steps <= 0)):
        raise ValueError("digitize: bins must be monotonically increasing or decreasing")
    side = "left" if right else "right"
    if bins.size > 1 and bins[0] > bins[-1]:  # decreasing: search the reversed bins
        return bins.size - searchsorted(bins[::-1], x, side=side)
    return searchsorted(bins, x, side=side)
