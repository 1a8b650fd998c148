"""Statistics: average with weights, median, quantile and percentile (linear
interpolation) and their NaN-skipping forms, cov, corrcoef (var and std are in
fastgrad.ops.reduction, nansum and friends in fastgrad.ops.nan_reductions); and the
counting reductions any, all and count_nonzero.

Compositions: weighted sums fuse; order statistics sort (fastgrad.ops.sorting) and pick
the neighbours of each quantile's position, so a median's gradient goes to the middle
value(s), and a quantile's also to a traced `q`.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import (
    astype,
    broadcast_to,
    is_traced,
    normalize_axis,
    promote,
    reshape,
    sum,
)
from fastgrad.ops.elementwise import (
    clip,
    divide,
    floor,
    isnan,
    logical_and,
    logical_not,
    minimum,
    multiply,
    not_equal,
    where,
)
from fastgrad.ops.indexing import getitem
from fastgrad.ops.manipulation import moveaxis
from fastgrad.ops.math import sqrt
from fastgrad.ops.products import matmul
from fastgrad.ops.reduction import max, mean, min
from fastgrad.ops.selection import diagonal, take_along_axis
from fastgrad.ops.shape import array, concatenate, squeeze, transpose
from fastgrad.ops.sorting import sort

__all__ = [
    "all", "any", "average", "corrcoef", "count_nonzero", "cov", "median", "nanmedian",
    "nanpercentile", "nanquantile", "percentile", "quantile",
]  # fmt: skip


def _array(x: Any) -> Any:
    return x if isinstance(x, Tracer) else np.asarray(x)


def _float_dtype(*dtypes: np.dtype) -> np.dtype:
    """The result dtype of a statistic: NumPy's promotion, float64 for integers."""
    dtype = np.result_type(*dtypes)
    return dtype if dtype.kind == "f" else np.result_type(dtype, np.float64)


# ---------------------------------------------------------------- weighted means


def average(
    a: Any, axis: Any = None, weights: Any = None, returned: bool = False, keepdims: bool = False
) -> Any:
    """The weighted mean along `axis`, as ``numpy.average``; with `returned`, also the sum
    of the weights. Weights either have `a`'s shape or the shape of the reduced axes.

    >>> float(average(np.array([1.0, 2.0, 4.0]), weights=[1.0, 1.0, 2.0]))
    2.75
    """
    a = _array(a)
    if weights is None:
        avg = mean(a, axis, keepdims)
        count = a.size // builtins.max(aval_of(avg).size, 1)
        scale = np.full(aval_of(avg).shape, count, aval_of(avg).dtype)
        return (avg, scale) if returned else avg
    w = _array(weights)
    if not is_traced(w):  # (weights given for the reduced axes sum the same in every slice)
        sums = np.sum(w, axis if w.shape == a.shape else None)
        if np.any(sums == 0):
            raise ZeroDivisionError("average: the weights sum to zero, so they cannot normalize")
    dtype = _float_dtype(a.dtype, w.dtype)
    a, w = astype(a, dtype), astype(w, dtype)
    if w.shape != a.shape:
        if axis is None:
            raise TypeError("average: axis must be given when weights and a differ in shape")
        axes = normalize_axis(axis, a.ndim)
        if w.shape != tuple(a.shape[k] for k in axes):
            raise ValueError(
                f"average: weights of shape {w.shape} do not fit axes {axes} of an array of "
                f"shape {a.shape}"
            )
        w = broadcast_to(
            reshape(w, tuple(d if k in axes else 1 for k, d in enumerate(a.shape))), a.shape
        )
    scale = sum(w, axis, keepdims)
    avg = divide(sum(multiply(a, w), axis, keepdims), scale)
    if returned:
        return avg, broadcast_to(scale, aval_of(avg).shape)
    return avg


# ---------------------------------------------------------------- order statistics


def _lerp(a: Any, b: Any, t: Any) -> Any:
    # NumPy's two forms, each exact at its own end (t = 0 gives a, t = 1 gives b).
    d = b - a
    return where(t >= 0.5, b - d * (1 - t), a + d * t)


