"""Elementwise arithmetic, comparisons, logic and selection: records and functions.

Records are built by fastgrad.ops.ufunc_records.elementwise, as are the transcendental
functions of fastgrad.ops.math. VJP rules scale the cotangent `g`, JVP rules the tangents
`t` (None where an input has none; see base.tangent_sum).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import REGISTRY, Primitive, at, points, register
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.ops.base import (
    apply_elementwise,
    astype,
    batch_stacked,
    broadcast_shapes,
    coerce,
    promote,
    tangent_sum,
)
from fastgrad.ops.ufunc_records import elementwise

__all__ = [
    "abs", "absolute", "add", "astype", "ceil", "clip", "divide",
    "equal", "floor", "greater", "greater_equal", "isfinite", "isinf", "isnan", "less",
    "less_equal", "logical_and", "logical_not", "logical_or", "logical_xor", "maximum",
    "minimum", "multiply", "negative", "not_equal", "reciprocal", "relu", "rint", "sign",
    "square", "stop_gradient", "subtract", "true_divide", "where",
]  # fmt: skip

# ---------------------------------------------------------------- records

# Special points (see core.primitive.Point): where each op is checked at orders 1 to 3
# against an arbitrary-precision oracle (tests/test_special_points.py). A point with a
# `convention` is a kink, tie or jump: its derivative is the row of docs/conventions.md.
inf, nan = math.inf, math.nan
_NONFINITE = (inf, -inf, nan)
_UNARY_BOOL = points(0.0, -0.0, 1.5, *_NONFINITE)
_BINARY_BOOL = points((1.0, 1.0), (1.0, 2.0), (0.0, -0.0), (nan, nan), (inf, inf), (nan, 1.0))


# fmt: off
elementwise("negative", np.negative, lambda g, out, x: (-g,), loop="-{0}",
            jvp=lambda t, out, x: -t[0],
            special_points=points(0.0, -0.0, 1.5, 1e308, *_NONFINITE))
elementwise("square", np.square, lambda g, out, x: (g * x * 2,), loop="{0} * {0}",
            jvp=lambda t, out, x: t[0] * x * 2,
            special_points=points(0.0, -1.5, 1e20, 1e200, 1e-300, *_NONFINITE))
elementwise("reciprocal", np.reciprocal, lambda g, out, x: (-g * out * out,), ("nonzero",),
            loop="{T}(1) / {0}",
            jvp=lambda t, out, x: -t[0] * out * out,
            special_points=points(0.0, -0.0, 2.0, -0.5, 1e-310, 1e300, *_NONFINITE))
# abs'(0) = 0 = sign(0): see docs/conventions.md (JAX takes 1 there).
elementwise("abs", np.abs, lambda g, out, x: (g * sign(x),), ("nonzero",),
            jvp=lambda t, out, x: t[0] * sign(x),
            special_points=points(at(0.0, convention="abs-at-zero"),
                                  at(-0.0, convention="abs-at-zero"), 1.5, -1.5, *_NONFINITE))
# fmt: on

# Piecewise-constant functions: their derivative is zero wherever it exists, and taken as
# zero at their jumps (a symbolic zero: no gradient flows through them).
_zero = lambda g, out, *xs: (None,) * len(xs)  # noqa: E731
_zero_jvp = lambda t, out, *xs: None  # noqa: E731
_jump = functools.partial(at, convention="piecewise-constant")
elementwise("sign", np.sign, _zero, loop="{T}({0} > 0) - {T}({0} < 0) if {0} == {0} else {0}",
            jvp=_zero_jvp,
            special_points=points(_jump(0.0), _jump(-0.0), 1.5, -2.0, *_NONFINITE))  # fmt: skip
# fmt: off
elementwise("floor", np.floor, _zero, jvp=_zero_jvp,
            special_points=points(_jump(2.0), _jump(-0.0), 1.3, -1.3, *_NONFINITE))
elementwise("ceil", np.ceil, _zero, jvp=_zero_jvp,
            special_points=points(_jump(2.0), _jump(0.0), 1.3, -1.3, *_NONFINITE))
elementwise("rint", np.rint, _zero, jvp=_zero_jvp,
            special_points=points(_jump(2.5), _jump(-0.5), 2.0, 1.3, *_NONFINITE))
# fmt: on

# Predicates and logic give booleans, never differentiated: their points check values.
elementwise("isnan", np.isnan, None, loop="{0} != {0}", special_points=_UNARY_BOOL)
elementwise("isinf", np.isinf, None, special_points=_UNARY_BOOL)
elementwise("isfinite", np.isfinite, None, special_points=_UNARY_BOOL)
elementwise("logical_not", np.logical_not, None, loop="not {0}", special_points=_UNARY_BOOL)
for _name, _symbol in (
    ("less", "<"), ("less_equal", "<="), ("greater", ">"),
    ("greater_equal", ">="), ("equal", "=="), ("not_equal", "!="),
):  # fmt: skip
    elementwise(_name, getattr(np, _name), None, loop=f"{{0}} {_symbol} {{1}}",
                special_points=_BINARY_BOOL)  # fmt: skip
# fmt: off
elementwise("logical_and", np.logical_and, None, loop="({0} != 0) & ({1} != 0)",
            special_points=_BINARY_BOOL)
elementwise("logical_or", np.logical_or, None, loop="({0} != 0) | ({1} != 0)",
            special_points=_BINARY_BOOL)
elementwise("logical_xor", np.logical_xor, None, loop="({0} != 0) != ({1} != 0)",
            special_points=_BINARY_BOOL)
# fmt: on


def _tie_weight(a: Any, b: Any) -> Any:
    """d maximum(a, b) / da: 1 where a > b, 0 where a < b, and, as in JAX, 0.5 at a tie
    (the cotangent is split equally). nan where either is nan: maximum's value there is nan
    whatever the other operand, so it has no derivative."""
    w = where(a > b, 1.0, where(a < b, 0.0, where(a == b, 0.5, math.nan)))
    return w.astype(a.dtype)


_TIES = tuple(
    at(x, y, convention="maximum-minimum-ties")
    for x, y in ((1.0, 1.0), (0.0, -0.0), (inf, inf), (-inf, -inf))
)
_MAXMIN_POINTS = _TIES + points((1.0, 2.0), (2.0, 1.0), (inf, 1.0), (-inf, 1.0), (nan, 1.0),
                                (1.0, nan), (nan, nan))  # fmt: skip


# Binary. A JVP sums one term per input that has a tangent (see tangent_sum).
_ARITHMETIC_POINTS = points((1.0, 2.0), (0.0, -0.0), (inf, inf), (inf, -inf), (-inf, 1.0),
                            (1e308, 1e308), (1e20, 1e20), (nan, 1.0), (1.0, nan))  # fmt: skip
# fmt: off
elementwise("add", np.add, lambda g, out, x, y: (g, g), loop="{0} + {1}",
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx, lambda ty: ty),
            special_points=_ARITHMETIC_POINTS)
elementwise("subtract", np.subtract, lambda g, out, x, y: (g, -g), loop="{0} - {1}",
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx, lambda ty: -ty),
            special_points=_ARITHMETIC_POINTS)
elementwise("multiply", np.multiply, lambda g, out, x, y: (g * y, g * x), loop="{0} * {1}",
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx * y, lambda ty: x * ty),
            special_points=_ARITHMETIC_POINTS + points((0.0, 0.0), (0.0, inf), (1e200, 1e200),
                                                       (1e-200, 1e-200), (2.0, -3.0)))
elementwise("divide", np.divide, lambda g, out, x, y: (g / y, -g * out / y), ("real", "nonzero"),
            loop="{0} / {1}",
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx / y, lambda ty: -ty * out / y),
            special_points=_ARITHMETIC_POINTS + points((1.0, 0.0), (0.0, 0.0), (-1.0, -0.0),
                                                       (1.0, inf), (inf, 2.0), (1e300, 1e-300),
                                                       (1e-300, 1e300), (3.0, -4.0)))
elementwise("maximum", np.maximum,
            lambda g, out, x, y: (g * _tie_weight(x, y), g * _tie_weight(y, x)),
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx * _tie_weight(x, y),
                                                  lambda ty: ty * _tie_weight(y, x)),
            special_points=_MAXMIN_POINTS)
elementwise("minimum", np.minimum,
            lambda g, out, x, y: (g * _tie_weight(y, x), g * _tie_weight(x, y)),
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx * _tie_weight(y, x),
                                                  lambda ty: ty * _tie_weight(x, y)),
            special_points=_MAXMIN_POINTS)
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
        lambda g, out, c, x, y: (None, where(c, g, 0.0), where(c, 0.0, g)),
        # The condition is boolean, so only the branches carry tangents.
        lambda t, out, c, x, y: where(
            c, 0.0 if t[1] is None else t[1], 0.0 if t[2] is None else t[2]
        ),
        batch_stacked("where"),
        kind="elementwise",
        domain=("bool", "real", "real"),
        ufunc=np.where,
        loop="{1} if {0} else {2}",
        # The selected operand's derivative is 1, even where it is nan or inf.
        special_points=(
            at(True, 1.5, -2.0),
            at(False, 1.5, -2.0),
            at(True, 1.5, nan),
            at(False, 1.5, inf),
            at(True, nan, 1.0, convention="where"),
            at(False, 1.0, -inf, convention="where"),
        ),
    )
)


def _astype_eval(x: Aval, *, dtype: np.dtype) -> Aval:
    return Aval(x.shape, dtype)


def _astype_vjp(g: Any, out: Any, x: Any, *, dtype: np.dtype) -> tuple[Any]:
    return (astype(g, x.dtype) if x.dtype.kind == "f" else None,)


def _astype_jvp(t: Any, out: Any, x: Any, *, dtype: np.dtype) -> Any:
    return astype(t[0], dtype) if dtype.kind == "f" else None


register(
    Primitive(
        "astype",
        _astype_eval,
        lambda x, *, dtype: x.astype(dtype),
        _astype_vjp,
        _astype_jvp,
        batch_stacked("astype"),
        kind="elementwise",
        format=lambda args, params: f"{args[0]}.astype({params['dtype'].name})",
        loop="{T}({0})",
        special_points=(
            *(at(x, dtype=np.dtype(np.float64)) for x in (0.5, 1e-30, *_NONFINITE)),
            # Rounding to float32 is taken as the identity, so its derivative is 1.
            *(at(x, dtype=np.dtype(np.float32)) for x in (0.5, 0.1, 1e39, *_NONFINITE)),
            *(at(x, dtype=np.dtype(np.int64)) for x in (2.7, -2.7)),
            at(0.5, dtype=np.dtype(np.bool_)),
        ),
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
        batch_stacked("stop_gradient"),
        kind="elementwise",
        format=_stop_gradient_format,
        loop="{0}",
        special_points=tuple(at(x, convention="stop-gradient") for x in (0.0, 1.5, *_NONFINITE)),
    )
)


# ---------------------------------------------------------------- functions
# One function per primitive, named as in NumPy.


def negative(x: Any) -> Any:
    """Elementwise ``numpy.negative``.

    >>> negative(np.array([1.0, -2.0])), fg.grad(negative)(1.0)
    (array([-1.,  2.]), array(-1.))
    """
    return apply_elementwise("negative", x)


def square(x: Any) -> Any:
    """Elementwise ``numpy.square``.

    >>> square(np.array([2.0, -3.0])), fg.grad(square)(3.0)
    (array([4., 9.]), array(6.))
    """
    return apply_elementwise("square", x)


def reciprocal(x: Any) -> Any:
    """Elementwise ``numpy.reciprocal``.

    >>> reciprocal(np.array([2.0, 0.5])), fg.grad(reciprocal)(2.0)
    (array([0.5, 2. ]), array(-0.25))
    """
    return apply_elementwise("reciprocal", x)


def abs(x: Any) -> Any:
    """Elementwise ``numpy.abs``.

    >>> abs(np.array([-1.5, 2.0])), fg.grad(abs)(-1.5), fg.grad(abs)(0.0)  # 0 at the kink
    (array([1.5, 2. ]), array(-1.), array(0.))
    """
    return apply_elementwise("abs", x)


def sign(x: Any) -> Any:
    """Elementwise ``numpy.sign``.

    >>> sign(np.array([-2.0, 0.0, 3.0])), fg.grad(sign)(3.0)
    (array([-1.,  0.,  1.]), array(0.))
    """
    return apply_elementwise("sign", x)


def floor(x: Any) -> Any:
    """Elementwise ``numpy.floor``.

    >>> floor(np.array([-1.5, 1.5])), fg.grad(floor)(1.5)
    (array([-2.,  1.]), array(0.))
    """
    return apply_elementwise("floor", x)


def ceil(x: Any) -> Any:
    """Elementwise ``numpy.ceil``.

    >>> ceil(np.array([-1.5, 1.5])), fg.grad(ceil)(1.5)
    (array([-1.,  2.]), array(0.))
    """
    return apply_elementwise("ceil", x)


def rint(x: Any) -> Any:
    """Elementwise ``numpy.rint``.

    >>> rint(np.array([0.5, 1.5, 2.7])), fg.grad(rint)(2.7)  # halves round to even
    (array([0., 2., 3.]), array(0.))
    """
    return apply_elementwise("rint", x)


def isnan(x: Any) -> Any:
    """Elementwise ``numpy.isnan``.

    >>> isnan(np.array([1.0, np.nan, np.inf]))
    array([False,  True, False])
    """
    return apply_elementwise("isnan", x)


def isinf(x: Any) -> Any:
    """Elementwise ``numpy.isinf``.

    >>> isinf(np.array([1.0, np.nan, -np.inf]))
    array([False, False,  True])
    """
    return apply_elementwise("isinf", x)


def isfinite(x: Any) -> Any:
    """Elementwise ``numpy.isfinite``.

    >>> isfinite(np.array([1.0, np.nan, -np.inf]))
    array([ True, False, False])
    """
    return apply_elementwise("isfinite", x)


def logical_not(x: Any) -> Any:
    """Elementwise ``numpy.logical_not``.

    >>> logical_not(np.array([0.0, 2.0]))
    array([ True, False])
    """
    return apply_elementwise("logical_not", x)


def add(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.add``, with broadcasting.

    >>> add(np.array([1.0, 2.0]), 10.0), fg.grad(add, argnums=(0, 1))(1.0, 2.0)
    (array([11., 12.]), (array(1.), array(1.)))
    """
    return apply_elementwise("add", x, y)


