"""Numerical routines: linear interpolation (interp), the trapezoid rule, 1-D convolution
and correlation, polynomials (polyval, polyadd, polysub, polymul, polyder, polyint,
vander), ediff1d, peak-to-peak (ptp), and the closeness tests isclose and allclose.

Compositions: interp finds each point's interval with searchsorted and interpolates, so
its derivative flows to x, xp and fp; a convolution gathers the sliding windows of one
signal into a matrix and multiplies it by the other (a BLAS call), so it is differentiable
in both.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, normalize_axis, promote, reshape, sum
from fastgrad.ops.cumulative import cumprod, diff
from fastgrad.ops.elementwise import (
    abs,
    divide,
    equal,
    isfinite,
    isnan,
    logical_and,
    logical_or,
    where,
)
from fastgrad.ops.indexing import getitem
from fastgrad.ops.manipulation import flip, pad, part
from fastgrad.ops.products import matmul
from fastgrad.ops.reduction import max, min
from fastgrad.ops.selection import take
from fastgrad.ops.shape import concatenate, expand_dims, ravel, zeros_like
from fastgrad.ops.sorting import searchsorted
from fastgrad.ops.statistics import all

__all__ = [
    "allclose", "convolve", "correlate", "ediff1d", "interp", "isclose", "polyadd", "polyder",
    "polyint", "polymul", "polysub", "polyval", "ptp", "trapezoid", "vander",
]  # fmt: skip


def _array(x: Any) -> Any:
    return x if isinstance(x, Tracer) else np.asarray(x)


def _floats(*xs: Any) -> list[Any]:
    """`xs` as arrays of their common float dtype (float64 for integers)."""
    xs = tuple(x if isinstance(x, Tracer | float | int) else np.asarray(x) for x in xs)
    dtype, _ = promote([aval_of(x) for x in xs])
    dtype = dtype if dtype.kind == "f" else np.dtype(np.float64)
    return [astype(x, dtype) for x in xs]


# ---------------------------------------------------------------- interpolation


def interp(
    x: Any, xp: Any, fp: Any, left: Any = None, right: Any = None, period: Any = None
) -> Any:
    """The piecewise-linear interpolant through (`xp`, `fp`) at `x`, as ``numpy.interp``
    (`xp` increasing); `left` and `right` (default fp[0] and fp[-1]) outside. Differentiable
    in x, xp and fp. The result keeps the inputs' float dtype (NumPy's is float64).

    >>> interp(np.array([0.5, 2.5, 9.0]), np.array([0.0, 1.0, 3.0]), np.array([0.0, 2.0, 0.0]))
    array([1. , 0.5, 0. ])
    """
    if period is not None:
        raise ValueError("interp: period is not supported; wrap x into one period first")
    x, xp, fp = _floats(x, xp, fp)
    if aval_of(xp).ndim != 1 or aval_of(fp).shape != aval_of(xp).shape:
        raise ValueError(
            f"interp: xp and fp must be 1-D of one length, got shapes {aval_of(xp).shape} "
            f"and {aval_of(fp).shape}"
        )
    n = aval_of(xp).shape[0]
    if n == 0:
        raise ValueError("interp: xp and fp must not be empty")
    first, last = getitem(fp, 0), getitem(fp, n - 1)
    if n == 1:
        out = zeros_like(x) + first
    else:
        j = searchsorted(xp, x, side="right") - 1
        j = where(j < 0, 0, where(j > n - 2, n - 2, j))
        x0, x1 = take(xp, j), take(xp, j + 1)
        f0, f1 = take(fp, j), take(fp, j + 1)
        width = x1 - x0
        # Repeated knots make a zero width, never chosen below: divide by 1 there instead.
        slope = divide(f1 - f0, where(width == 0, 1.0, width))
        out = where(x == getitem(xp, n - 1), last, f0 + slope * (x - x0))
    out = where(x < getitem(xp, 0), first if left is None else left, out)
    return where(x > getitem(xp, n - 1), last if right is None else right, out)


# ---------------------------------------------------------------- integration


def trapezoid(y: Any, x: Any = None, dx: float = 1.0, axis: int = -1) -> Any:
    """The integral of `y` along `axis` by the trapezoid rule, at sample points `x` (1-D,
    or of y's shape) or spaced `dx` apart, as ``numpy.trapezoid``.

    >>> float(trapezoid(np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0, 3.0])))
    6.5
    """
    y = _array(y)
    ndim = aval_of(y).ndim
    axis = normalize_axis(operator.index(axis), ndim)[0]
    if x is None:
        d = dx
    elif aval_of(_array(x)).ndim == 1:  # spacings along `axis`, the same for every slice
        d = reshape(diff(_array(x)), tuple(-1 if k == axis else 1 for k in range(ndim)))
    else:
        d = diff(_array(x), axis=axis)
    ends = part(y, axis, 1, None) + part(y, axis, 0, -1)
    return sum(d * ends, axis) / 2.0


# ---------------------------------------------------------------- convolution


def _windows(a: Any, m: int) -> Any:
    """The full convolution's sliding windows of 1-D `a` for a kernel of length `m`:
    row k holds a[k - j] for j = 0..m-1 (zero outside a)."""
    n = aval_of(a).shape[0]
    padded = pad(a, m - 1)
    rows = np.arange(n + m - 1)[:, None] + (m - 1) - np.arange(m)[None, :]
    return getitem(padded, rows)


def convolve(a: Any, v: Any, mode: str = "full") -> Any:
    """The discrete linear convolution of 1-D `a` and `v`, as ``numpy.convolve``, with
    mode "full", "same" or "valid"; differentiable in both.

    >>> convolve(np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0, 0.5]))
    array([0. , 1. , 2.5, 4. , 1.5])
    """
    if mode not in ("full", "same", "valid"):
        raise ValueError(f"convolve: mode must be 'full', 'same' or 'valid', got {mode!r}")
    a, v = _floats(a, v)
    for name, arr in (("a", a), ("v", v)):
        if aval_of(arr).ndim != 1:
            raise ValueError(f"convolve: {name} must be 1-D, got shape {aval_of(arr).shape}")
        if aval_of(arr).shape[0] == 0:
            raise ValueError(f"convolve: {name} cannot be empty")
    n, m = aval_of(a).shape[0], aval_of(v).shape[0]
    if m > n:  # convolution commutes; the longer signal slides
        a, v, n, m = v, a, m, n
    full = matmul(_windows(a, m), v)
    if mode == "full":
        return full
    start = (m - 1) // 2 if mode == "same" else m - 1
    length = n if mode == "same" else n - m + 1
    return full[start : start + length]


def correlate(a: Any, v: Any, mode: str = "valid") -> Any:
    """The cross-correlation of real 1-D `a` and `v` (sum over n of a[n + k] * v[n]), as
    ``numpy.correlate``, with mode "valid", "same" or "full"; differentiable in both.

    >>> correlate(np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0, 0.5]))
    array([3.5])
    """
    a, v = _floats(a, v)
    if aval_of(v).ndim == 1 and aval_of(a).ndim == 1 and aval_of(v).shape[0] > aval_of(a).shape[0]:
        # NumPy's order for a longer v: the correlation of v with a, reversed.
        return flip(convolve(v, flip(a), mode))
    return convolve(a, flip(v) if aval_of(v).ndim == 1 else v, mode)


# ---------------------------------------------------------------- polynomials, ranges


def polyval(p: Any, x: Any) -> Any:
    """The polynomial with coefficients `p` (highest power first) at `x`, by Horner's
    rule, as ``numpy.polyval``; differentiable in p and x.

    >>> polyval(np.array([1.0, 0.0, -2.0]), np.array([0.0, 2.0]))
    array([-2.,  2.])
    """
    p, x = _floats(p, x)
    if aval_of(p).ndim != 1:
        raise ValueError(f"polyval: p must be 1-D, got shape {aval_of(p).shape}")
    y = zeros_like(x)
    for k in range(aval_of(p).shape[0]):
        y = y * x + getitem(p, k)
    return y


def _polynomial(p: Any, fn: str) -> Any:
    (p,) = _floats(p)
    if aval_of(p).ndim != 1:
        raise ValueError(f"{fn}: the coefficients must be 1-D, got shape {aval_of(p).shape}")
    return p


def _leading_zeros(p: Any, n: int) -> Any:
    """`p` with zeros in front up to length `n` (its highest powers are 0)."""
    short = n - aval_of(p).shape[0]
    if short <= 0:
        return p
    return concatenate([np.zeros(short, aval_of(p).dtype), p])


def polyadd(a1: Any, a2: Any) -> Any:
    """The sum of two polynomials (coefficients highest power first), as
    ``numpy.polyadd``.

    >>> polyadd(np.array([1.0, 2.0]), np.array([3.0]))
    array([1., 5.])
    """
    a1, a2 = _polynomial(a1, "polyadd"), _polynomial(a2, "polyadd")
    n = builtins.max(aval_of(a1).shape[0], aval_of(a2).shape[0])
    return _leading_zeros(a1, n) + _leading_zeros(a2, n)


def polysub(a1: Any, a2: Any) -> Any:
    """The difference of two polynomials, as ``numpy.polysub``.

    >>> polysub(np.array([1.0, 2.0]), np.array([3.0]))
    array([ 1., -1.])
    """
    return polyadd(a1, -_polynomial(a2, "polysub"))


def polymul(a1: Any, a2: Any) -> Any:
    """The product of two polynomials (the convolution of their coefficients), as
    ``numpy.polymul``.

    >>> polymul(np.array([1.0, 1.0]), np.array([1.0, -1.0]))
    array([ 1.,  0., -1.])
    """
    return convolve(_polynomial(a1, "polymul"), _polynomial(a2, "polymul"))


def polyder(p: Any, m: int = 1) -> Any:
    """The `m`-th derivative of a polynomial, as ``numpy.polyder``.

    >>> polyder(np.array([1.0, 2.0, 3.0]))
    array([2., 2.])
    """
    p = _polynomial(p, "polyder")
    m = operator.index(m)
    if m < 0:
        raise ValueError(f"polyder: the order m must be non-negative, got {m}")
    for _ in range(m):
        n = aval_of(p).shape[0]
        if n <= 1:
            return p[:0]
        p = p[:-1] * np.arange(n - 1, 0, -1)
    return p


def polyint(p: Any, m: int = 1, k: Any = None) -> Any:
    """The `m`-th antiderivative of a polynomial, the integration constants `k` (one per
    integration, first to last; 0 by default), as ``numpy.polyint``.

    >>> polyint(np.array([3.0, 2.0]), 2, [1.0, 2.0])
    array([0.5, 1. , 1. , 2. ])
    """
    p = _polynomial(p, "polyint")
    m = operator.index(m)
    if m < 0:
        raise ValueError(f"polyint: the order m must be non-negative, got {m}")
    constants = [0.0] * m if k is None else k
    if not isinstance(constants, list | tuple):
        constants = [constants] * m
    if len(constants) != m:
        raise ValueError(f"polyint: k must hold m = {m} constants, got {len(constants)}")
    for c in constants:
        n = aval_of(p).shape[0]
        last = reshape(astype(_array(c), aval_of(p).dtype), (1,))
        p = concatenate([p / np.arange(n, 0, -1), last])
    return p


def vander(x: Any, N: int | None = None, increasing: bool = False) -> Any:  # noqa: N803
    """The Vandermonde matrix of 1-D `x`: columns x**(N-1), ..., x, 1 (reversed when
    `increasing`), as ``numpy.vander`` but in x's float dtype (NumPy's is float64). Built
    by cumulative products, so its derivative is exact at x = 0.

    >>> vander(np.array([2.0, 3.0]), 3)
    array([[4., 2., 1.],
           [9., 3., 1.]])
    """
    (x,) = _floats(x)
    if aval_of(x).ndim != 1:
        raise ValueError(f"vander: x must be 1-D, got shape {aval_of(x).shape}")
    n = aval_of(x).shape[0] if N is None else operator.index(N)
    column = expand_dims(x, 1)
    if n == 0:
        return column[:, :0]
    ones = np.ones((aval_of(x).shape[0], 1), aval_of(x).dtype)
    powers = cumprod(concatenate([ones] + [column] * (n - 1), 1), 1)
    return powers if increasing else flip(powers, 1)


def ediff1d(ary: Any, to_end: Any = None, to_begin: Any = None) -> Any:
    """The differences of consecutive elements of the flattened `ary`, with `to_begin`
    and `to_end` around them, as ``numpy.ediff1d``.

    >>> ediff1d(np.array([1.0, 4.0, 9.0]), to_end=0.0)
    array([3., 5., 0.])
    """
    d = diff(ravel(_array(ary)))
    dtype = aval_of(d).dtype
    ends = [None if e is None else ravel(astype(_array(e), dtype)) for e in (to_begin, to_end)]
    parts = [e for e in (ends[0], d, ends[1]) if e is not None]
    return concatenate(parts) if len(parts) > 1 else d


def ptp(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The range, maximum minus minimum, along `axis` (``numpy.ptp``); ties share the
    gradient as in max and min.

    >>> float(ptp(np.array([3.0, -1.0, 2.0])))
    4.0
    """
    a = _array(a)
    return max(a, axis, keepdims) - min(a, axis, keepdims)


