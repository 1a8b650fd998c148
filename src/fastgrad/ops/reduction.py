"""Reductions (sum, max, min, prod, argmax, argmin): records and functions, and the
statistics and normalizations built on them (mean, var, std, logsumexp, softmax).

Their params are `axis` (a sorted tuple) and `keepdims`. A reduction's VJP broadcasts the
cotangent back over the reduced axes (`_unreduce`); max and min share it among ties.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import REGISTRY, Primitive, register
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.ops.base import astype, broadcast_to, normalize_axis, reshape, sum
from fastgrad.ops.elementwise import divide, isfinite, square, stop_gradient, subtract, where
from fastgrad.ops.math import exp, log, sqrt
from fastgrad.ops.shape import squeeze

__all__ = [
    "amax", "amin", "argmax", "argmin", "log_softmax", "logsumexp", "max", "mean", "min",
    "prod", "softmax", "std", "sum", "var",
]  # fmt: skip

# ---------------------------------------------------------------- records


def _reduce_eval(name: str) -> Callable[..., Aval]:
    def abstract_eval(x: Aval, *, axis: tuple[int, ...], keepdims: bool) -> Aval:
        if name in ("max", "min") and x.size == 0 and any(x.shape[a] == 0 for a in axis):
            raise ValueError(f"{name} of an empty array has no identity (shape {x.shape})")
        shape = tuple(
            1 if i in axis else d for i, d in enumerate(x.shape) if keepdims or i not in axis
        )
        dtype = x.dtype
        if name in ("sum", "prod") and x.dtype.kind in "biu":
            dtype = np.asarray(getattr(np, name)(np.zeros(1, x.dtype))).dtype
        return Aval(shape, dtype, weak=x.weak)

    return abstract_eval


def _reduce_format(name: str) -> Callable[[list[str], dict[str, Any]], str]:
    def fmt(args: list[str], params: dict[str, Any]) -> str:
        axis = params["axis"]
        text = f"{name}({args[0]}, axis={axis[0] if len(axis) == 1 else axis}"
        return text + (", keepdims=True)" if params["keepdims"] else ")")

    return fmt


def _unreduce(g: Any, shape: tuple[int, ...], axis: tuple[int, ...], keepdims: bool) -> Any:
    """Broadcast a reduction's cotangent (or result) back to the input's shape."""
    if not keepdims:
        g = reshape(g, tuple(1 if i in axis else d for i, d in enumerate(shape)))
    return broadcast_to(g, shape)


def _sum_vjp(g: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> tuple[Any]:
    return (_unreduce(g, x.shape, axis, keepdims),)


def _sum_jvp(t: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    return sum(t[0], axis=axis, keepdims=keepdims)


def _extremum_vjp(g: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    # Ties share the cotangent equally, as in JAX.
    hit = (x == _unreduce(out, x.shape, axis, keepdims)).astype(x.dtype)
    count = sum(hit, axis=axis, keepdims=True)
    return (hit * _unreduce(g, x.shape, axis, keepdims) / broadcast_to(count, x.shape),)


def _extremum_jvp(t: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    # The mean of the tangents at the tied extrema: the transpose of _extremum_vjp.
    hit = (x == _unreduce(out, x.shape, axis, keepdims)).astype(x.dtype)
    count = sum(hit, axis=axis, keepdims=keepdims)
    return sum(hit * t[0], axis=axis, keepdims=keepdims) / count


def _prod_others(x: Any, axis: tuple[int, ...]) -> Any:
    """For each element of `x`, the product of the other elements of its slice along `axis`.

    out / x fails where x has zeros. The product of the other elements is: out / x with no
    zero in the slice; the product of the nonzeros at the single zero; 0 otherwise. Exact to
    first order everywhere; its own derivative is exact away from zeros only
    (test_reductions_on_random_shapes_and_axes).
    """
    is_zero = x == 0
    zeros = _unreduce(sum(is_zero, axis=axis, keepdims=True), x.shape, axis, True)
    nonzero_prod = prod(where(is_zero, 1.0, x), axis=axis, keepdims=True)
    nonzero_prod = _unreduce(nonzero_prod, x.shape, axis, True)
    return where(
        zeros == 0,
        nonzero_prod / where(is_zero, 1.0, x),
        where((zeros == 1) & is_zero, nonzero_prod, 0.0),
    )


def _prod_vjp(g: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    return (_unreduce(g, x.shape, axis, keepdims) * _prod_others(x, axis),)


def _prod_jvp(t: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    return sum(t[0] * _prod_others(x, axis), axis=axis, keepdims=keepdims)


def reduction(
    name: str, impl: Callable[..., Any], vjp: Callable[..., Any], jvp: Callable[..., Any]
) -> Primitive:
    return register(
        Primitive(
            name,
            _reduce_eval(name),
            lambda x, *, axis, keepdims: impl(x, axis=axis, keepdims=keepdims),
            vjp,
            jvp,
            kind="reduction",
            format=_reduce_format(name),
        )
    )


reduction("sum", np.sum, _sum_vjp, _sum_jvp)
reduction("max", np.max, _extremum_vjp, _extremum_jvp)
reduction("min", np.min, _extremum_vjp, _extremum_jvp)
reduction("prod", np.prod, _prod_vjp, _prod_jvp)


def _arg_eval(x: Aval, *, axis: int | None) -> Aval:
    if x.size == 0:
        raise ValueError(f"argmax/argmin of an empty array (shape {x.shape})")
    shape = () if axis is None else tuple(d for i, d in enumerate(x.shape) if i != axis)
    return Aval(shape, np.dtype(np.int64))


for _name in ("argmax", "argmin"):
    register(
        Primitive(
            _name,
            _arg_eval,
            functools.partial(lambda f, x, *, axis: f(x, axis=axis), getattr(np, _name)),
            None,
            kind="reduction",
        )
    )


# ---------------------------------------------------------------- functions


def _reduce(name: str, x: Any, axis: Any, keepdims: bool) -> Any:
    if not isinstance(x, Tracer):
        x = np.asarray(x)
    axes = normalize_axis(axis, x.ndim)
    return bind(REGISTRY[name], x, axis=axes, keepdims=bool(keepdims))


def max(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Maximum over `axis`; tied maxima share the gradient equally."""
    return _reduce("max", x, axis, keepdims)


