"""Index arrays and the functions whose result's shape depends on values.

Index arrays from shapes alone (tril_indices, triu_indices, diag_indices, indices, and
their `_from` forms, which read only the shape) are NumPy's, plain arrays usable to index
traced values; unravel_index and ravel_multi_index are integer arithmetic, traced or not.
nonzero, argwhere, flatnonzero, unique, bincount and histogram have results whose shape
depends on the values of their (integer or position) argument: that argument must be
concrete, and a traced one gets an error that says so; bincount's and histogram's weights
may be traced and are differentiable (they are added up with scatter_add).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, TracerError, aval_of
from fastgrad.ops.base import astype, is_traced
from fastgrad.ops.elementwise import add, clip
from fastgrad.ops.piecewise import floor_divide, remainder
from fastgrad.ops.scatter import update

__all__ = [
    "argwhere", "bincount", "broadcast_shapes", "diag_indices", "diag_indices_from",
    "flatnonzero", "histogram", "indices", "intersect1d", "nonzero", "promote_types",
    "ravel_multi_index", "result_type", "setdiff1d", "setxor1d", "tril_indices",
    "tril_indices_from", "triu_indices", "triu_indices_from", "union1d", "unique",
    "unravel_index",
]  # fmt: skip

# From shapes and dtypes alone: NumPy's own functions give the same plain arrays.
broadcast_shapes, promote_types = np.broadcast_shapes, np.promote_types
indices, diag_indices = np.indices, np.diag_indices
tril_indices, triu_indices = np.tril_indices, np.triu_indices


def _shape_of(arr: Any) -> tuple[int, ...]:
    return aval_of(arr if isinstance(arr, Tracer) else np.asarray(arr)).shape


def _sides(arr: Any, fn: str) -> tuple[int, int]:
    """The row and column counts `n`, `m` of a 2-D `arr`."""
    shape = _shape_of(arr)
    if len(shape) != 2:
        raise ValueError(f"{fn}: arr must be 2-D, got shape {shape}")
    return shape[0], shape[1]


def tril_indices_from(arr: Any, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the lower triangle of a 2-D `arr` (only its shape is read).

    >>> tril_indices_from(np.zeros((2, 2)))
    (array([0, 1, 1]), array([0, 0, 1]))
    """
    n, m = _sides(arr, "tril_indices_from")
    return np.tril_indices(n, k, m)