# ---------------------------------------------------------------- closeness


def isclose(
    a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> Any:
    """Where abs(a - b) <= atol + rtol * abs(b) (infinities close only to themselves), as
    ``numpy.isclose``; a boolean array, never differentiated.

    >>> isclose(np.array([1.0, np.inf, np.nan]), np.array([1.0 + 1e-9, np.inf, np.nan]))
    array([ True,  True, False])
    """
    a, b = _floats(a, b)
    finite = logical_and(isfinite(a), isfinite(b))
    # The difference of two infinities is NaN: compare finite values only.
    near = abs(where(finite, a, 0.0) - where(finite, b, 0.0)) <= atol + rtol * abs(
        where(finite, b, 0.0)
    )
    out = where(finite, near, equal(a, b))
    if equal_nan:
        out = logical_or(out, logical_and(isnan(a), isnan(b)))
    return out


def allclose(
    a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> Any:
    """Whether every element of `a` is close to `b` (see `isclose`): a Python bool on
    plain arrays, as ``numpy.allclose``, a traced boolean scalar in a traced function.

    >>> allclose([1.0, 2.0], [1.0, 2.0 + 1e-9])
    True
    """
    out = all(isclose(a, b, rtol, atol, equal_nan))
    return out if isinstance(out, Tracer) else bool(out)
