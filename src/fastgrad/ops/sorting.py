"""Sorting: sort (a primitive with NumPy's values), argsort and argpartition (integer
results, never differentiated), and partition built on argpartition.

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
from fastgrad.core.primitive import Primitive, register
from fastgrad.core.tracing import Tracer, bind
from fastgrad.ops.base import normalize_axis
from fastgrad.ops.indexing import scatter_add
from fastgrad.ops.selection import along_axis, take_along_axis
from fastgrad.ops.shape import ravel

__all__ = ["argpartition", "argsort", "partition", "sort"]

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


SORT = register(
    Primitive(
        "sort",
        _same_eval,
        lambda x, *, axis: np.sort(x, axis=axis),
        _sort_vjp,
        lambda t, out, x, *, axis: take_along_axis(t[0], _order(x, axis), axis),
        kind="other",
    )
)
ARGSORT = register(
    Primitive(
        "argsort",
        _index_eval,
        lambda x, *, axis, kind: np.argsort(x, axis=axis, kind=kind),
        None,
        kind="other",
    )
)
ARGPARTITION = register(
    Primitive(
        "argpartition",
        _index_eval,
        lambda x, *, axis, kth: np.argpartition(x, kth, axis=axis),
        None,
        kind="other",
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