def _quantile(
    a: Any, q: Any, axis: Any, keepdims: bool, scale: float, what: str, skip_nan: bool = False
) -> Any:
    a = _array(a)
    q = q if isinstance(q, Tracer | float | int) else np.asarray(q)
    # NumPy's result dtype: a Python number q takes a's float dtype.
    dtype, _ = promote([aval_of(a), aval_of(q)])
    dtype = dtype if dtype.kind == "f" else np.dtype(np.float64)
    q = _array(q)
    if not is_traced(q) and (np.any(q < 0) or np.any(q > scale) or np.any(np.isnan(q))):
        raise ValueError(f"{what}: q must be in the range [0, {scale:g}], got {q}")
    a = astype(a, dtype)
    q = divide(astype(q, dtype), scale) if scale != 1 else astype(q, dtype)
    axes = normalize_axis(axis, a.ndim)
    kept = tuple(1 if k in axes else d for k, d in enumerate(a.shape))
    rest = [k for k in range(a.ndim) if k not in axes]
    n = math.prod(a.shape[k] for k in axes)
    if n == 0:
        raise ValueError(f"{what} of an empty set of values (shape {a.shape}, axis {axis})")
    # The reduced axes become one last axis, sorted; NaNs sort last.
    x = reshape(transpose(a, rest + list(axes)), tuple(a.shape[k] for k in rest) + (n,))
    x = sort(x, -1)
    if skip_nan:
        # The values of each slice are its first `count`: positions depend on the slice.
        count = sum(astype(logical_not(isnan(x)), dtype), -1)[..., *(None,) * q.ndim]
        out = _interpolated(x, q * (count - 1), count, q.shape)
        out = where(count == 0, np.nan, out)
    else:
        out = _interpolated(x, q * (n - 1), n, q.shape)
        last = isnan(getitem(x, (Ellipsis, -1)))[..., *(None,) * q.ndim]
        out = where(last, np.nan, out)  # slices holding a NaN give NaN, as in NumPy
    if is_traced(q):  # out of range: no error can be raised, so NaN rather than a guess
        out = where(logical_and(q >= 0, q <= 1), out, np.nan)
    out = moveaxis(out, tuple(range(len(rest), len(rest) + q.ndim)), tuple(range(q.ndim)))
    if keepdims:
        out = reshape(out, q.shape + kept)
    return out


def _interpolated(x: Any, position: Any, count: Any, q_shape: tuple[int, ...]) -> Any:
    """Sorted `x`'s values at fractional `position`s along its last axis, interpolated
    linearly between neighbours; `count` values are in each slice (a number or an array
    per slice). The result has shape x.shape[:-1] + q_shape."""
    below = floor(position)
    t = position - below
    n = aval_of(x).shape[-1]
    lo = clip(astype(below, np.intp), 0, n - 1)  # in bounds even for a traced q outside
    if isinstance(count, int):  # the same positions in every slice
        hi = minimum(lo + 1, n - 1)
        return _lerp(getitem(x, (Ellipsis, lo)), getitem(x, (Ellipsis, hi)), t)
    hi = minimum(lo + 1, clip(astype(count, np.intp) - 1, 0, n - 1))
    out_shape = aval_of(position).shape
    flat = (*out_shape[: len(out_shape) - len(q_shape)], math.prod(q_shape))
    lo, hi = reshape(lo, flat), reshape(hi, flat)
    pick = [reshape(take_along_axis(x, i, -1), out_shape) for i in (lo, hi)]
    return _lerp(pick[0], pick[1], t)


def _linear_only(method: str, fn: str) -> None:
    if method != "linear":
        raise ValueError(f"{fn}: only method='linear' is supported, got {method!r}")


