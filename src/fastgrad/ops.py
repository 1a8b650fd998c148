"""Every primitive, each defined in one place: type rule, NumPy reference, VJP and JVP rules.

Elementwise primitives see operands of one shape and one dtype: `fastgrad.numpy` inserts
explicit `broadcast_to` and `astype` nodes first, so no rule here handles broadcasting.
VJP and JVP rules are written with `fastgrad.numpy` functions, so backward and tangent
passes are themselves graphs that can be fused and differentiated again. None is the
symbolic zero: a VJP rule returns it for an input that gets no gradient, a JVP rule gets it
for an input with no tangent (and may return it); `vjp=None` (and `jvp=None`) marks a
primitive whose output is never differentiated.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.ir import Aval, Primitive
from fastgrad.tracing import CONST

REGISTRY: dict[str, Primitive] = {"const": CONST}


class _Frontend:
    # VJP rules speak fastgrad.numpy, which itself builds on this module; it is bound on
    # first use so the import graph stays one-way at load time.
    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("fastgrad.numpy"), name)


fnp: Any = _Frontend()


def register(prim: Primitive) -> Primitive:
    assert prim.name not in REGISTRY, prim.name
    REGISTRY[prim.name] = prim
    return prim


# ---------------------------------------------------------------- elementwise


@functools.cache
def _result_dtype(ufunc: Any, dtypes: tuple[np.dtype, ...]) -> np.dtype:
    with np.errstate(all="ignore"):
        return np.asarray(ufunc(*(np.zeros((), d) for d in dtypes))).dtype


def _elementwise_eval(name: str, ufunc: Any) -> Callable[..., Aval]:
    def abstract_eval(*avals: Aval) -> Aval:
        shape = avals[0].shape
        if any(a.shape != shape for a in avals[1:]):
            raise ValueError(f"{name} needs operands of one shape, got {[a.shape for a in avals]}")
        dtype = _result_dtype(ufunc, tuple(a.dtype for a in avals))
        return Aval(shape, dtype, weak=all(a.weak for a in avals))

    return abstract_eval


_INFIX = {
    "add": "+", "subtract": "-", "multiply": "*", "divide": "/", "power": "**",
    "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
    "equal": "==", "not_equal": "!=", "logical_and": "&", "logical_or": "|",
}  # fmt: skip


def _format_infix(symbol: str) -> Callable[[list[str], dict[str, Any]], str]:
    return lambda args, params: f"{args[0]} {symbol} {args[1]}"


def elementwise(
    name: str,
    ufunc: Any,
    vjp: Callable[..., Any] | None,
    domain: tuple[str, ...] = (),
    impl: Callable[..., Any] | None = None,
    loop: str | None = None,
    jvp: Callable[..., Any] | None = None,
) -> Primitive:
    fmt = None
    if name in _INFIX:
        fmt = _format_infix(_INFIX[name])
    elif name == "negative":
        fmt = lambda args, params: f"-{args[0]}"  # noqa: E731
    return register(
        Primitive(
            name,
            _elementwise_eval(name, ufunc),
            impl or ufunc,
            vjp,
            jvp,
            kind="elementwise",
            domain=domain,
            format=fmt,
            ufunc=ufunc,
            loop=loop or f"call:{name}",
        )
    )


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Two forms, each exact on its side of 0, so neither overflows.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def _tangent_sum(tangents: Any, *parts: Callable[[Any], Any]) -> Any:
    """The sum over inputs with a tangent t_i of parts[i](t_i): a JVP is linear in the
    tangents, and an input without one (None) adds no term. None if no term is left."""
    total = None
    for t, part in zip(tangents, parts, strict=True):
        if t is not None:
            total = part(t) if total is None else total + part(t)
    return total


# Unary float functions: d/dx, written with the output `out` where that is cheaper. The VJP
# (first line) scales the cotangent `g` by it, the JVP (second line) the tangent `t[0]`,
# never None for an op with one input.
# fmt: off
elementwise("negative", np.negative, lambda g, out, x: (-g,), loop="-{0}",
            jvp=lambda t, out, x: -t[0])
elementwise("exp", np.exp, lambda g, out, x: (g * out,),
            jvp=lambda t, out, x: t[0] * out)
elementwise("exp2", np.exp2, lambda g, out, x: (g * out * math.log(2),),
            jvp=lambda t, out, x: t[0] * out * math.log(2))
elementwise("expm1", np.expm1, lambda g, out, x: (g * (out + 1),),
            jvp=lambda t, out, x: t[0] * (out + 1))
elementwise("log", np.log, lambda g, out, x: (g / x,), ("positive",),
            jvp=lambda t, out, x: t[0] / x)
elementwise("log2", np.log2, lambda g, out, x: (g / (x * math.log(2)),), ("positive",),
            jvp=lambda t, out, x: t[0] / (x * math.log(2)))
elementwise("log10", np.log10, lambda g, out, x: (g / (x * math.log(10)),), ("positive",),
            jvp=lambda t, out, x: t[0] / (x * math.log(10)))
elementwise("log1p", np.log1p, lambda g, out, x: (g / (x + 1),), ("above_minus_one",),
            jvp=lambda t, out, x: t[0] / (x + 1))
elementwise("sqrt", np.sqrt, lambda g, out, x: (g / (out * 2),), ("positive",),
            jvp=lambda t, out, x: t[0] / (out * 2))
elementwise("cbrt", np.cbrt, lambda g, out, x: (g / (out * out * 3),), ("nonzero",),
            jvp=lambda t, out, x: t[0] / (out * out * 3))
elementwise("square", np.square, lambda g, out, x: (g * x * 2,), loop="{0} * {0}",
            jvp=lambda t, out, x: t[0] * x * 2)
elementwise("reciprocal", np.reciprocal, lambda g, out, x: (-g * out * out,), ("nonzero",),
            loop="{T}(1) / {0}",
            jvp=lambda t, out, x: -t[0] * out * out)
elementwise("abs", np.abs, lambda g, out, x: (g * fnp.sign(x),), ("nonzero",),
            jvp=lambda t, out, x: t[0] * fnp.sign(x))
elementwise("sin", np.sin, lambda g, out, x: (g * fnp.cos(x),),
            jvp=lambda t, out, x: t[0] * fnp.cos(x))
elementwise("cos", np.cos, lambda g, out, x: (-g * fnp.sin(x),),
            jvp=lambda t, out, x: -t[0] * fnp.sin(x))
elementwise("tan", np.tan, lambda g, out, x: (g * (out * out + 1),), ("unit",),
            jvp=lambda t, out, x: t[0] * (out * out + 1))
elementwise("arcsin", np.arcsin, lambda g, out, x: (g / fnp.sqrt(1 - x * x),), ("unit",),
            jvp=lambda t, out, x: t[0] / fnp.sqrt(1 - x * x))
elementwise("arccos", np.arccos, lambda g, out, x: (-g / fnp.sqrt(1 - x * x),), ("unit",),
            jvp=lambda t, out, x: -t[0] / fnp.sqrt(1 - x * x))
elementwise("arctan", np.arctan, lambda g, out, x: (g / (x * x + 1),),
            jvp=lambda t, out, x: t[0] / (x * x + 1))
elementwise("sinh", np.sinh, lambda g, out, x: (g * fnp.cosh(x),),
            jvp=lambda t, out, x: t[0] * fnp.cosh(x))
elementwise("cosh", np.cosh, lambda g, out, x: (g * fnp.sinh(x),),
            jvp=lambda t, out, x: t[0] * fnp.sinh(x))
elementwise("tanh", np.tanh, lambda g, out, x: (g * (1 - out * out),),
            jvp=lambda t, out, x: t[0] * (1 - out * out))
elementwise("arcsinh", np.arcsinh, lambda g, out, x: (g / fnp.sqrt(x * x + 1),),
            jvp=lambda t, out, x: t[0] / fnp.sqrt(x * x + 1))
elementwise("arccosh", np.arccosh, lambda g, out, x: (g / fnp.sqrt(x * x - 1),), ("above_one",),
            jvp=lambda t, out, x: t[0] / fnp.sqrt(x * x - 1))
elementwise("arctanh", np.arctanh, lambda g, out, x: (g / (1 - x * x),), ("unit",),
            jvp=lambda t, out, x: t[0] / (1 - x * x))
elementwise("sigmoid", np.exp, lambda g, out, x: (g * out * (1 - out),), impl=_sigmoid,
            jvp=lambda t, out, x: t[0] * out * (1 - out))
# fmt: on

# Piecewise-constant functions: their derivative is zero wherever it exists.
_zero = lambda g, out, *xs: (None,) * len(xs)  # noqa: E731
_zero_jvp = lambda t, out, *xs: None  # noqa: E731
elementwise("sign", np.sign, _zero, loop="{T}({0} > 0) - {T}({0} < 0) if {0} == {0} else {0}",
            jvp=_zero_jvp)  # fmt: skip
elementwise("floor", np.floor, _zero, jvp=_zero_jvp)
elementwise("ceil", np.ceil, _zero, jvp=_zero_jvp)
elementwise("rint", np.rint, _zero, jvp=_zero_jvp)

# Predicates and logic give booleans, never differentiated.
elementwise("isnan", np.isnan, None, loop="{0} != {0}")
elementwise("isinf", np.isinf, None)
elementwise("isfinite", np.isfinite, None)
elementwise("logical_not", np.logical_not, None, loop="not {0}")
for _name, _symbol in (
    ("less", "<"), ("less_equal", "<="), ("greater", ">"),
    ("greater_equal", ">="), ("equal", "=="), ("not_equal", "!="),
):  # fmt: skip
    elementwise(_name, getattr(np, _name), None, loop=f"{{0}} {_symbol} {{1}}")
elementwise("logical_and", np.logical_and, None, loop="({0} != 0) & ({1} != 0)")
elementwise("logical_or", np.logical_or, None, loop="({0} != 0) | ({1} != 0)")
elementwise("logical_xor", np.logical_xor, None, loop="({0} != 0) != ({1} != 0)")


def _tie_weight(a: Any, b: Any) -> Any:
    # JAX's rule: where a == b the cotangent is split equally between the two operands.
    return fnp.where(a > b, 1.0, fnp.where(a == b, 0.5, 0.0)).astype(a.dtype)


def _power_vjp(g: Any, out: Any, x: Any, y: Any) -> tuple[Any, Any]:
    # Follows JAX at the edges: d/dx is 0 at x == y == 0 (not 0 * inf), d/dy is 0 where
    # x == 0. Elsewhere the plain formula, so that second derivatives stay exact.
    gx = g * fnp.where((x == 0) & (y == 0), 0.0, y * fnp.power(x, y - 1))
    gy = g * out * fnp.log(fnp.where(x == 0, 1.0, x))
    return gx, gy


def _power_jvp(t: Any, out: Any, x: Any, y: Any) -> Any:
    # The same partial derivatives as _power_vjp, with the same edges.
    return _tangent_sum(
        t,
        lambda tx: tx * fnp.where((x == 0) & (y == 0), 0.0, y * fnp.power(x, y - 1)),
        lambda ty: ty * out * fnp.log(fnp.where(x == 0, 1.0, x)),
    )


# Binary. A JVP sums one term per input that has a tangent (see _tangent_sum).
# fmt: off
elementwise("add", np.add, lambda g, out, x, y: (g, g), loop="{0} + {1}",
            jvp=lambda t, out, x, y: _tangent_sum(t, lambda tx: tx, lambda ty: ty))
elementwise("subtract", np.subtract, lambda g, out, x, y: (g, -g), loop="{0} - {1}",
            jvp=lambda t, out, x, y: _tangent_sum(t, lambda tx: tx, lambda ty: -ty))
elementwise("multiply", np.multiply, lambda g, out, x, y: (g * y, g * x), loop="{0} * {1}",
            jvp=lambda t, out, x, y: _tangent_sum(t, lambda tx: tx * y, lambda ty: x * ty))
elementwise("divide", np.divide, lambda g, out, x, y: (g / y, -g * out / y), ("real", "nonzero"),
            loop="{0} / {1}",
            jvp=lambda t, out, x, y: _tangent_sum(t, lambda tx: tx / y, lambda ty: -ty * out / y))
elementwise("power", np.power, _power_vjp, ("positive", "real"), loop="{0} ** {1}",
            jvp=_power_jvp)
elementwise("maximum", np.maximum,
            lambda g, out, x, y: (g * _tie_weight(x, y), g * _tie_weight(y, x)),
            jvp=lambda t, out, x, y: _tangent_sum(t, lambda tx: tx * _tie_weight(x, y),
                                                  lambda ty: ty * _tie_weight(y, x)))
elementwise("minimum", np.minimum,
            lambda g, out, x, y: (g * _tie_weight(y, x), g * _tie_weight(x, y)),
            jvp=lambda t, out, x, y: _tangent_sum(t, lambda tx: tx * _tie_weight(y, x),
                                                  lambda ty: ty * _tie_weight(x, y)))
elementwise("arctan2", np.arctan2,
            lambda g, out, y, x: (g * x / (x * x + y * y), -g * y / (x * x + y * y)),
            ("real", "positive"),  # away from the branch cut along x < 0
            jvp=lambda t, out, y, x: _tangent_sum(t, lambda ty: ty * x / (x * x + y * y),
                                                  lambda tx: -tx * y / (x * x + y * y)))
# fmt: on


def _where_eval(c: Aval, x: Aval, y: Aval) -> Aval:
    if not (c.shape == x.shape == y.shape):
        raise ValueError(f"where needs operands of one shape, got {c.shape}, {x.shape}, {y.shape}")
    if c.dtype != np.bool_ or x.dtype != y.dtype:
        raise TypeError(f"where needs a bool condition and equal dtypes, got {c}, {x}, {y}")
    return Aval(x.shape, x.dtype, weak=x.weak and y.weak)


register(
    Primitive(
        "where",
        _where_eval,
        np.where,
        lambda g, out, c, x, y: (None, fnp.where(c, g, 0.0), fnp.where(c, 0.0, g)),
        # The condition is boolean, so only the branches carry tangents.
        lambda t, out, c, x, y: fnp.where(
            c, 0.0 if t[1] is None else t[1], 0.0 if t[2] is None else t[2]
        ),
        kind="elementwise",
        domain=("bool", "real", "real"),
        ufunc=np.where,
        loop="{1} if {0} else {2}",
    )
)


def _astype_eval(x: Aval, *, dtype: np.dtype) -> Aval:
    return Aval(x.shape, dtype)


def _astype_vjp(g: Any, out: Any, x: Any, *, dtype: np.dtype) -> tuple[Any]:
    return (fnp.astype(g, x.dtype) if x.dtype.kind == "f" else None,)


def _astype_jvp(t: Any, out: Any, x: Any, *, dtype: np.dtype) -> Any:
    return fnp.astype(t[0], dtype) if dtype.kind == "f" else None


register(
    Primitive(
        "astype",
        _astype_eval,
        lambda x, *, dtype: x.astype(dtype),
        _astype_vjp,
        _astype_jvp,
        kind="elementwise",
        format=lambda args, params: f"{args[0]}.astype({params['dtype'].name})",
        loop="{T}({0})",
    )
)


def _stop_gradient_format(args: list[str], params: dict[str, Any]) -> str:
    name = params.get("name")
    return f"stop_gradient({args[0]}" + (f", name={name!r})" if name else ")")


STOP_GRADIENT = register(
    Primitive(
        "stop_gradient",
        lambda x, *, name=None: x,
        lambda x, *, name=None: x,
        lambda g, out, x, *, name=None: (None,),
        # No tangent either: inside fg.jvp a stop_gradient'ed value is a constant, as in JAX.
        lambda t, out, x, *, name=None: None,
        kind="elementwise",
        format=_stop_gradient_format,
        loop="{0}",
    )
)

# ---------------------------------------------------------------- reductions


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
        g = fnp.reshape(g, tuple(1 if i in axis else d for i, d in enumerate(shape)))
    return fnp.broadcast_to(g, shape)


def _sum_vjp(g: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> tuple[Any]:
    return (_unreduce(g, x.shape, axis, keepdims),)


def _sum_jvp(t: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    return fnp.sum(t[0], axis=axis, keepdims=keepdims)


def _extremum_vjp(g: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    # Ties share the cotangent equally, as in JAX.
    hit = (x == _unreduce(out, x.shape, axis, keepdims)).astype(x.dtype)
    count = fnp.sum(hit, axis=axis, keepdims=True)
    return (hit * _unreduce(g, x.shape, axis, keepdims) / fnp.broadcast_to(count, x.shape),)


def _extremum_jvp(t: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    # The mean of the tangents at the tied extrema: the transpose of _extremum_vjp.
    hit = (x == _unreduce(out, x.shape, axis, keepdims)).astype(x.dtype)
    count = fnp.sum(hit, axis=axis, keepdims=keepdims)
    return fnp.sum(hit * t[0], axis=axis, keepdims=keepdims) / count


def _prod_others(x: Any, axis: tuple[int, ...]) -> Any:
    """For each element of `x`, the product of the other elements of its slice along `axis`.

    out / x fails where x has zeros. The product of the other elements is: out / x with no
    zero in the slice; the product of the nonzeros at the single zero; 0 otherwise. Exact to
    first order everywhere; its own derivative is exact away from zeros only
    (test_reductions_on_random_shapes_and_axes).
    """
    is_zero = x == 0
    zeros = _unreduce(fnp.sum(is_zero, axis=axis, keepdims=True), x.shape, axis, True)
    nonzero_prod = fnp.prod(fnp.where(is_zero, 1.0, x), axis=axis, keepdims=True)
    nonzero_prod = _unreduce(nonzero_prod, x.shape, axis, True)
    return fnp.where(
        zeros == 0,
        nonzero_prod / fnp.where(is_zero, 1.0, x),
        fnp.where((zeros == 1) & is_zero, nonzero_prod, 0.0),
    )


def _prod_vjp(g: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    return (_unreduce(g, x.shape, axis, keepdims) * _prod_others(x, axis),)


def _prod_jvp(t: Any, out: Any, x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
    return fnp.sum(t[0] * _prod_others(x, axis), axis=axis, keepdims=keepdims)


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

# ---------------------------------------------------------------- structure


def _broadcast_eval(x: Aval, *, shape: tuple[int, ...]) -> Aval:
    lead = len(shape) - x.ndim
    if lead < 0 or any(d not in (1, shape[lead + i]) for i, d in enumerate(x.shape)):
        raise ValueError(f"cannot broadcast shape {x.shape} to {shape}")
    return Aval(tuple(shape), x.dtype, x.weak)


def _broadcast_vjp(g: Any, out: Any, x: Any, *, shape: tuple[int, ...]) -> tuple[Any]:
    # Broadcasting copies; its VJP sums the copies back: over new leading axes and over axes
    # that were stretched from 1.
    lead = len(shape) - x.ndim
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(x.shape) if d == 1 and shape[lead + i] != 1
    )
    if axes:
        g = fnp.sum(g, axis=axes, keepdims=True)
    return (fnp.reshape(g, x.shape),)


register(
    Primitive(
        "broadcast_to",
        _broadcast_eval,
        lambda x, *, shape: np.broadcast_to(x, shape),
        _broadcast_vjp,
        lambda t, out, x, *, shape: fnp.broadcast_to(t[0], shape),
        kind="structural",
    )
)


def _reshape_eval(x: Aval, *, shape: tuple[int, ...]) -> Aval:
    if math.prod(shape) != x.size:
        raise ValueError(f"cannot reshape an array of shape {x.shape} into shape {shape}")
    return Aval(tuple(shape), x.dtype, x.weak)


register(
    Primitive(
        "reshape",
        _reshape_eval,
        lambda x, *, shape: np.reshape(x, shape),
        lambda g, out, x, *, shape: (fnp.reshape(g, x.shape),),
        lambda t, out, x, *, shape: fnp.reshape(t[0], shape),
        kind="structural",
    )
)


def _transpose_eval(x: Aval, *, axes: tuple[int, ...]) -> Aval:
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"axes {axes} are not a permutation of the {x.ndim} axes of {x.shape}")
    return Aval(tuple(x.shape[a] for a in axes), x.dtype, x.weak)


register(
    Primitive(
        "transpose",
        _transpose_eval,
        lambda x, *, axes: np.transpose(x, axes),
        lambda g, out, x, *, axes: (fnp.transpose(g, tuple(np.argsort(axes).tolist())),),
        lambda t, out, x, *, axes: fnp.transpose(t[0], axes),
        kind="structural",
    )
)


# Basic slicing: `index` holds one (start, stop, step) per axis, normalized by slice.indices.
def _as_slices(index: tuple[tuple[int, int, int], ...]) -> tuple[slice, ...]:
    # A negative stop from slice.indices means "run past index 0", which a slice spells None.
    return tuple(slice(a, b if b >= 0 else None, c) for a, b, c in index)


def _slice_shape(index: tuple[tuple[int, int, int], ...]) -> tuple[int, ...]:
    return tuple(len(range(a, b, c)) for a, b, c in index)


def format_slice(a: int, b: int, c: int) -> str:
    return f"{a}:{b if b >= 0 else ''}" + (f":{c}" if c != 1 else "")


def _slice_eval(x: Aval, *, index: tuple[tuple[int, int, int], ...]) -> Aval:
    if len(index) != x.ndim:
        raise ValueError(f"slice index {index} does not match shape {x.shape}")
    return Aval(_slice_shape(index), x.dtype, x.weak)


def _slice_scatter_impl(g: np.ndarray, *, shape: tuple[int, ...], index: Any) -> np.ndarray:
    out = np.zeros(shape, g.dtype)
    out[_as_slices(index)] = g
    return out


def _slice_scatter_eval(g: Aval, *, shape: tuple[int, ...], index: Any) -> Aval:
    if _slice_shape(index) != g.shape:
        raise ValueError(f"slice_scatter: {g.shape} does not fit slice {index} of {shape}")
    return Aval(tuple(shape), g.dtype, g.weak)


SLICE = register(
    Primitive(
        "slice",
        _slice_eval,
        lambda x, *, index: x[_as_slices(index)],
        lambda g, out, x, *, index: (fnp.slice_scatter(g, x.shape, index),),
        lambda t, out, x, *, index: fnp.slice_array(t[0], index),
        kind="structural",
        format=lambda args, params: (
            f"{args[0]}[{', '.join(format_slice(*t) for t in params['index'])}]"
        ),
    )
)
register(
    Primitive(
        "slice_scatter",
        _slice_scatter_eval,
        _slice_scatter_impl,
        lambda g, out, x, *, shape, index: (fnp.slice_array(g, index),),
        lambda t, out, x, *, shape, index: fnp.slice_scatter(t[0], shape, index),
        kind="structural",
    )
)


# Integer-array indexing: `index` holds ("slice", start, stop, step) or ("array", k) per
# leading axis (k numbers the index-array operands); NumPy's placement rule decides where
# the broadcast index dimensions go.
def _index_tuple(index: Any, arrays: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        arrays[e[1]] if e[0] == "array" else slice(e[1], e[2] if e[2] >= 0 else None, e[3])
        for e in index
    )


def gather_shape(x_shape: tuple[int, ...], index: Any, idx_shapes: list[tuple[int, ...]]) -> Any:
    try:
        bshape = np.broadcast_shapes(*idx_shapes)
    except ValueError:
        raise IndexError(
            f"index arrays of shapes {idx_shapes} cannot be broadcast together"
        ) from None
    positions = [i for i, e in enumerate(index) if e[0] == "array"]
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    sliced = [(i, len(range(e[1], e[2], e[3]))) for i, e in enumerate(index) if e[0] == "slice"] + [
        (i, d) for i, d in enumerate(x_shape) if i >= len(index)
    ]
    if adjacent:
        before = [d for i, d in sliced if i < positions[0]]
        after = [d for i, d in sliced if i > positions[-1]]
        return tuple(before) + tuple(bshape) + tuple(after)
    return tuple(bshape) + tuple(d for _, d in sliced)


def _gather_eval(x: Aval, *idx: Aval, index: Any) -> Aval:
    for a in idx:
        if a.dtype.kind not in "iu":
            raise IndexError(f"index arrays must be integers, got {a}")
    return Aval(gather_shape(x.shape, index, [a.shape for a in idx]), x.dtype, x.weak)


def _scatter_add_impl(g: np.ndarray, *idx: np.ndarray, shape: Any, index: Any) -> np.ndarray:
    out = np.zeros(shape, g.dtype)
    np.add.at(out, _index_tuple(index, idx), g)
    return out


def _scatter_add_eval(g: Aval, *idx: Aval, shape: Any, index: Any) -> Aval:
    expected = gather_shape(tuple(shape), index, [a.shape for a in idx])
    if expected != g.shape:
        raise ValueError(f"scatter_add: cotangent {g.shape} does not match gather {expected}")
    return Aval(tuple(shape), g.dtype, g.weak)


def _format_gather(args: list[str], params: dict[str, Any]) -> str:
    parts = []
    for e in params["index"]:
        if e[0] == "array":
            parts.append(args[1 + e[1]])
        else:
            parts.append(format_slice(*e[1:]))
    return f"{args[0]}[{', '.join(parts)}]"


register(
    Primitive(
        "gather",
        _gather_eval,
        lambda x, *idx, index: x[_index_tuple(index, idx)],
        lambda g, out, x, *idx, index: (
            fnp.scatter_add(g, idx, x.shape, index),
            *(None for _ in idx),
        ),
        # Index arrays are integers: only the gathered operand has a tangent.
        lambda t, out, x, *idx, index: fnp.gather(t[0], idx, index),
        kind="other",
        format=_format_gather,
    )
)
register(
    Primitive(
        "scatter_add",
        _scatter_add_eval,
        _scatter_add_impl,
        lambda g, out, x, *idx, shape, index: (
            fnp.gather(g, idx, index),
            *(None for _ in idx),
        ),
        lambda t, out, x, *idx, shape, index: fnp.scatter_add(t[0], idx, shape, index),
        kind="other",
    )
)


def _concat_eval(*xs: Aval, axis: int) -> Aval:
    first = xs[0]
    for x in xs[1:]:
        if x.ndim != first.ndim or any(
            a != b for i, (a, b) in enumerate(zip(x.shape, first.shape, strict=True)) if i != axis
        ):
            raise ValueError(
                f"concatenate needs equal shapes except along axis {axis}, got "
                f"{[v.shape for v in xs]}"
            )
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return Aval(tuple(shape), first.dtype, all(x.weak for x in xs))


def _concat_vjp(g: Any, out: Any, *xs: Any, axis: int) -> tuple[Any, ...]:
    grads, start = [], 0
    for x in xs:
        stop = start + x.shape[axis]
        index = tuple((start, stop, 1) if i == axis else (0, d, 1) for i, d in enumerate(x.shape))
        grads.append(fnp.slice_array(g, index))
        start = stop
    return tuple(grads)


def _concat_jvp(t: Any, out: Any, *xs: Any, axis: int) -> Any:
    # A zero tangent must take its place here: the pieces that have one sit beside it.
    return fnp.concatenate(
        [fnp.zeros_like(x) if tx is None else tx for tx, x in zip(t, xs, strict=True)], axis
    )


register(
    Primitive(
        "concatenate",
        _concat_eval,
        lambda *xs, axis: np.concatenate(xs, axis=axis),
        _concat_vjp,
        _concat_jvp,
        kind="structural",
    )
)


def _matmul_eval(a: Aval, b: Aval) -> Aval:
    if a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul needs equal dtypes, got {a.dtype} and {b.dtype}")
    return Aval(a.shape[:-1] + b.shape[-1:], a.dtype, a.weak and b.weak)


def _swap_last(x: Any) -> Any:
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return fnp.transpose(x, axes)


register(
    Primitive(
        "matmul",
        _matmul_eval,
        np.matmul,
        lambda g, out, a, b: (fnp.matmul(g, _swap_last(b)), fnp.matmul(_swap_last(a), g)),
        lambda t, out, a, b: _tangent_sum(
            t, lambda ta: fnp.matmul(ta, b), lambda tb: fnp.matmul(a, tb)
        ),
        kind="other",
        format=_format_infix("@"),
    )
)
