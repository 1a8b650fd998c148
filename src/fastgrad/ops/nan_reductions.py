"""Reductions and scans that skip NaNs: nansum, nanmean, nanprod, nanmax, nanmin, nanvar,
nanstd, nanargmax, nanargmin, nancumsum, nancumprod (nanmedian and nanquantile sort, so
they are with the order statistics in fastgrad.ops.statistics).

Compositions: each NaN becomes the reduction's neutral value through `where`, so a NaN
gets no gradient and the rest fuses like the plain reduction; a slice with no values
gives NaN where NumPy does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, is_traced, normalize_axis, sum
from fastgrad.ops.cumulative import cumprod, cumsum
from fastgrad.ops.elementwise import divide, isnan, logical_not, where
from fastgrad.ops.math import sqrt
from fastgrad.ops.reduction import argmax, argmin, max, mean, min, prod

__all__ = [
    "nanargmax", "nanargmin", "nancumprod", "nancumsum", "nanmax", "nanmean", "nanmin",
    "nanprod", "nanstd", "nansum", "nanvar",
]  # fmt: skip


def _prepared(a: Any, dtype: Any = None) -> Any:
    a = a if isinstance(a, Tracer) else np.asarray(a)
    return a if dtype is None else astype(a, dtype)


def _filled(a: Any, value: float) -> Any:
    """`a` with its NaNs replaced by `value` (integers have none)."""
    return where(isnan(a), value, a) if aval_of(a).dtype.kind == "f" else a


def _count(a: Any, axis: Any, keepdims: bool) -> Any:
    """How many values along `axis` are not NaN, in a's float dtype."""
    return sum(astype(logical_not(isnan(a)), aval_of(a).dtype), axis, keepdims)


def nansum(a: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Any:
    """The sum with NaNs counted as zero (their gradient is 0).

    >>> float(nansum(np.array([1.0, np.nan, 2.0])))
    3.0
    """
    return sum(_filled(_prepared(a, dtype), 0.0), axis, keepdims)


def nanprod(a: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Any:
    """The product with NaNs counted as one (their gradient is 0).

    >>> float(nanprod(np.array([2.0, np.nan, 3.0])))
    6.0
    """
    return prod(_filled(_prepared(a, dtype), 1.0), axis, keepdims)


def nanmean(a: Any, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Any:
    """The mean of the values that are not NaN (NaN where there are none).

    >>> float(nanmean(np.array([1.0, np.nan, 2.0])))
    1.5
    """
    a = _prepared(a, dtype)
    if aval_of(a).dtype.kind != "f":
        return mean(a, axis, keepdims)
    return divide(nansum(a, axis, keepdims=keepdims), _count(a, axis, keepdims))


def _extreme(reduce: Any, fill: float, a: Any, axis: Any, keepdims: bool) -> Any:
    a = _prepared(a)
    if aval_of(a).dtype.kind != "f":
        return reduce(a, axis, keepdims)
    out = reduce(_filled(a, fill), axis, keepdims)
    # A slice of NaNs only has no extreme: NaN, as in NumPy (which also warns).
    return where(_count(a, axis, keepdims) == 0, np.nan, out)


def nanmax(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The maximum ignoring NaNs (NaN for a slice of NaNs only); ties share the gradient.

    >>> float(nanmax(np.array([1.0, np.nan, 2.0])))
    2.0
    """
    return _extreme(max, -np.inf, a, axis, keepdims)


def nanmin(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The minimum ignoring NaNs (NaN for a slice of NaNs only); ties share the gradient.

    >>> float(nanmin(np.array([1.0, np.nan, 2.0])))
    1.0
    """
    return _extreme(min, np.inf, a, axis, keepdims)


def nanvar(
    a: Any, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False
) -> Any:
    """The variance of the values that are not NaN, divided by their count minus `ddof`;
    NaN where that is not positive, as in NumPy.

    >>> float(nanvar(np.array([1.0, np.nan, 3.0])))
    1.0
    """
    a = _prepared(a, dtype)
    if aval_of(a).dtype.kind != "f":
        a = astype(a, np.float64)
    normalize_axis(axis, aval_of(a).ndim)  # an axis out of range says so here
    count = _count(a, axis, keepdims=True)
    centered = _filled(a - divide(nansum(a, axis, keepdims=True), count), 0.0)
    squares = sum(centered * centered, axis, keepdims)
    dof = _count(a, axis, keepdims) - ddof
    positive = dof > 0
    # The unused branch divides by 1, so no inf or NaN reaches a derivative.
    return where(positive, divide(squares, where(positive, dof, 1.0)), np.nan)


def nanstd(
    a: Any, axis: Any = None, dtype: Any = None, ddof: int = 0, keepdims: bool = False
) -> Any:
    """The standard deviation of the values that are not NaN (see `nanvar`).

    >>> float(nanstd(np.array([1.0, np.nan, 3.0])))
    1.0
    """
    return sqrt(nanvar(a, axis, dtype, ddof, keepdims))


def _arg_extreme(reduce: Any, fill: float, what: str, a: Any, axis: Any, keepdims: bool) -> Any:
    a = _prepared(a)
    if aval_of(a).dtype.kind != "f":
        return reduce(a, axis, keepdims)
    empty = _count(a, axis, keepdims) == 0
    if not is_traced(a) and np.any(empty):
        raise ValueError(f"{what}: all-NaN slice encountered")
    # Traced, a slice of NaNs only cannot raise: its index is -1, as in JAX.
    return where(empty, -1, reduce(_filled(a, fill), axis, keepdims))


def nanargmax(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The index of the maximum ignoring NaNs; never differentiated. A slice of NaNs
    only raises on a plain array, as in NumPy, and gives -1 traced, as in JAX.

    >>> int(nanargmax(np.array([1.0, np.nan, 2.0])))
    2
    """
    return _arg_extreme(argmax, -np.inf, "nanargmax", a, axis, keepdims)


def nanargmin(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The index of the minimum ignoring NaNs (see `nanargmax`).

    >>> int(nanargmin(np.array([1.0, np.nan, 2.0])))
    0
    """
    return _arg_extreme(argmin, np.inf, "nanargmin", a, axis, keepdims)


def nancumsum(a: Any, axis: Any = None, dtype: Any = None) -> Any:
    """The cumulative sum with NaNs counted as zero.

    >>> nancumsum(np.array([1.0, np.nan, 2.0]))
    array([1., 1., 3.])
    """
    return cumsum(_filled(_prepared(a), 0.0), axis, dtype)


def nancumprod(a: Any, axis: Any = None, dtype: Any = None) -> Any:
    """The cumulative product with NaNs counted as one.

    >>> nancumprod(np.array([2.0, np.nan, 3.0]))
    array([2., 2., 6.])
    """
    return cumprod(_filled(_prepared(a), 1.0), axis, dtype)