def min(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Minimum over `axis`; tied minima share the gradient equally."""
    return _reduce("min", x, axis, keepdims)


def prod(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Product over `axis`; its gradient is exact where inputs are zero."""
    return _reduce("prod", x, axis, keepdims)


amax, amin = max, min


def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    shape = aval_of(x).shape
    count = math.prod(shape[a] for a in normalize_axis(axis, len(shape)))
    total = sum(x, axis, keepdims)
    if aval_of(total).dtype.kind != "f":
        total = astype(total, np.float64)
    return divide(total, count)


def var(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Any:
    shape = aval_of(x).shape
    count = math.prod(shape[a] for a in normalize_axis(axis, len(shape)))
    centered = subtract(x, mean(x, axis, keepdims=True))
    return divide(sum(square(centered), axis, keepdims), count - ddof)  # noqa: F821


def std(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Any:
    return sqrt(var(x, axis, keepdims, ddof))


def _arg_reduce(name: str, x: Any, axis: Any, keepdims: bool) -> Any:
    if not isinstance(x, Tracer):
        x = np.asarray(x)
    if axis is not None:
        axis = normalize_axis(axis, x.ndim)[0]
    out = bind(REGISTRY[name], x, axis=axis)
    if keepdims:
        out = reshape(out, tuple(1 if axis in (None, k) else d for k, d in enumerate(x.shape)))
    return out


def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Index of the maximum (of the flattened array when axis is None); never differentiated."""
    return _arg_reduce("argmax", x, axis, keepdims)


def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Index of the minimum (of the flattened array when axis is None); never differentiated."""
    return _arg_reduce("argmin", x, axis, keepdims)


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """log(sum(exp(x))) over `axis`, computed stably.

    The shift by the maximum is stop_gradient'ed: the result does not depend on it, so no
    gradient needs to flow through it, and the backward pass is just a softmax.

    >>> float(logsumexp(np.array([1000.0, 1000.0])))  # naive exp overflows here
    1000.6931471805599
    """
    shift = stop_gradient(max(x, axis, keepdims=True))
    shift = where(isfinite(shift), shift, 0.0)
    out = log(sum(exp(subtract(x, shift)), axis, keepdims=True)) + shift
    if not keepdims:
        out = squeeze(out, normalize_axis(axis, aval_of(x).ndim))
    return out


def softmax(x: Any, axis: Any = -1) -> Any:
    """exp(x) / sum(exp(x)) over `axis`, shifted by a stop_gradient'ed maximum."""
    unnormalized = exp(subtract(x, stop_gradient(max(x, axis, keepdims=True))))
    return unnormalized / sum(unnormalized, axis, keepdims=True)


def log_softmax(x: Any, axis: Any = -1) -> Any:
    """x - logsumexp(x) over `axis`."""
    return subtract(x, logsumexp(x, axis, keepdims=True))
