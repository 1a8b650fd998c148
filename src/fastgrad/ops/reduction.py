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
from fastgrad.core.primitive import REGISTRY, Point, Primitive, at, register
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.ops.base import astype, batch_shift_axis, broadcast_to, normalize_axis, reshape, sum
from fastgrad.ops.elementwise import (
    abs,
    add,
    divide,
    isfinite,
    square,
    stop_gradient,
    subtract,
    where,
)
from fastgrad.ops.math import exp, log, sqrt
from fastgrad.ops.shape import concatenate, ones_like, squeeze, transpose

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

    No division (out / x fails at zeros, and its derivative is wrong at them): the reduced
    axes are moved last and flattened, and `_others_last` builds the products from a tree
    of pairwise products. Made of multiplies, slices and reshapes only, so it is exact with
    zeros, infinities and nan anywhere, and so are its derivatives at every order.
    """
    shape = x.shape
    kept = [a for a in range(len(shape)) if a not in axis]
    order = kept + list(axis)
    n = math.prod(shape[a] for a in axis)
    rows = reshape(transpose(x, order), (math.prod(shape[a] for a in kept), n))
    others = reshape(_others_last(rows), tuple(shape[a] for a in order))
    return transpose(others, tuple(np.argsort(order).tolist()))


def _others_last(x: Any) -> Any:
    """For a (m, n) array, the product of the other entries of each row, per entry."""
    m, n = x.shape
    if n <= 1:
        return ones_like(x)
    levels = 1 << (n - 1).bit_length()  # n padded with ones to a power of two
    if levels > n:  # fewer than n ones are needed: levels < 2n
        x = concatenate([x, ones_like(x[:, : levels - n])], axis=1)
    # Going up: products of blocks of 2, 4, ... entries.
    blocks = [x]
    while blocks[-1].shape[1] > 1:
        pairs = reshape(blocks[-1], (m, blocks[-1].shape[1] // 2, 2))
        blocks.append(pairs[:, :, 0] * pairs[:, :, 1])
    # Going down: the product outside each block, times its sibling's product.
    outside = ones_like(blocks[-1])
    for level in reversed(blocks[:-1]):
        half = level.shape[1] // 2
        pairs = reshape(level, (m, half, 2))
        outside = reshape(reshape(outside, (m, half, 1)) * pairs[:, :, ::-1], (m, 2 * half))
    return outside[:, :n]


def _prod_vjp(g: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    return (_unreduce(g, x.shape, axis, keepdims) * _prod_others(x, axis),)


def _prod_jvp(t: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    return sum(t[0] * _prod_others(x, axis), axis=axis, keepdims=keepdims)


def reduction(
    name: str,
    impl: Callable[..., Any],
    vjp: Callable[..., Any],
    jvp: Callable[..., Any],
    special_points: tuple[Point, ...],
) -> Primitive:
    return register(
        Primitive(
            name,
            _reduce_eval(name),
            lambda x, *, axis, keepdims: impl(x, axis=axis, keepdims=keepdims),
            vjp,
            jvp,
            lambda batched, x, *, axis, keepdims: bind(
                REGISTRY[name], x, axis=tuple(a + 1 for a in axis), keepdims=keepdims
            ),
            kind="reduction",
            format=_reduce_format(name),
            special_points=special_points,
        )
    )


# Special points: size-1 and size-0 axes, zeros, ties, infinities and nan.
inf, nan = math.inf, math.nan
_ARR = np.array([[1.5, -2.0, 0.5], [3.0, 0.25, -1.0]])


def _over(x: Any, *axes: tuple[int, ...], keepdims: bool = False, **kw: Any) -> list[Point]:
    x = np.asarray(x, dtype=np.float64)
    return [at(x, axis=a, keepdims=keepdims, **kw) for a in axes]


_SHAPES = [
    *_over(_ARR, (0,), (1,), (0, 1)),
    *_over(_ARR, (1,), keepdims=True),
    *_over(np.array(2.5), ()),  # a 0-d array: nothing to reduce
    *_over([[0.5, -1.5, 2.0]], (0,)),  # a size-1 axis
    *_over(np.array([[inf, 1.0], [-inf, 2.0], [nan, 3.0]]), (1,)),
]
_EMPTY = [*_over(np.zeros((0, 3)), (0,), (0, 1)), *_over(np.zeros((2, 0)), (0,))]
_TIES = [
    at(np.array(x), axis=a, keepdims=False, convention="max-min-reduction-ties")
    for x, a in (([1.0, 3.0, 3.0, 0.0], (0,)), ([[2.0, 2.0, 2.0], [1.0, -1.0, 1.0]], (1,)),
                 ([inf, inf, 1.0], (0,)), ([-inf, -inf], (0,)))
]  # fmt: skip
_ZEROS = _over(np.array([[2.0, 0.0, 3.0, 0.5, 1.5], [0.0, 0.0, 4.0, 1.0, 1.0]]), (1,), (0, 1))
_ZEROS += _over(np.array([[0.0, inf, 2.0], [0.0, 1e200, 1e200]]), (1,))

reduction("sum", np.sum, _sum_vjp, _sum_jvp, tuple(_SHAPES + _EMPTY))
reduction("max", np.max, _extremum_vjp, _extremum_jvp, tuple(_SHAPES + _TIES))
reduction("min", np.min, _extremum_vjp, _extremum_jvp, tuple(_SHAPES + _TIES))
reduction("prod", np.prod, _prod_vjp, _prod_jvp, tuple(_SHAPES + _EMPTY + _ZEROS))


def _arg_eval(x: Aval, *, axis: int | None) -> Aval:
    if x.size == 0:
        raise ValueError(f"argmax/argmin of an empty array (shape {x.shape})")
    shape = () if axis is None else tuple(d for i, d in enumerate(x.shape) if i != axis)
    return Aval(shape, np.dtype(np.int64))


def _arg_batch(name: str) -> Callable[..., Any]:
    along_axis = batch_shift_axis(name)

    def rule(batched: Any, x: Any, *, axis: int | None) -> Any:
        if axis is None:  # over the whole example: its elements in one axis
            return bind(REGISTRY[name], reshape(x, (aval_of(x).shape[0], -1)), axis=1)
        return along_axis(batched, x, axis=axis)

    return rule


for _name in ("argmax", "argmin"):
    register(
        Primitive(
            _name,
            _arg_eval,
            functools.partial(lambda f, x, *, axis: f(x, axis=axis), getattr(np, _name)),
            None,
            batch=_arg_batch(_name),
            kind="reduction",
            # Ties go to the first index, a nan wins, as in NumPy.
            special_points=tuple(
                at(np.array(x), axis=a)
                for x, a in (
                    ([1.0, 3.0, 3.0], None),
                    ([[1.0, nan], [2.0, 2.0]], 1),
                    ([[-inf, inf, 0.0]], None),
                    ([[0.5], [0.5]], 0),
                )
            ),  # fmt: skip
        )
    )


# ---------------------------------------------------------------- functions


def _reduce(name: str, x: Any, axis: Any, keepdims: bool) -> Any:
    if not isinstance(x, Tracer):
        x = np.asarray(x)
    axes = normalize_axis(axis, x.ndim)
    return bind(REGISTRY[name], x, axis=axes, keepdims=bool(keepdims))


def max(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Maximum over `axis`; tied maxima share the gradient equally.

    >>> max(np.array([[1.0, 3.0], [4.0, 2.0]]), axis=1)
    array([3., 4.])
    >>> fg.grad(max)(np.array([1.0, 3.0, 3.0]))  # a tie
    array([0. , 0.5, 0.5])
    """
    return _reduce("max", x, axis, keepdims)