def quantile(
    a: Any, q: Any, axis: Any = None, method: str = "linear", keepdims: bool = False
) -> Any:
    """The `q`-th quantile(s) along `axis`, interpolating linearly between the two nearest
    values (NumPy's default method). `q` may be an array (its axes come first) or traced.

    >>> quantile(np.array([1.0, 2.0, 3.0, 10.0]), [0.5, 1.0])
    array([ 2.5, 10. ])
    """
    _linear_only(method, "quantile")
    return _quantile(a, q, axis, keepdims, 1.0, "quantile")


def percentile(
    a: Any, q: Any, axis: Any = None, method: str = "linear", keepdims: bool = False
) -> Any:
    """The `q`-th percentile(s) along `axis` (q from 0 to 100), as `quantile`.

    >>> float(percentile(np.array([1.0, 2.0, 3.0, 4.0]), 50))
    2.5
    """
    _linear_only(method, "percentile")
    return _quantile(a, q, axis, keepdims, 100.0, "percentile")


def median(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The median along `axis` (the mean of the two middle values for an even count); its
    gradient goes to the middle value(s).

    >>> float(median(np.array([3.0, 1.0, 4.0, 1.5])))
    2.25
    """
    return _quantile(a, 0.5, axis, keepdims, 1.0, "median")


def nanquantile(
    a: Any, q: Any, axis: Any = None, method: str = "linear", keepdims: bool = False
) -> Any:
    """`quantile` of the values that are not NaN (NaN for a slice of NaNs only).

    >>> float(nanquantile(np.array([1.0, np.nan, 3.0, 2.0]), 0.25))
    1.5
    """
    _linear_only(method, "nanquantile")
    return _quantile(a, q, axis, keepdims, 1.0, "nanquantile", skip_nan=True)


def nanpercentile(
    a: Any, q: Any, axis: Any = None, method: str = "linear", keepdims: bool = False
) -> Any:
    """`percentile` of the values that are not NaN (NaN for a slice of NaNs only).

    >>> float(nanpercentile(np.array([1.0, np.nan, 3.0, 2.0]), 50))
    2.0
    """
    _linear_only(method, "nanpercentile")
    return _quantile(a, q, axis, keepdims, 100.0, "nanpercentile", skip_nan=True)


def nanmedian(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """`median` of the values that are not NaN (NaN for a slice of NaNs only).

    >>> float(nanmedian(np.array([3.0, np.nan, 1.0, 4.0])))
    3.0
    """
    return _quantile(a, 0.5, axis, keepdims, 1.0, "nanmedian", skip_nan=True)


# ---------------------------------------------------------------- covariance


def _variables(m: Any, rowvar: bool, dtype: np.dtype, transpose_when: bool) -> Any:
    if aval_of(m).ndim > 2:
        raise ValueError("cov: m and y must have at most 2 dimensions")
    x = astype(array(m, ndmin=2), dtype)
    return transpose(x) if not rowvar and transpose_when else x


def cov(
    m: Any,
    y: Any = None,
    rowvar: bool = True,
    bias: bool = False,
    ddof: Any = None,
    fweights: Any = None,
    aweights: Any = None,
    dtype: Any = None,
) -> Any:
    """The covariance matrix of the variables in the rows (or, rowvar=False, the columns)
    of `m` and `y`, as ``numpy.cov``, with frequency and analytic weights.

    >>> cov(np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]]))
    array([[ 1., -1.],
           [-1.,  1.]])
    """
    parts = [_array(m)] + ([] if y is None else [_array(y)])
    # NumPy computes covariances in float64 at least, whatever the input.
    dtype = (
        np.dtype(dtype)
        if dtype is not None
        else np.result_type(*(aval_of(p).dtype for p in parts), np.float64)
    )
    # NumPy's rule for which inputs hold variables in columns: m unless it is 1-D, y
    # unless it has a single row.
    x = _variables(parts[0], rowvar, dtype, parts[0].ndim != 1)
    if y is not None:
        ys = _variables(parts[1], rowvar, dtype, array(parts[1], ndmin=2).shape[0] != 1)
        x = concatenate([x, ys], 0)
    n = aval_of(x).shape[1]
    if ddof is None:
        ddof = 0 if bias else 1
    if ddof != int(ddof):
        raise ValueError(f"cov: ddof must be an integer, got {ddof}")
    ddof = int(ddof)
    w = None
    if fweights is not None:
        f = _array(fweights)
        if f.shape != (n,):
            raise ValueError(f"cov: fweights must have shape ({n},), got {f.shape}")
        if not is_traced(f) and not np.all(f == np.around(f)):
            raise TypeError("cov: fweights must be integers (whole numbers)")
        if not is_traced(f) and np.any(f < 0):
            raise ValueError("cov: fweights must be non-negative")
        w = astype(f, dtype)
    if aweights is not None:
        aw = _array(aweights)
        if aw.shape != (n,):
            raise ValueError(f"cov: aweights must have shape ({n},), got {aw.shape}")
        if not is_traced(aw) and np.any(aw < 0):
            raise ValueError("cov: aweights must be non-negative")
        aw = astype(aw, dtype)
        w = aw if w is None else multiply(w, aw)
    avg, w_sum = average(x, axis=1, weights=w, returned=True)
    w_sum = getitem(w_sum, 0)
    # No degrees of freedom left: NumPy divides by 0 (infinities and NaN), never by a
    # negative count.
    if w is None:
        fact: Any = builtins.max(n - ddof, 0)
    elif ddof == 0:
        fact = w_sum
    elif aweights is None:
        fact = w_sum - ddof
    else:
        fact = w_sum - ddof * sum(multiply(w, aw)) / w_sum
    if is_traced(fact):
        fact = where(fact > 0, fact, 0.0)
    elif fact <= 0:
        fact = 0.0
    centered = x - reshape(avg, (-1, 1))
    weighted = centered if w is None else multiply(centered, w)
    c = divide(matmul(centered, transpose(weighted)), fact)
    return squeeze(c)


def corrcoef(x: Any, y: Any = None, rowvar: bool = True, dtype: Any = None) -> Any:
    """Pearson correlation coefficients of the variables, as ``numpy.corrcoef`` (clipped
    to [-1, 1] like NumPy's).

    >>> corrcoef(np.array([[0.0, 1.0, 2.0], [4.0, 2.0, 0.0]]))
    array([[ 1., -1.],
           [-1.,  1.]])
    """
    c = cov(x, y, rowvar, dtype=dtype)
    if aval_of(c).ndim == 0:
        return divide(c, c)
    d = sqrt(diagonal(c))
    c = divide(divide(c, reshape(d, (-1, 1))), reshape(d, (1, -1)))
    return where(c > 1, 1.0, where(c < -1, -1.0, c))


# ---------------------------------------------------------------- counting


def _truth(x: Any, axis: Any, keepdims: bool, reduction: Any, empty: bool) -> Any:
    x = _array(x)
    truth = x if x.dtype == np.bool_ else not_equal(x, 0)
    axes = normalize_axis(axis, x.ndim)
    if builtins.all(x.shape[a] for a in axes):
        return reduction(truth, axes, keepdims)
    # An empty axis: max and min have no identity there, any and all do.
    kept = (1 if k in axes else d for k, d in enumerate(x.shape) if keepdims or k not in axes)
    return np.full(tuple(kept), empty)


def any(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether any element along `axis` is true (nonzero); never differentiated.

    >>> any(np.array([[0.0, 2.0], [0.0, 0.0]]), axis=1)
    array([ True, False])
    """
    return _truth(x, axis, keepdims, max, False)


def all(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether every element along `axis` is true (nonzero); never differentiated.

    >>> all(np.array([[1.0, 2.0], [0.0, 3.0]]), axis=1)
    array([ True, False])
    """
    return _truth(x, axis, keepdims, min, True)


def count_nonzero(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The number of nonzero (true) elements along `axis`.

    >>> count_nonzero(np.array([[0.0, 2.0], [1.0, 3.0]]), axis=0)
    array([1, 2])
    """
    return sum(astype(not_equal(_array(x), 0), np.intp), axis, keepdims)
