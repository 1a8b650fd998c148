"""NumPy-like functions that work on plain arrays and on traced values alike.

`import fastgrad.numpy as fnp`. Each function checks and normalizes its arguments
(broadcasting, dtype promotion, axes, indices), then applies primitives from
fastgrad.ops. Broadcasting is made explicit here, in one place: primitives never see it.
Derived functions (logsumexp, softmax, softplus, ...) are compositions of primitives.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy import (  # noqa: F401  re-exported: creation functions give plain arrays
    arange,
    e,
    empty,
    eye,
    float32,
    float64,
    full,
    inf,
    int32,
    int64,
    linspace,
    nan,
    newaxis,
    ones,
    pi,
    zeros,
)

from fastgrad.ir import Aval
from fastgrad.ops import REGISTRY, STOP_GRADIENT
from fastgrad.tracing import Tracer, aval_of, bind, current_trace

# ---------------------------------------------------------------- broadcasting and dtypes


def _result_dtype(avals: Sequence[Aval]) -> tuple[np.dtype, bool]:
    """NumPy's promotion, with Python scalars weak (they take the other operand's dtype)."""
    standins = {"b": False, "i": 0, "u": 0, "f": 0.0}
    strong = [a.dtype for a in avals if not a.weak]
    weak = [standins[a.dtype.kind] for a in avals if a.weak]
    return np.result_type(*strong, *weak), not strong


def broadcast_shapes(*shapes: tuple[int, ...], what: str = "operands") -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        shown = " and ".join(str(tuple(s)) for s in shapes)
        raise ValueError(
            f"{what}: shapes {shown} cannot be broadcast together (NumPy rules: trailing axes "
            "must be equal or 1)"
        ) from None


def _lift(x: Any) -> Any:
    # Inside a trace, a concrete operand becomes a graph constant before it is broadcast,
    # so the graph keeps a scalar constant rather than a full-size array.
    trace = current_trace()
    if trace is None or isinstance(x, Tracer):
        return x
    return Tracer(trace, trace.to_var(x))


def _coerce(x: Any, aval: Aval, dtype: np.dtype, shape: tuple[int, ...], tracing: bool) -> Any:
    if not isinstance(x, Tracer):
        x = np.asarray(x, dtype=dtype)
        if tracing:
            x = _lift(x)
    elif aval.dtype != dtype:
        x = bind(REGISTRY["astype"], x, dtype=dtype)
    if tuple(x.shape) != shape:
        x = bind(REGISTRY["broadcast_to"], x, shape=shape)
    return x


def _elementwise(name: str, *args: Any) -> Any:
    avals = [aval_of(a) for a in args]
    shape = broadcast_shapes(*(a.shape for a in avals), what=name)
    dtype, weak = _result_dtype(avals)
    tracing = any(isinstance(a, Tracer) for a in args)
    if weak and not tracing:
        return bind(REGISTRY[name], *(np.asarray(a) for a in args))
    return bind(
        REGISTRY[name],
        *(_coerce(a, v, dtype, shape, tracing) for a, v in zip(args, avals, strict=True)),
    )


# One function per elementwise primitive, named as in NumPy.


def negative(x: Any) -> Any:
    """Elementwise ``numpy.negative``."""
    return _elementwise("negative", x)


def exp(x: Any) -> Any:
    """Elementwise ``numpy.exp``."""
    return _elementwise("exp", x)


def exp2(x: Any) -> Any:
    """Elementwise ``numpy.exp2``."""
    return _elementwise("exp2", x)


def expm1(x: Any) -> Any:
    """Elementwise ``numpy.expm1``."""
    return _elementwise("expm1", x)


def log(x: Any) -> Any:
    """Elementwise ``numpy.log``."""
    return _elementwise("log", x)


def log2(x: Any) -> Any:
    """Elementwise ``numpy.log2``."""
    return _elementwise("log2", x)


def log10(x: Any) -> Any:
    """Elementwise ``numpy.log10``."""
    return _elementwise("log10", x)


def log1p(x: Any) -> Any:
    """Elementwise ``numpy.log1p``."""
    return _elementwise("log1p", x)


def sqrt(x: Any) -> Any:
    """Elementwise ``numpy.sqrt``."""
    return _elementwise("sqrt", x)


def cbrt(x: Any) -> Any:
    """Elementwise ``numpy.cbrt``."""
    return _elementwise("cbrt", x)


def square(x: Any) -> Any:
    """Elementwise ``numpy.square``."""
    return _elementwise("square", x)


def reciprocal(x: Any) -> Any:
    """Elementwise ``numpy.reciprocal``."""
    return _elementwise("reciprocal", x)


def abs(x: Any) -> Any:
    """Elementwise ``numpy.abs``."""
    return _elementwise("abs", x)


def sin(x: Any) -> Any:
    """Elementwise ``numpy.sin``."""
    return _elementwise("sin", x)


def cos(x: Any) -> Any:
    """Elementwise ``numpy.cos``."""
    return _elementwise("cos", x)


def tan(x: Any) -> Any:
    """Elementwise ``numpy.tan``."""
    return _elementwise("tan", x)


def arcsin(x: Any) -> Any:
    """Elementwise ``numpy.arcsin``."""
    return _elementwise("arcsin", x)


def arccos(x: Any) -> Any:
    """Elementwise ``numpy.arccos``."""
    return _elementwise("arccos", x)


def arctan(x: Any) -> Any:
    """Elementwise ``numpy.arctan``."""
    return _elementwise("arctan", x)


def sinh(x: Any) -> Any:
    """Elementwise ``numpy.sinh``."""
    return _elementwise("sinh", x)


def cosh(x: Any) -> Any:
    """Elementwise ``numpy.cosh``."""
    return _elementwise("cosh", x)


def tanh(x: Any) -> Any:
    """Elementwise ``numpy.tanh``."""
    return _elementwise("tanh", x)


def arcsinh(x: Any) -> Any:
    """Elementwise ``numpy.arcsinh``."""
    return _elementwise("arcsinh", x)


def arccosh(x: Any) -> Any:
    """Elementwise ``numpy.arccosh``."""
    return _elementwise("arccosh", x)


def arctanh(x: Any) -> Any:
    """Elementwise ``numpy.arctanh``."""
    return _elementwise("arctanh", x)


def sigmoid(x: Any) -> Any:
    """1 / (1 + exp(-x)), computed without overflow."""
    return _elementwise("sigmoid", x)


def sign(x: Any) -> Any:
    """Elementwise ``numpy.sign``."""
    return _elementwise("sign", x)


def floor(x: Any) -> Any:
    """Elementwise ``numpy.floor``."""
    return _elementwise("floor", x)


def ceil(x: Any) -> Any:
    """Elementwise ``numpy.ceil``."""
    return _elementwise("ceil", x)


def rint(x: Any) -> Any:
    """Elementwise ``numpy.rint``."""
    return _elementwise("rint", x)


def isnan(x: Any) -> Any:
    """Elementwise ``numpy.isnan``."""
    return _elementwise("isnan", x)


def isinf(x: Any) -> Any:
    """Elementwise ``numpy.isinf``."""
    return _elementwise("isinf", x)


def isfinite(x: Any) -> Any:
    """Elementwise ``numpy.isfinite``."""
    return _elementwise("isfinite", x)


def logical_not(x: Any) -> Any:
    """Elementwise ``numpy.logical_not``."""
    return _elementwise("logical_not", x)


def add(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.add``, with broadcasting."""
    return _elementwise("add", x, y)