def subtract(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.subtract``, with broadcasting.

    >>> subtract(np.array([[1.0], [2.0]]), np.array([0.5, 1.0]))
    array([[0.5, 0. ],
           [1.5, 1. ]])
    >>> fg.grad(subtract, argnums=1)(1.0, 2.0)
    array(-1.)
    """
    return apply_elementwise("subtract", x, y)


def multiply(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.multiply``, with broadcasting.

    >>> multiply(2.0, np.array([1.0, 3.0])), fg.grad(multiply)(2.0, 5.0)
    (array([2., 6.]), array(5.))
    """
    return apply_elementwise("multiply", x, y)


def divide(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.divide``, with broadcasting.

    >>> divide(np.array([1.0, 3.0]), 2.0), fg.grad(divide, argnums=1)(1.0, 2.0)
    (array([0.5, 1.5]), array(-0.25))
    """
    return apply_elementwise("divide", x, y)


def maximum(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.maximum``, with broadcasting.

    >>> maximum(np.array([1.0, 5.0]), 3.0), fg.grad(maximum)(2.0, 2.0)  # a tie: half each
    (array([3., 5.]), array(0.5))
    """
    return apply_elementwise("maximum", x, y)


def minimum(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.minimum``, with broadcasting.

    >>> minimum(np.array([1.0, 5.0]), 3.0), fg.grad(minimum)(1.0, 3.0)
    (array([1., 3.]), array(1.))
    """
    return apply_elementwise("minimum", x, y)


def less(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.less``, with broadcasting.

    >>> less(np.array([1.0, 2.0, 3.0]), 2.0)
    array([ True, False, False])
    """
    return apply_elementwise("less", x, y)


def less_equal(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.less_equal``, with broadcasting.

    >>> less_equal(np.array([1.0, 2.0, 3.0]), 2.0)
    array([ True,  True, False])
    """
    return apply_elementwise("less_equal", x, y)


def greater(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.greater``, with broadcasting.

    >>> greater(np.array([1.0, 2.0, 3.0]), 2.0)
    array([False, False,  True])
    """
    return apply_elementwise("greater", x, y)


def greater_equal(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.greater_equal``, with broadcasting.

    >>> greater_equal(np.array([1.0, 2.0, 3.0]), 2.0)
    array([False,  True,  True])
    """
    return apply_elementwise("greater_equal", x, y)


def equal(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.equal``, with broadcasting.

    >>> equal(np.array([1.0, np.nan]), np.array([1.0, np.nan]))  # nan equals nothing
    array([ True, False])
    """
    return apply_elementwise("equal", x, y)


def not_equal(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.not_equal``, with broadcasting.

    >>> not_equal(np.array([1.0, np.nan]), np.array([1.0, np.nan]))
    array([False,  True])
    """
    return apply_elementwise("not_equal", x, y)


def logical_and(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.logical_and``, with broadcasting.

    >>> logical_and(np.array([True, True, False]), np.array([True, False, False]))
    array([ True, False, False])
    """
    return apply_elementwise("logical_and", x, y)


def logical_or(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.logical_or``, with broadcasting.

    >>> logical_or(np.array([True, True, False]), np.array([True, False, False]))
    array([ True,  True, False])
    """
    return apply_elementwise("logical_or", x, y)


def logical_xor(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.logical_xor``, with broadcasting.

    >>> logical_xor(np.array([True, True, False]), np.array([True, False, False]))
    array([False,  True, False])
    """
    return apply_elementwise("logical_xor", x, y)


absolute = abs
true_divide = divide


_MISSING: Any = object()


def where(condition: Any, x: Any = _MISSING, y: Any = _MISSING) -> Any:
    """Choose elementwise from `x` where `condition` holds, else from `y` (NumPy broadcasting).

    >>> where(np.array([True, False]), 1.0, np.array([5.0, 6.0]))
    array([1., 6.])

    With the condition alone it is NumPy's ``nonzero``, on concrete arrays only: the number
    of indices depends on the values, so a traced condition is rejected.
    """
    if x is _MISSING and y is _MISSING:
        if isinstance(condition, Tracer):
            raise TypeError(
                "where(condition) with one argument gives the indices where condition holds, "
                "and their number depends on traced values. Use where(condition, x, y) to "
                "choose values, or compute the indices outside the traced function."
            )
        return np.nonzero(condition)
    if x is _MISSING or y is _MISSING:
        raise TypeError("where takes one argument (the condition) or three (condition, x, y)")
    if aval_of(condition).dtype != np.bool_:
        condition = not_equal(condition, 0)
    avals = [aval_of(a) for a in (condition, x, y)]
    shape = broadcast_shapes(*(a.shape for a in avals), what="where")
    dtype, weak = promote(avals[1:])
    tracing = any(isinstance(a, Tracer) for a in (condition, x, y))
    args = [
        coerce(condition, avals[0], np.dtype(bool), shape, tracing),
        coerce(x, avals[1], dtype, shape, tracing),
        coerce(y, avals[2], dtype, shape, tracing),
    ]
    return bind(REGISTRY["where"], *args)


def clip(x: Any, a_min: Any = None, a_max: Any = None) -> Any:
    """Limit values to [a_min, a_max]; either bound may be None. Gradient as minimum/maximum.

    >>> clip(np.array([-2.0, 0.5, 3.0]), 0.0, 1.0)
    array([0. , 0.5, 1. ])
    >>> fg.grad(lambda x: fnp.sum(clip(x, 0.0, 1.0)))(np.array([-2.0, 0.5, 3.0]))
    array([0., 1., 0.])
    """
    if a_min is not None:
        x = maximum(x, a_min)
    if a_max is not None:
        x = minimum(x, a_max)
    return x


def relu(x: Any) -> Any:
    """max(x, 0) (nan at nan, as NumPy's maximum), with derivative 0 at x == 0 as in JAX.

    >>> relu(np.array([-1.0, 0.0, 2.0])), fg.grad(relu)(0.0)
    (array([0., 0., 2.]), array(0.))
    """
    return where(equal(x, 0), 0, maximum(x, 0))


def stop_gradient(x: Any, name: str | None = None) -> Any:
    """The identity going forward; no gradient flows back through it.

    Applied to a plain array it returns the array; integer and boolean values pass through.
    See `fastgrad.stop_gradient` for pytrees.

    >>> fg.grad(lambda x: x * stop_gradient(x))(3.0)  # only the first factor counts
    array(3.)
    """
    if not isinstance(x, Tracer) or x.dtype.kind != "f":
        return x
    return bind(STOP_GRADIENT, x, name=name)