def min(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Minimum over `axis`; tied minima share the gradient equally.

    >>> min(np.array([[1.0, 3.0], [0.0, 2.0]]), axis=0)
    array([0., 2.])
    >>> fg.grad(min)(np.array([2.0, 1.0, 1.0]))  # a tie
    array([0. , 0.5, 0.5])
    """
    return _reduce("min", x, axis, keepdims)


def prod(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Product over `axis`; its gradient is exact where inputs are zero.

    >>> prod(np.array([2.0, 3.0, 4.0]))
    array(24.)
    >>> fg.grad(prod)(np.array([2.0, 0.0, 4.0]))
    array([0., 8., 0.])
    """
    return _reduce("prod", x, axis, keepdims)


amax, amin = max, min


def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The mean over `axis` (all axes by default), as numpy.mean.

    >>> import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    >>> fnp.mean(np.array([[1.0, 2.0], [3.0, 5.0]]), axis=0)
    array([2. , 3.5])
    >>> fg.grad(fnp.mean)(np.zeros(4))
    array([0.25, 0.25, 0.25, 0.25])
    """
    shape = aval_of(x).shape
    count = math.prod(shape[a] for a in normalize_axis(axis, len(shape)))
    total = sum(x, axis, keepdims)
    if aval_of(total).dtype.kind != "f":
        total = astype(total, np.float64)
    return divide(total, count)


def var(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Any:
    """The variance over `axis`, with `ddof` degrees of freedom removed, as numpy.var.

    >>> import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    >>> float(fnp.var(np.array([1.0, 2.0, 3.0, 4.0]), ddof=1))
    1.6666666666666667
    >>> fg.grad(fnp.var)(np.array([1.0, 3.0]))
    array([-1.,  1.])
    """
    shape = aval_of(x).shape
    count = math.prod(shape[a] for a in normalize_axis(axis, len(shape)))
    centered = subtract(x, mean(x, axis, keepdims=True))
    return divide(sum(square(centered), axis, keepdims), count - ddof)  # noqa: F821


def std(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Any:
    """The standard deviation over `axis`, as numpy.std; its derivative is exactly 0 over
    one element.

    >>> import numpy as np, fastgrad.numpy as fnp
    >>> float(fnp.std(np.array([1.0, 3.0])))
    1.0
    """
    shape = aval_of(x).shape
    if ddof == 0 and math.prod(shape[a] for a in normalize_axis(axis, len(shape))) == 1:
        # One element per slice: the deviation is identically 0 (nan if the value is not
        # finite, as in NumPy). sqrt(var) would put sqrt'(0) = inf into the derivative;
        # |x - mean| has the same value and the true derivative, 0, at every order.
        return sum(abs(subtract(x, mean(x, axis, keepdims=True))), axis, keepdims)
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
    """Index of the maximum (of the flattened array when axis is None); never differentiated.

    >>> x = np.array([[1.0, 5.0], [7.0, 2.0]])
    >>> int(argmax(x)), argmax(x, axis=1)
    (2, array([1, 0]))
    """
    return _arg_reduce("argmax", x, axis, keepdims)


def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Index of the minimum (of the flattened array when axis is None); never differentiated.

    >>> x = np.array([[1.0, 5.0], [7.0, 2.0]])
    >>> int(argmin(x)), argmin(x, axis=0)
    (0, array([0, 1]))
    """
    return _arg_reduce("argmin", x, axis, keepdims)


def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """log(sum(exp(x))) over `axis`, computed stably.

    The shift by the maximum is stop_gradient'ed: the result does not depend on it, so no
    gradient needs to flow through it, and the backward pass is just a softmax.

    >>> float(logsumexp(np.array([1000.0, 1000.0])))  # naive exp overflows here
    1000.6931471805599
    """
    shift = _shift(x, axis)
    out = add(log(sum(exp(subtract(x, shift)), axis, keepdims=True)), shift)
    if not keepdims:
        out = squeeze(out, normalize_axis(axis, aval_of(x).ndim))
    return out


def softmax(x: Any, axis: Any = -1) -> Any:
    """exp(x) / sum(exp(x)) over `axis`, shifted by a stop_gradient'ed maximum.

    >>> softmax(np.array([[0.0, np.log(3.0)]]))
    array([[0.25, 0.75]])
    >>> fg.grad(lambda x: softmax(x)[0])(np.zeros(2))
    array([ 0.25, -0.25])
    """
    unnormalized = exp(subtract(x, _shift(x, axis)))
    return divide(unnormalized, sum(unnormalized, axis, keepdims=True))


def _shift(x: Any, axis: Any) -> Any:
    """The maximum over `axis`, stop_gradient'ed (the result does not depend on it), or 0
    where it is not finite: x - inf would make nan of the entries that are not inf."""
    shift = stop_gradient(max(x, axis, keepdims=True))
    return where(isfinite(shift), shift, 0.0)


def log_softmax(x: Any, axis: Any = -1) -> Any:
    """x - logsumexp(x) over `axis`.

    >>> log_softmax(np.array([1000.0, 1000.0]))
    array([-0.69314718, -0.69314718])
    >>> fg.grad(lambda x: log_softmax(x)[0])(np.zeros(2))
    array([ 0.5, -0.5])
    """
    return subtract(x, logsumexp(x, axis, keepdims=True))
