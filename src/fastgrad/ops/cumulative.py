"""Scans and differences along an axis: cumsum (a primitive), cumprod, diff, gradient.

`cumsum`'s VJP is a cumsum running the other way (its `reverse` param), so every order is
a cumsum. cumprod is a log-depth scan of products built from slices and multiplies, exact
with zeros at every order; diff and gradient are slices and arithmetic, which fuse.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, at, register
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.ops.base import astype, batch_shift_axis, broadcast_to, is_traced, normalize_axis
from fastgrad.ops.elementwise import not_equal, subtract
from fastgrad.ops.manipulation import part
from fastgrad.ops.shape import concatenate, ones_like, ravel

__all__ = ["cumprod", "cumsum", "diff", "gradient"]

# ---------------------------------------------------------------- records


def _cumsum_eval(x: Aval, *, axis: int, reverse: bool) -> Aval:
    if not 0 <= axis < x.ndim:
        raise ValueError(f"cumsum: axis {axis} is out of bounds for shape {x.shape}")
    return Aval(x.shape, np.cumsum(np.zeros(1, x.dtype)).dtype, x.weak)


def _cumsum_impl(x: np.ndarray, *, axis: int, reverse: bool) -> np.ndarray:
    if not reverse:
        return np.cumsum(x, axis=axis)
    flip = tuple(slice(None, None, -1) if a == axis else slice(None) for a in range(x.ndim))
    return np.cumsum(x[flip], axis=axis)[flip]


CUMSUM: Primitive = register(
    Primitive(
        "cumsum",
        _cumsum_eval,
        _cumsum_impl,
        # Each input adds into every later (or, reversed, earlier) output.
        lambda g, out, x, *, axis, reverse: (bind(CUMSUM, g, axis=axis, reverse=not reverse),),
        lambda t, out, x, *, axis, reverse: bind(CUMSUM, t[0], axis=axis, reverse=reverse),
        batch=batch_shift_axis("cumsum"),
        kind="other",
        # Zeros, cancelling infinities (inf - inf: nan, after which the sum is nan),
        # size-0 and size-1 axes, both directions.
        special_points=tuple(
            at(x, axis=a, reverse=r)
            for x, a in (
                (np.array([[1.5, -2.0, 0.5], [3.0, 0.0, -1.0]]), 1),
                (np.array([[1.5, -2.0, 0.5], [3.0, 0.0, -1.0]]), 0),
                (np.array([0.0, np.inf, -np.inf, 1.0]), 0),
                (np.array([1.0, np.nan, 2.0]), 0),
                (np.zeros((2, 0)), 1),
                (np.array([[2.5]]), 0),
            )
            for r in (False, True)
        ),
    )
)


# ---------------------------------------------------------------- functions


def _along(x: Any, axis: Any, what: str) -> tuple[Any, int]:
    """`x` (flattened when `axis` is None) and the normalized axis to work along."""
    if axis is None:
        return ravel(x), 0
    ndim = aval_of(x).ndim
    if ndim == 0:
        raise ValueError(f"{what}: axis {axis} is out of bounds for a 0-d array")
    return x, normalize_axis(operator.index(axis), ndim)[0]


def cumsum(x: Any, axis: Any = None, dtype: Any = None) -> Any:
    """Cumulative sum along `axis` (of the flattened array when None), as ``numpy.cumsum``.

    >>> cumsum(np.array([[1.0, 2.0], [3.0, 4.0]]), axis=1)
    array([[1., 3.],
           [3., 7.]])
    """
    if dtype is not None:
        x = astype(x, dtype)
    x, axis = _along(x if isinstance(x, Tracer) else np.asarray(x), axis, "cumsum")
    return bind(CUMSUM, x, axis=axis, reverse=False)


def cumprod(x: Any, axis: Any = None, dtype: Any = None) -> Any:
    """Cumulative product along `axis` (of the flattened array when None).

    Traced, it is a scan of log2(n) rounds, each multiplying by the values shifted by 1, 2,
    4, ... places: no division, so derivatives are exact with zeros at every order. Values
    agree with ``numpy.cumprod`` up to rounding (the products are grouped differently).

    >>> cumprod(np.array([1.0, 2.0, 0.0, 4.0]))
    array([1., 2., 0., 0.])
    """
    if dtype is not None:
        x = astype(x, dtype)
    if not is_traced(x):
        return np.cumprod(x, axis=axis)
    x, axis = _along(x, axis, "cumprod")
    n = x.shape[axis]
    if x.dtype == np.bool_:
        x = astype(x, np.cumprod(np.ones(1, bool)).dtype)
    shift = 1
    while shift < n:
        head = ones_like(part(x, axis, 0, shift))
        x = x * concatenate([head, part(x, axis, 0, n - shift)], axis)
        shift *= 2
    return x


def _edge(x: Any, value: Any, axis: int) -> Any:
    """`value` (prepend/append of diff) as an array with `x`'s shape but for `axis`."""
    shape = list(aval_of(x).shape)
    if aval_of(value).ndim == 0:
        shape[axis] = 1
        return broadcast_to(value, tuple(shape))
    return value