def subtract(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.subtract``, with broadcasting."""
    return _elementwise("subtract", x, y)


def multiply(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.multiply``, with broadcasting."""
    return _elementwise("multiply", x, y)


def divide(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.divide``, with broadcasting."""
    return _elementwise("divide", x, y)


def power(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.power``, with broadcasting."""
    return _elementwise("power", x, y)


def maximum(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.maximum``, with broadcasting."""
    return _elementwise("maximum", x, y)


def minimum(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.minimum``, with broadcasting."""
    return _elementwise("minimum", x, y)


def arctan2(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.arctan2``, with broadcasting."""
    return _elementwise("arctan2", x, y)


def less(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.less``, with broadcasting."""
    return _elementwise("less", x, y)


def less_equal(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.less_equal``, with broadcasting."""
    return _elementwise("less_equal", x, y)


def greater(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.greater``, with broadcasting."""
    return _elementwise("greater", x, y)


def greater_equal(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.greater_equal``, with broadcasting."""
    return _elementwise("greater_equal", x, y)


def equal(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.equal``, with broadcasting."""
    return _elementwise("equal", x, y)


def not_equal(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.not_equal``, with broadcasting."""
    return _elementwise("not_equal", x, y)


def logical_and(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.logical_and``, with broadcasting."""
    return _elementwise("logical_and", x, y)


def logical_or(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.logical_or``, with broadcasting."""
    return _elementwise("logical_or", x, y)


def logical_xor(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.logical_xor``, with broadcasting."""
    return _elementwise("logical_xor", x, y)


absolute = abs
true_divide = divide


def where(condition: Any, x: Any, y: Any) -> Any:
    """Choose elementwise from `x` where `condition` holds, else from `y` (NumPy broadcasting).

    >>> where(np.array([True, False]), 1.0, np.array([5.0, 6.0]))
    array([1., 6.])
    """
    if aval_of(condition).dtype != np.bool_:
        condition = not_equal(condition, 0)
    avals = [aval_of(a) for a in (condition, x, y)]
    shape = broadcast_shapes(*(a.shape for a in avals), what="where")
    dtype, weak = _result_dtype(avals[1:])
    tracing = any(isinstance(a, Tracer) for a in (condition, x, y))
    args = [
        _coerce(condition, avals[0], np.dtype(bool), shape, tracing),
        _coerce(x, avals[1], dtype, shape, tracing),
        _coerce(y, avals[2], dtype, shape, tracing),
    ]
    return bind(REGISTRY["where"], *args)


def astype(x: Any, dtype: Any) -> Any:
    """`x` converted to `dtype` (a no-op when it already has it)."""
    dtype = np.dtype(dtype)
    if aval_of(x).dtype == dtype and not (isinstance(x, Tracer) and x.aval.weak):
        return x if isinstance(x, Tracer) else np.asarray(x)
    if not isinstance(x, Tracer):
        return np.asarray(x).astype(dtype)
    return bind(REGISTRY["astype"], x, dtype=dtype)


def asarray(x: Any, dtype: Any = None) -> Any:
    """A traced value stays traced; anything else becomes a NumPy array."""
    if isinstance(x, Tracer):
        return x if dtype is None else astype(x, dtype)
    return np.asarray(x, dtype=dtype)


array = asarray


def clip(x: Any, a_min: Any = None, a_max: Any = None) -> Any:
    """Limit values to [a_min, a_max]; either bound may be None. Gradient as minimum/maximum."""
    if a_min is not None:
        x = maximum(x, a_min)
    if a_max is not None:
        x = minimum(x, a_max)
    return x


def relu(x: Any) -> Any:
    """max(x, 0), with gradient 0 at x == 0 as in JAX."""
    return where(greater(x, 0), x, 0)


def logaddexp(x: Any, y: Any) -> Any:
    """log(exp(x) + exp(y)) without overflow."""
    big = maximum(x, y)
    return big + log1p(exp(-abs(subtract(x, y))))


def softplus(x: Any) -> Any:
    """log(1 + exp(x)) without overflow."""
    return logaddexp(x, 0.0)


def log_sigmoid(x: Any) -> Any:
    return -softplus(-x)


# ---------------------------------------------------------------- reductions


def normalize_axis(axis: Any, ndim: int, what: str = "axis") -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
    out = []
    for a in axes:
        a = operator.index(a)
        if not -ndim <= a < builtins.max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            raise ValueError(f"{what} {a} is out of bounds for an array of {ndim} dimensions")
        out.append(a % builtins.max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {axis} repeats an axis")
    return tuple(sorted(out)) if ndim else ()


def _reduce(name: str, x: Any, axis: Any, keepdims: bool) -> Any:
    if not isinstance(x, Tracer):
        x = np.asarray(x)
    axes = normalize_axis(axis, x.ndim)
    return bind(REGISTRY[name], x, axis=axes, keepdims=bool(keepdims))


def sum(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Sum over `axis` (an int, a tuple, or None for all).

    >>> sum(np.arange(6.0).reshape(2, 3), axis=1)
    array([ 3., 12.])
    """
    return _reduce("sum", x, axis, keepdims)


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


def _arg_reduce(name: str, x: Any, axis: Any) -> Any:
    if not isinstance(x, Tracer):
        x = np.asarray(x)
    if axis is not None:
        axis = normalize_axis(axis, x.ndim)[0]
    return bind(REGISTRY[name], x, axis=axis)


def argmax(x: Any, axis: Any = None) -> Any:
    """Index of the maximum (of the flattened array when axis is None); never differentiated."""
    return _arg_reduce("argmax", x, axis)


def argmin(x: Any, axis: Any = None) -> Any:
    """Index of the minimum (of the flattened array when axis is None); never differentiated."""
    return _arg_reduce("argmin", x, axis)


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


def stop_gradient(x: Any, name: str | None = None) -> Any:
    """The identity going forward; no gradient flows back through it.

    Applied to a plain array it returns the array; integer and boolean values pass through.
    See `fastgrad.stop_gradient` for pytrees.
    """
    if not isinstance(x, Tracer) or x.dtype.kind != "f":
        return x
    return bind(STOP_GRADIENT, x, name=name)


# ---------------------------------------------------------------- shapes


def _shape_tuple(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        return (int(shape),)
    try:
        return tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"{what} must be a tuple of ints, got {shape!r}") from None


def reshape(x: Any, shape: Any) -> Any:
    """`x` with a new shape of the same size; one dimension may be -1."""
    aval = aval_of(x)
    shape = _shape_tuple(shape, "reshape shape")
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"reshape: bad shape {shape} (at most one -1, no other negatives)")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or aval.size % known:
            raise ValueError(f"cannot reshape an array of shape {aval.shape} into shape {shape}")
        shape = tuple(aval.size // known if d == -1 else d for d in shape)
    if math.prod(shape) != aval.size:
        raise ValueError(f"cannot reshape an array of shape {aval.shape} into shape {shape}")
    if shape == aval.shape:
        return x if isinstance(x, Tracer) else np.asarray(x)
    return bind(REGISTRY["reshape"], x if isinstance(x, Tracer) else np.asarray(x), shape=shape)


def transpose(x: Any, axes: Any = None) -> Any:
    """Permute the axes (reverse them when `axes` is None)."""
    ndim = aval_of(x).ndim
    axes = tuple(reversed(range(ndim))) if axes is None else tuple(operator.index(a) for a in axes)
    if sorted(a % builtins.max(ndim, 1) for a in axes) != list(range(ndim)) or len(axes) != ndim:
        raise ValueError(f"transpose: axes {axes} are not a permutation of {ndim} axes")
    axes = tuple(a % ndim for a in axes)
    if axes == tuple(range(ndim)):
        return x if isinstance(x, Tracer) else np.asarray(x)
    return bind(REGISTRY["transpose"], x if isinstance(x, Tracer) else np.asarray(x), axes=axes)


def swapaxes(x: Any, axis1: int, axis2: int) -> Any:
    ndim = aval_of(x).ndim
    a, b = normalize_axis(axis1, ndim)[0], normalize_axis(axis2, ndim)[0]
    axes = list(range(ndim))
    axes[a], axes[b] = axes[b], axes[a]
    return transpose(x, axes)


def broadcast_to(x: Any, shape: Any) -> Any:
    """`x` broadcast to `shape` by NumPy's rules."""
    aval = aval_of(x)
    shape = _shape_tuple(shape, "broadcast_to shape")
    if broadcast_shapes(aval.shape, shape, what="broadcast_to") != shape:
        raise ValueError(f"broadcast_to: cannot broadcast shape {aval.shape} to {shape}")
    if shape == aval.shape:
        return x if isinstance(x, Tracer) else np.asarray(x)
    return bind(
        REGISTRY["broadcast_to"],
        _lift(np.asarray(x)) if not isinstance(x, Tracer) else x,
        shape=shape,
    )


def expand_dims(x: Any, axis: Any) -> Any:
    shape = aval_of(x).shape
    axes = normalize_axis(axis, len(shape) + (1 if isinstance(axis, int) else len(axis)))
    new = list(shape)
    for a in axes:
        new.insert(a, 1)
    return reshape(x, tuple(new))


def squeeze(x: Any, axis: Any = None) -> Any:
    shape = aval_of(x).shape
    if axis is None:
        axes = tuple(i for i, d in enumerate(shape) if d == 1)
    else:
        axes = normalize_axis(axis, len(shape))
        for a in axes:
            if shape[a] != 1:
                raise ValueError(f"squeeze: axis {a} of shape {shape} has size {shape[a]}, not 1")
    return reshape(x, tuple(d for i, d in enumerate(shape) if i not in axes))


def ravel(x: Any) -> Any:
    return reshape(x, (-1,))


def concatenate(arrays: Sequence[Any], axis: int = 0) -> Any:
    """Join arrays along an existing axis."""
    arrays = list(arrays)
    if not arrays:
        raise ValueError("concatenate needs at least one array")
    avals = [aval_of(a) for a in arrays]
    ndim = avals[0].ndim
    if ndim == 0:
        raise ValueError("concatenate: zero-dimensional arrays cannot be concatenated")
    axis = normalize_axis(axis, ndim)[0]
    dtype, _ = _result_dtype(avals)
    tracing = any(isinstance(a, Tracer) for a in arrays)
    arrays = [_coerce(a, v, dtype, v.shape, tracing) for a, v in zip(arrays, avals, strict=True)]
    if len(arrays) == 1:
        return arrays[0]
    return bind(REGISTRY["concatenate"], *arrays, axis=axis)


def stack(arrays: Sequence[Any], axis: int = 0) -> Any:
    """Join arrays along a new axis."""
    arrays = list(arrays)
    if not arrays:
        raise ValueError("stack needs at least one array")
    shapes = {aval_of(a).shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"stack needs arrays of one shape, got {sorted(shapes)}")
    axis = normalize_axis(axis, aval_of(arrays[0]).ndim + 1)[0]
    return concatenate([expand_dims(a, axis) for a in arrays], axis)


def full_like(x: Any, fill_value: Any, dtype: Any = None) -> Any:
    """An array like `x` filled with `fill_value`; it does not depend on `x`'s values."""
    aval = aval_of(x)
    dtype = np.dtype(dtype) if dtype is not None else aval.dtype
    value = np.asarray(fill_value, dtype=dtype)
    if not isinstance(x, Tracer):
        return np.full(aval.shape, value, dtype=dtype)
    return broadcast_to(_lift(value), aval.shape) if aval.shape else _lift(value)


def zeros_like(x: Any, dtype: Any = None) -> Any:
    return full_like(x, 0, dtype)


def ones_like(x: Any, dtype: Any = None) -> Any:
    return full_like(x, 1, dtype)


# ---------------------------------------------------------------- products


def matmul(a: Any, b: Any) -> Any:
    """NumPy's matmul: 1-D operands are promoted to matrices, batch axes broadcast."""
    av, bv = aval_of(a), aval_of(b)
    if av.ndim == 0 or bv.ndim == 0:
        raise ValueError("matmul: operands must be at least 1-D (use multiply for scalars)")
    dtype, _ = _result_dtype([av, bv])
    tracing = isinstance(a, Tracer) or isinstance(b, Tracer)
    a = _coerce(a, av, dtype, av.shape, tracing)
    b = _coerce(b, bv, dtype, bv.shape, tracing)
    a2 = reshape(a, (1,) + av.shape) if av.ndim == 1 else a
    b2 = reshape(b, bv.shape + (1,)) if bv.ndim == 1 else b
    sa, sb = aval_of(a2).shape, aval_of(b2).shape
    if sa[-1] != sb[-2]:
        raise ValueError(
            f"matmul: shapes {av.shape} and {bv.shape} do not align: the last axis of the "
            f"first ({sa[-1]}) must equal the {'only' if bv.ndim == 1 else 'second-to-last'} "
            f"axis of the second ({sb[-2]})"
        )
    batch = broadcast_shapes(sa[:-2], sb[:-2], what="matmul batch axes")
    a2 = broadcast_to(a2, batch + sa[-2:])
    b2 = broadcast_to(b2, batch + sb[-2:])
    out = bind(REGISTRY["matmul"], a2, b2)
    shape = aval_of(out).shape
    if av.ndim == 1:
        shape = shape[:-2] + shape[-1:]
    if bv.ndim == 1:
        shape = shape[:-1]
    return reshape(out, shape)


def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    """Sum products over the given axes of `a` and `b` (NumPy's tensordot)."""
    av, bv = aval_of(a), aval_of(b)
    if isinstance(axes, int):
        axes_a, axes_b = list(range(av.ndim - axes, av.ndim)), list(range(axes))
    else:
        axes_a, axes_b = (
            ([axes[0]] if isinstance(axes[0], int) else list(axes[0])),
            ([axes[1]] if isinstance(axes[1], int) else list(axes[1])),
        )
    axes_a = [normalize_axis(x, av.ndim)[0] for x in axes_a]
    axes_b = [normalize_axis(x, bv.ndim)[0] for x in axes_b]
    if [av.shape[i] for i in axes_a] != [bv.shape[i] for i in axes_b]:
        raise ValueError(f"tensordot: shapes {av.shape} and {bv.shape} do not align on {axes}")
    free_a = [i for i in range(av.ndim) if i not in axes_a]
    free_b = [i for i in range(bv.ndim) if i not in axes_b]
    k = math.prod(av.shape[i] for i in axes_a)
    a2 = reshape(transpose(a, free_a + axes_a), (-1, k))
    b2 = reshape(transpose(b, axes_b + free_b), (k, -1))
    out_shape = tuple(av.shape[i] for i in free_a) + tuple(bv.shape[i] for i in free_b)
    return reshape(matmul(a2, b2), out_shape)


def dot(a: Any, b: Any) -> Any:
    """NumPy's dot: a product for scalars, matmul for 1-D/2-D, tensordot beyond."""
    av, bv = aval_of(a), aval_of(b)
    if av.ndim == 0 or bv.ndim == 0:
        return multiply(a, b)
    if av.ndim <= 2 and bv.ndim <= 2:
        return matmul(a, b)
    return tensordot(a, b, ([av.ndim - 1], [builtins.max(bv.ndim - 2, 0)]))


def vdot(a: Any, b: Any) -> Any:
    return sum(multiply(ravel(a), ravel(b)))


def outer(a: Any, b: Any) -> Any:
    return multiply(reshape(ravel(a), (-1, 1)), reshape(ravel(b), (1, -1)))


# ---------------------------------------------------------------- indexing


def slice_array(x: Any, index: tuple[tuple[int, int, int], ...]) -> Any:
    """`x[a:b:c, ...]` with one normalized (start, stop, step) per axis."""
    if all((a, b, c) == (0, n, 1) for (a, b, c), n in zip(index, aval_of(x).shape, strict=True)):
        return x
    return bind(REGISTRY["slice"], x, index=tuple(index))


def slice_scatter(g: Any, shape: tuple[int, ...], index: Any) -> Any:
    """Zeros of `shape` with `g` placed at the slice `index` (the VJP of slicing)."""
    return bind(REGISTRY["slice_scatter"], g, shape=tuple(shape), index=tuple(index))


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
    if not isinstance(index, tuple):
        index = (index,)
    if not isinstance(x, Tracer) and not any(isinstance(entry, Tracer) for entry in index):
        return np.asarray(x)[index]
    shape = aval_of(x).shape
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
    index = index + (slice(None),) * (
        len(shape) - builtins.sum(entry is not None for entry in index)
    )
    if any(_is_index_array(entry) for entry in index):
        return _advanced_index(x, index, shape)
    return _basic_index(x, index, shape)


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
                "fnp.where(mask, x, 0) instead, or pass the mask as a static argument"
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


def _advanced_index(x: Any, index: tuple[Any, ...], shape: tuple[int, ...]) -> Any:
    if any(entry is None for entry in index):
        raise IndexError("None (newaxis) together with integer-array indexing is not supported")
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
        arrays.append(_lift(entry))
    return gather(x, arrays, tuple(spec))