def triu_indices_from(arr: Any, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the upper triangle of a 2-D `arr` (only its shape is read).

    >>> triu_indices_from(np.zeros((2, 2)))
    (array([0, 0, 1]), array([0, 1, 1]))
    """
    n, m = _sides(arr, "triu_indices_from")
    return np.triu_indices(n, k, m)


def diag_indices_from(arr: Any) -> tuple[np.ndarray, ...]:
    """The indices of the main diagonal of `arr`, whose sides are equal (only its shape
    is read).

    >>> diag_indices_from(np.zeros((2, 2)))
    (array([0, 1]), array([0, 1]))
    """
    shape = _shape_of(arr)
    if len(shape) < 2 or len(set(shape)) != 1:
        raise ValueError(f"diag_indices_from: arr must have equal sides, got shape {shape}")
    return np.diag_indices(shape[0], len(shape))


def result_type(*arrays_and_dtypes: Any) -> np.dtype:
    """NumPy's result dtype for these arrays (traced ones by their dtype) and dtypes.

    >>> result_type(np.float32, np.zeros(2, np.int8))
    dtype('float32')
    """
    return np.result_type(
        *(aval_of(a).dtype if isinstance(a, Tracer) else a for a in arrays_and_dtypes)
    )


def _order(order: str, fn: str) -> str:
    if order not in ("C", "F"):
        raise ValueError(f"{fn}: order must be 'C' or 'F', got {order!r}")
    return order


def unravel_index(indices: Any, shape: Any, order: str = "C") -> tuple[Any, ...]:
    """The index of each flat index in an array of `shape` (C or Fortran order), as
    ``numpy.unravel_index``; integer arithmetic, traced or not (traced indices are not
    range-checked: NumPy raises for an out-of-range one).

    >>> unravel_index(np.array([5, 1]), (2, 3))
    (array([1, 0]), array([2, 1]))
    >>> unravel_index(np.array([5, 1]), (2, 3), order="F")
    (array([1, 1]), array([2, 0]))
    """
    shape = tuple(operator.index(d) for d in np.atleast_1d(shape).tolist())
    fortran = _order(order, "unravel_index") == "F"
    if not is_traced(indices):
        return np.unravel_index(indices, shape, order=order)
    out = []
    for d in shape if fortran else reversed(shape):  # the fastest-varying axis first
        out.append(remainder(indices, d))
        indices = floor_divide(indices, d)
    return tuple(out if fortran else reversed(out))


_MODES = ("raise", "wrap", "clip")


def _in_range(index: Any, d: int, mode: str) -> Any:
    """`index` brought into [0, d) as `mode` says ('raise' leaves it: a traced index is
    not checked)."""
    if mode == "wrap":
        return remainder(index, d)
    if mode == "clip":
        return clip(index, 0, d - 1)
    return index


def ravel_multi_index(multi_index: Any, dims: Any, mode: Any = "raise", order: str = "C") -> Any:
    """The flat index of each index tuple in an array of shape `dims` (C or Fortran order),
    as ``numpy.ravel_multi_index``. `mode` says what an index out of range does, for all
    axes or per axis (a tuple): 'raise' (on plain arrays; traced indices are not checked),
    'wrap' (modulo the axis length) or 'clip' (to its ends).

    >>> ravel_multi_index((np.array([1, 0]), np.array([2, 1])), (2, 3))
    array([5, 1])
    >>> ravel_multi_index((np.array([3, -1]), np.array([4, 1])), (2, 3), mode=("wrap", "clip"))
    array([5, 4])
    """
    dims = tuple(operator.index(d) for d in np.atleast_1d(dims).tolist())
    modes = (mode,) * len(dims) if isinstance(mode, str) else tuple(mode)
    if len(modes) != len(dims) or any(m not in _MODES for m in modes):
        raise ValueError(
            f"ravel_multi_index: mode must be one of {_MODES} or a tuple of them, one per "
            f"dimension ({len(dims)}), got {mode!r}"
        )
    fortran = _order(order, "ravel_multi_index") == "F"
    if not is_traced(*multi_index):
        arrays = tuple(np.asarray(i) for i in multi_index)
        return np.ravel_multi_index(arrays, dims, mode=modes, order=order)
    if len(multi_index) != len(dims):
        raise ValueError(f"ravel_multi_index: {len(multi_index)} index arrays for {len(dims)} dims")
    axes = list(zip(multi_index, dims, modes, strict=True))
    flat: Any = 0
    for index, d, m in reversed(axes) if fortran else axes:  # the slowest-varying axis first
        flat = add(flat * d, _in_range(index, d, m))
    return flat


# ---------------------------------------------------------------- value-shaped results


def _concrete(x: Any, fn: str, what: str) -> np.ndarray:
    if isinstance(x, Tracer):
        raise TracerError(
            f"{fn}: the shape of its result depends on the values of {what}, which is traced; "
            f"pass {what} as a static (concrete) value, or use fnp.where(cond, x, y) with a "
            "fixed shape"
        )
    return np.asarray(x)


def nonzero(a: Any) -> tuple[np.ndarray, ...]:
    """The indices of the nonzero elements, per axis, as ``numpy.nonzero``; `a` must be
    concrete (the count depends on its values).

    >>> nonzero(np.array([0.0, 2.0, 3.0]))
    (array([1, 2]),)
    """
    return np.nonzero(_concrete(a, "nonzero", "a"))


def argwhere(a: Any) -> np.ndarray:
    """The indices of the nonzero elements, one row each, as ``numpy.argwhere``; `a` must
    be concrete.

    >>> argwhere(np.array([[0.0, 1.0]]))
    array([[0, 1]])
    """
    return np.argwhere(_concrete(a, "argwhere", "a"))


def flatnonzero(a: Any) -> np.ndarray:
    """The indices of the nonzero elements of the flattened `a`, as ``numpy.flatnonzero``;
    `a` must be concrete.

    >>> flatnonzero(np.array([[0.0, 1.0], [2.0, 0.0]]))
    array([1, 2])
    """
    return np.flatnonzero(_concrete(a, "flatnonzero", "a"))


def unique(ar: Any, return_index: bool = False, return_inverse: bool = False,
           return_counts: bool = False, axis: Any = None) -> Any:  # fmt: skip
    """The sorted unique values (and where they are), as ``numpy.unique``; `ar` must be
    concrete. To differentiate through the values, index a traced array with the returned
    `return_index` positions.

    >>> unique(np.array([2, 1, 2]))
    array([1, 2])
    """
    ar = _concrete(ar, "unique", "ar")
    flags = (return_index, return_inverse, return_counts)
    return np.unique(ar, *flags, axis)  # type: ignore[call-overload]


# Set operations: sorted unique values, whose number depends on the values. To differentiate
# through them, index a traced array with positions from `intersect1d(...,
# return_indices=True)` or `unique(..., return_index=True)`.


def union1d(ar1: Any, ar2: Any) -> np.ndarray:
    """The sorted unique values in either array, as ``numpy.union1d``; both must be
    concrete.

    >>> union1d(np.array([3, 1]), np.array([1, 2]))
    array([1, 2, 3])
    """
    return np.union1d(_concrete(ar1, "union1d", "ar1"), _concrete(ar2, "union1d", "ar2"))


def intersect1d(
    ar1: Any, ar2: Any, assume_unique: bool = False, return_indices: bool = False
) -> Any:
    """The sorted unique values in both arrays (and, with `return_indices`, where they are
    in each), as ``numpy.intersect1d``; both must be concrete.

    >>> intersect1d(np.array([3, 1, 2]), np.array([2, 3, 4]), return_indices=True)
    (array([2, 3]), array([2, 0]), array([0, 1]))
    """
    ar1, ar2 = _concrete(ar1, "intersect1d", "ar1"), _concrete(ar2, "intersect1d", "ar2")
    if return_indices:
        return np.intersect1d(ar1, ar2, assume_unique, return_indices=True)
    return np.intersect1d(ar1, ar2, assume_unique)


def setdiff1d(ar1: Any, ar2: Any, assume_unique: bool = False) -> np.ndarray:
    """The sorted unique values of `ar1` that are not in `ar2`, as ``numpy.setdiff1d``;
    both must be concrete.

    >>> setdiff1d(np.array([3, 1, 2]), np.array([2]))
    array([1, 3])
    """
    ar1, ar2 = _concrete(ar1, "setdiff1d", "ar1"), _concrete(ar2, "setdiff1d", "ar2")
    return np.setdiff1d(ar1, ar2, assume_unique)


def setxor1d(ar1: Any, ar2: Any, assume_unique: bool = False) -> np.ndarray:
    """The sorted unique values in exactly one of the arrays, as ``numpy.setxor1d``; both
    must be concrete.

    >>> setxor1d(np.array([3, 1, 2]), np.array([2, 4]))
    array([1, 3, 4])
    """
    ar1, ar2 = _concrete(ar1, "setxor1d", "ar1"), _concrete(ar2, "setxor1d", "ar2")
    return np.setxor1d(ar1, ar2, assume_unique)


def bincount(x: Any, weights: Any = None, minlength: int = 0) -> Any:
    """How many times each value 0, 1, ... occurs in the non-negative integers `x`, or the
    sum of the `weights` at them, as ``numpy.bincount`` (in the weights' float dtype). `x`
    must be concrete (its maximum sets the length); `weights` may be traced, and the
    result is differentiable in them.

    >>> bincount(np.array([0, 2, 2]), np.array([0.5, 1.0, 2.0]))
    array([0.5, 0. , 3. ])
    """
    x = _concrete(x, "bincount", "x")
    if weights is None:
        return np.bincount(x, None, minlength)
    if not is_traced(weights):
        # The weights' float dtype, as traced below (NumPy's is always float64).
        weights = np.asarray(weights)
        dtype = weights.dtype if weights.dtype.kind == "f" else np.dtype(np.float64)
        return np.bincount(x, weights, minlength).astype(dtype)
    if x.ndim != 1 or (x.size and (x.dtype.kind not in "iu" or x.min() < 0)):
        raise ValueError("bincount: x must be a 1-D array of non-negative integers")
    if aval_of(weights).shape != x.shape:
        raise ValueError(
            f"bincount: weights of shape {aval_of(weights).shape} must match x's {x.shape}"
        )
    length = max(int(x.max()) + 1 if x.size else 0, operator.index(minlength))
    w = weights if aval_of(weights).dtype.kind == "f" else astype(weights, np.float64)
    zeros = np.zeros(length, aval_of(w).dtype)
    return update(zeros, x, "add", w)


def histogram(a: Any, bins: Any = 10, range: Any = None, density: bool = False,
              weights: Any = None) -> tuple[Any, np.ndarray]:  # fmt: skip  # noqa: A002
    """Counts (or summed `weights`) of `a`'s values in `bins`, and the bin edges, as
    ``numpy.histogram``. `a` and `bins` must be concrete; `weights` may be traced, and the
    counts are differentiable in them.

    >>> histogram(np.array([0.5, 1.5, 1.7]), bins=2, range=(0, 2))
    (array([1, 2]), array([0., 1., 2.]))
    """
    a = _concrete(a, "histogram", "a")
    if weights is None:
        return np.histogram(a, bins, range, density=density)
    if not is_traced(weights):
        weights = np.asarray(weights)
        dtype = weights.dtype if weights.dtype.kind == "f" else np.dtype(np.float64)
        counts, edges = np.histogram(a, bins, range, density=density, weights=weights)
        return counts.astype(dtype), edges
    counts, edges = np.histogram(a, bins, range)
    inside = (a >= edges[0]) & (a <= edges[-1])
    # NumPy's bins hold their left edge; the last also its right one.
    which = np.clip(np.searchsorted(edges, a, side="right") - 1, 0, len(edges) - 2)
    w = weights if aval_of(weights).dtype.kind == "f" else astype(weights, np.float64)
    kept = np.flatnonzero(inside.ravel())
    total = update(np.zeros(len(edges) - 1, aval_of(w).dtype), which.ravel()[kept], "add",
                   w.reshape(-1)[kept])  # fmt: skip
    if density:
        total = total / (total.sum() * np.diff(edges).astype(aval_of(w).dtype))
    return total, edges