def diff(x: Any, n: int = 1, axis: int = -1, prepend: Any = None, append: Any = None) -> Any:
    """The n-th discrete difference along `axis`, as ``numpy.diff``.

    >>> diff(np.array([1.0, 4.0, 9.0, 16.0]), n=2)
    array([2., 2.])
    """
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"diff: order n must be non-negative, got {n}")
    ndim = aval_of(x).ndim
    if ndim == 0:
        raise ValueError("diff needs an array of at least one dimension")
    axis = normalize_axis(axis, ndim)[0]
    if n == 0:
        return x
    pieces = [_edge(x, v, axis) for v in (prepend,) if v is not None]
    pieces += [x] + [_edge(x, v, axis) for v in (append,) if v is not None]
    if len(pieces) > 1:
        x = concatenate(pieces, axis)
    boolean = aval_of(x).dtype == np.bool_
    for _ in range(n):
        size = aval_of(x).shape[axis]
        if size == 0:
            break
        later, earlier = part(x, axis, 1, size), part(x, axis, 0, size - 1)
        x = not_equal(later, earlier) if boolean else subtract(later, earlier)
    return x


def _spacings(varargs: tuple[Any, ...], axes: tuple[int, ...]) -> list[Any]:
    if not varargs:
        return [1.0] * len(axes)
    if len(varargs) == 1 and aval_of(varargs[0]).ndim == 0:
        return list(varargs) * len(axes)
    if len(varargs) != len(axes):
        raise TypeError(
            f"gradient: give no spacing, one scalar, or one per axis ({len(axes)}), "
            f"got {len(varargs)}"
        )
    return list(varargs)


def gradient(f: Any, *varargs: Any, axis: Any = None, edge_order: int = 1) -> Any:
    """The gradient of sampled values `f` by central differences inside and one-sided
    differences (of first or second order) at the edges, as ``numpy.gradient``.

    Each spacing is a scalar (the step) or a 1-D array of coordinates along its axis;
    differentiable in `f` and in the spacings. One array per axis, as a tuple when there
    are several.

    >>> gradient(np.array([1.0, 2.0, 4.0, 7.0]))
    array([1. , 1.5, 2.5, 3. ])
    """
    varargs = tuple(v if isinstance(v, Tracer) else np.asarray(v) for v in varargs)
    if edge_order not in (1, 2):
        raise ValueError(f"gradient: edge_order must be 1 or 2, got {edge_order}")
    f = f if isinstance(f, Tracer) else np.asarray(f)
    dtype = f.dtype if f.dtype.kind == "f" else np.dtype(np.float64)
    f = astype(f, dtype)
    axes = tuple(
        normalize_axis(a, f.ndim)[0]
        for a in ((axis,) if isinstance(axis, int | np.integer) else axis or range(f.ndim))
    )
    out = []
    for a, spacing in zip(axes, _spacings(varargs, axes), strict=True):
        spacing = spacing if isinstance(spacing, Tracer) else np.asarray(spacing)
        n = f.shape[a]
        if n < edge_order + 1:
            raise ValueError(
                f"gradient: axis {a} has {n} element(s); edge_order {edge_order} needs at "
                f"least {edge_order + 1}"
            )
        out.append(astype(_gradient_along(f, spacing, a, n, edge_order), dtype))
    return out[0] if len(out) == 1 else tuple(out)


def _gradient_along(f: Any, spacing: Any, axis: int, n: int, edge_order: int) -> Any:
    def at(start: int, stop: int) -> Any:
        return part(f, axis, start, stop)

    def coef(c: Any) -> Any:  # a per-position coefficient, along `axis`
        shape = [1] * f.ndim
        shape[axis] = -1
        return c.reshape(shape) if aval_of(c).ndim else c

    step = aval_of(spacing)
    if step.ndim == 0 or (
        not is_traced(spacing) and np.all(np.diff(spacing) == np.diff(spacing)[:1])
    ):
        # Uniform steps: NumPy's formulas for that case (and rounding).
        h = spacing if step.ndim == 0 else np.diff(spacing)[0]
        inner = (at(2, n) - at(0, n - 2)) / (2.0 * h)
        if edge_order == 1:
            first = (at(1, 2) - at(0, 1)) / h
            last = (at(n - 1, n) - at(n - 2, n - 1)) / h
        else:
            first = (-1.5 * at(0, 1) + 2.0 * at(1, 2) - 0.5 * at(2, 3)) / h
            last = (0.5 * at(n - 3, n - 2) - 2.0 * at(n - 2, n - 1) + 1.5 * at(n - 1, n)) / h
        return concatenate([first, inner, last], axis)
    if step.shape != (n,):
        raise ValueError(
            f"gradient: coordinates along axis {axis} must have shape ({n},), got {step.shape}"
        )
    dx = diff(spacing)
    d1, d2 = dx[:-1], dx[1:]
    a = coef(-d2 / (d1 * (d1 + d2)))
    b = coef((d2 - d1) / (d1 * d2))
    c = coef(d1 / (d2 * (d1 + d2)))
    inner = a * at(0, n - 2) + b * at(1, n - 1) + c * at(2, n)
    if edge_order == 1:
        first = (at(1, 2) - at(0, 1)) / dx[0]
        last = (at(n - 1, n) - at(n - 2, n - 1)) / dx[-1]
    else:
        d1, d2 = dx[0], dx[1]
        first = (
            -(2.0 * d1 + d2) / (d1 * (d1 + d2)) * at(0, 1)
            + (d1 + d2) / (d1 * d2) * at(1, 2)
            - d1 / (d2 * (d1 + d2)) * at(2, 3)
        )
        d1, d2 = dx[-2], dx[-1]
        last = (
            d2 / (d1 * (d1 + d2)) * at(n - 3, n - 2)
            - (d2 + d1) / (d1 * d2) * at(n - 2, n - 1)
            + (2.0 * d2 + d1) / (d2 * (d1 + d2)) * at(n - 1, n)
        )
    return concatenate([first, inner, last], axis)
