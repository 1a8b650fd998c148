"""Transcendental elementwise functions: exp and log, powers and roots, trigonometric and
hyperbolic functions and their inverses, the logistic sigmoid; and the smooth compositions
built on them (logaddexp, softplus, log_sigmoid). Records are built as in
fastgrad.ops.elementwise; a fused loop computes them with fastgrad's vectorizable math
("call:NAME") where it has one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import REGISTRY, Primitive, at, points, register
from fastgrad.core.tracing import aval_of, bind
from fastgrad.ops.base import apply_elementwise, astype, batch_stacked, tangent_sum
from fastgrad.ops.elementwise import abs, maximum, multiply, where
from fastgrad.ops.ufunc_records import elementwise

__all__ = [
    "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctan2", "arctanh", "cbrt", "cos",
    "cosh", "deg2rad", "degrees", "exp", "exp2", "expm1", "hypot", "log", "log10", "log1p",
    "log2", "log_sigmoid", "logaddexp", "logaddexp2", "power", "rad2deg", "radians",
    "sigmoid", "sin", "sinc", "sinh", "softplus", "sqrt", "tan", "tanh",
]  # fmt: skip

# ---------------------------------------------------------------- records


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Two forms, each exact on its side of 0, so neither overflows.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


# Special points (see core.primitive.Point): zeros, domain edges, huge arguments (near
# overflow in float32 and float64), infinities and nan.
inf, nan = math.inf, math.nan
_NONFINITE = (inf, -inf, nan)
_LOG_POINTS = points(1.0, 0.5, 1e-300, 5e-324, 1e-40, 1e300, 0.0, -0.0, -1.0, *_NONFINITE)


def _nan_below(x: Any, bound: float) -> Any:
    """x, plus nan where x < bound: outside its domain a function is nan, and so must its
    derivatives be, at every order (log'(-1) is not -1). Added, not selected: a selected
    constant nan would have zero derivatives."""
    return x + where(x < bound, math.nan, 0.0).astype(x.dtype)


def _arccosh_d(x: Any) -> Any:
    x = _nan_below(x, 1)
    return sqrt(x * x - 1)


# Unary float functions: d/dx, written with the output `out` where that is cheaper. The VJP
# (first line) scales the cotangent `g` by it, the JVP (second line) the tangent `t[0]`,
# never None for an op with one input.
# fmt: off
elementwise("exp", np.exp, lambda g, out, x: (g * out,),
            jvp=lambda t, out, x: t[0] * out,
            special_points=points(0.0, 1.0, -745.0, -800.0, 88.0, 89.0, 709.0, 710.0,
                                  *_NONFINITE))
elementwise("exp2", np.exp2, lambda g, out, x: (g * out * math.log(2),),
            jvp=lambda t, out, x: t[0] * out * math.log(2),
            # Not in [1024, 1025.6): there exp2 overflows but its derivatives (computed
            # from it) would not.
            special_points=points(0.0, 1.5, -1074.0, -1100.0, 127.5, 1023.25, 1100.0,
                                  *_NONFINITE))
elementwise("expm1", np.expm1, lambda g, out, x: (g * (out + 1),),
            jvp=lambda t, out, x: t[0] * (out + 1),
            special_points=points(0.0, 1e-20, -1.5, -50.0, 88.0, 709.0, 710.0, *_NONFINITE))
elementwise("log", np.log, lambda g, out, x: (g / _nan_below(x, 0),), ("positive",),
            jvp=lambda t, out, x: t[0] / _nan_below(x, 0), special_points=_LOG_POINTS)
elementwise("log2", np.log2, lambda g, out, x: (g / (_nan_below(x, 0) * math.log(2)),),
            ("positive",),
            jvp=lambda t, out, x: t[0] / (_nan_below(x, 0) * math.log(2)),
            special_points=_LOG_POINTS)
elementwise("log10", np.log10, lambda g, out, x: (g / (_nan_below(x, 0) * math.log(10)),),
            ("positive",),
            jvp=lambda t, out, x: t[0] / (_nan_below(x, 0) * math.log(10)),
            special_points=_LOG_POINTS)
elementwise("log1p", np.log1p, lambda g, out, x: (g / _nan_below(x + 1, 0),),
            ("above_minus_one",),
            jvp=lambda t, out, x: t[0] / _nan_below(x + 1, 0),
            special_points=points(0.0, 1e-20, -0.5, -0.999999, -1.0, -2.0, 1e300,
                                  *_NONFINITE))
# sqrt(-0.0) is -0.0: adding +0.0 makes it +0.0, so sqrt'(-0.0) is +inf, as at +0.0.
elementwise("sqrt", np.sqrt, lambda g, out, x: (g / (out * 2 + 0.0),), ("positive",),
            jvp=lambda t, out, x: t[0] / (out * 2 + 0.0),
            special_points=points(0.0, -0.0, 4.0, 1e-300, 5e-324, 1e300, -1.0, *_NONFINITE))
elementwise("cbrt", np.cbrt, lambda g, out, x: (g / (out * out * 3),), ("nonzero",),
            jvp=lambda t, out, x: t[0] / (out * out * 3),
            special_points=points(0.0, -8.0, 27.0, 1e-300, -1e300, *_NONFINITE))
elementwise("sin", np.sin, lambda g, out, x: (g * cos(x),),
            jvp=lambda t, out, x: t[0] * cos(x),
            special_points=points(0.0, 1.5, math.pi / 2, 1e22, *_NONFINITE))
elementwise("cos", np.cos, lambda g, out, x: (-g * sin(x),),
            jvp=lambda t, out, x: -t[0] * sin(x),
            special_points=points(0.0, 1.5, math.pi, 1e22, *_NONFINITE))
elementwise("tan", np.tan, lambda g, out, x: (g * (out * out + 1),), ("unit",),
            jvp=lambda t, out, x: t[0] * (out * out + 1),
            special_points=points(0.0, 1.0, 1.5707963, -1.5707963267948966, *_NONFINITE))
elementwise("arcsin", np.arcsin, lambda g, out, x: (g / sqrt(1 - x * x),), ("unit",),
            jvp=lambda t, out, x: t[0] / sqrt(1 - x * x),
            special_points=points(0.0, 0.5, 1.0, -1.0, 1.5, *_NONFINITE))
elementwise("arccos", np.arccos, lambda g, out, x: (-g / sqrt(1 - x * x),), ("unit",),
            jvp=lambda t, out, x: -t[0] / sqrt(1 - x * x),
            special_points=points(0.0, 0.5, 1.0, -1.0, -1.5, *_NONFINITE))
elementwise("arctan", np.arctan, lambda g, out, x: (g / (x * x + 1),),
            jvp=lambda t, out, x: t[0] / (x * x + 1),
            special_points=points(0.0, 1.0, 1e20, 1e300, *_NONFINITE))
elementwise("sinh", np.sinh, lambda g, out, x: (g * cosh(x),),
            jvp=lambda t, out, x: t[0] * cosh(x),
            special_points=points(0.0, 1.5, 89.0, 710.0, 711.0, -711.0, *_NONFINITE))
elementwise("cosh", np.cosh, lambda g, out, x: (g * sinh(x),),
            jvp=lambda t, out, x: t[0] * sinh(x),
            special_points=points(0.0, 1.5, 89.0, 710.0, 711.0, -711.0, *_NONFINITE))
elementwise("tanh", np.tanh, lambda g, out, x: (g * (1 - out * out),),
            jvp=lambda t, out, x: t[0] * (1 - out * out),
            special_points=points(0.0, 0.5, 10.0, 20.0, -20.0, 400.0, *_NONFINITE))
elementwise("arcsinh", np.arcsinh, lambda g, out, x: (g / sqrt(x * x + 1),),
            jvp=lambda t, out, x: t[0] / sqrt(x * x + 1),
            special_points=points(0.0, 1.0, 1e20, -1e300, *_NONFINITE))
elementwise("arccosh", np.arccosh, lambda g, out, x: (g / _arccosh_d(x),), ("above_one",),
            jvp=lambda t, out, x: t[0] / _arccosh_d(x),
            special_points=points(1.0, 2.0, 1e20, 1e300, 0.5, *_NONFINITE))
elementwise("arctanh", np.arctanh, lambda g, out, x: (g / _nan_below(1 - x * x, 0),),
            ("unit",),
            jvp=lambda t, out, x: t[0] / _nan_below(1 - x * x, 0),
            special_points=points(0.0, 0.5, -0.999, 1.0, -1.0, 1.5, *_NONFINITE))
elementwise("sigmoid", np.exp, lambda g, out, x: (g * out * (1 - out),), impl=_sigmoid,
            jvp=lambda t, out, x: t[0] * out * (1 - out),
            special_points=points(0.0, 2.0, -40.0, 40.0, -800.0, 800.0, *_NONFINITE))
# fmt: on


# power and its derivatives. d/dx x**y = y x**(y-1) and d/dy x**y = x**y log(x); their own
# derivatives bring powers of log(x), so the y-derivatives go through `power_log`, the
# function x**y log(x)**k, whose derivatives are again of that form:
#   d/dx power_log(x, y, k) = y power_log(x, y-1, k) + k power_log(x, y-1, k-1)
#   d/dy power_log(x, y, k) = power_log(x, y, k+1)
# with power_log(x, y, 0) = x**y. At x == 0, y > 0 it is 0 (the limit: x**y wins over
# log(x)**k), so every derivative at a zero base is the true one (0, or +-inf where it
# diverges) at every order, with no 0 * inf. The term y * p(x, y-1) is exactly 0 where
# y == 0 (d/dx x**0 = 0 for every x): at x == 0 its factor would be inf, so the base is
# replaced there by a safe 1 *inside* the term. A masked value must never be able to make
# inf or nan: differentiated again, its zero cotangent would meet it as 0 * inf.


def _power_or_log(x: Any, y: Any, k: int) -> Any:
    return power(x, y) if k == 0 else bind(REGISTRY["power_log"], x, y, k=k)


def _d_power_dx(x: Any, y: Any, k: int) -> Any:
    """d/dx of x**y log(x)**k."""
    safe_x = where((x == 0) & (y == 0), 1.0, x)
    d = y * _power_or_log(safe_x, y - 1, k)
    return d if k == 0 else d + _power_or_log(x, y - 1, k - 1) * k


def _power_log_vjp(g: Any, out: Any, x: Any, y: Any, *, k: int = 0) -> tuple[Any, Any]:
    return g * _d_power_dx(x, y, k), g * _power_or_log(x, y, k + 1)


def _power_log_jvp(t: Any, out: Any, x: Any, y: Any, *, k: int = 0) -> Any:
    return tangent_sum(
        t, lambda tx: tx * _d_power_dx(x, y, k), lambda ty: ty * _power_or_log(x, y, k + 1)
    )


def _power_log_impl(x: np.ndarray, y: np.ndarray, *, k: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        out = np.asarray(np.power(x, y) * np.log(x) ** k)
        # The limits where x**y goes to 0 faster than log(x)**k grows.
        vanish = ((x == 0) & (y > 0)) | ((x == np.inf) & (y < 0))
    return np.where(vanish, np.zeros((), out.dtype), out)


def _power_log_eval(x: Aval, y: Aval, *, k: int) -> Aval:
    if x.shape != y.shape or x.dtype != y.dtype or x.dtype.kind != "f":
        raise TypeError(f"power_log needs two float operands of one type, got {x} and {y}")
    return Aval(x.shape, x.dtype, weak=x.weak and y.weak)


_POWER_POINTS = points(
    # A zero base with integer and non-integer exponents, negative ones included.
    (0.0, 0.0), (0.0, 1.0), (0.0, 2.0), (0.0, 3.0), (0.0, 0.5), (0.0, 1.5), (0.0, 2.5),
    (0.0, -1.0), (0.0, -0.5), (-0.0, 2.0),
    (2.0, 0.0), (2.0, 1.0), (2.0, 0.5), (-2.0, 2.0), (-2.0, 3.0), (-2.0, 0.5), (1.0, 3.5),
    (1e200, 2.0), (10.0, 400.0), (0.5, 2000.0),
    (inf, 2.0), (inf, -1.0), (inf, 0.0), (2.0, inf), (0.5, inf), (2.0, -inf),
    (nan, 0.0), (1.0, nan), (nan, 2.0), (2.0, nan),
)  # fmt: skip

_POWER_LOG_POINTS = (
    (0.0, 0.0), (0.0, 1.0), (0.0, 2.0), (0.0, 0.5), (0.0, -1.0), (1.0, 2.0), (0.5, 3.0),
    (3.0, -1.5), (-2.0, 2.0), (inf, -1.0), (inf, 2.0), (nan, 1.0), (2.0, nan),
)  # fmt: skip

# fmt: off
elementwise("power", np.power, _power_log_vjp, ("positive", "real"), loop="{0} ** {1}",
            jvp=_power_log_jvp, special_points=_POWER_POINTS)
# fmt: on
register(
    Primitive(
        "power_log",
        _power_log_eval,
        _power_log_impl,
        _power_log_vjp,
        _power_log_jvp,
        batch_stacked("power_log"),
        kind="other",  # no loop expression: a library call of the NumPy reference
        domain=("positive", "real"),
        format=lambda args, params: f"{args[0]} ** {args[1]} * log({args[0]}) ** {params['k']}",
        special_points=tuple(at(x, y, k=k) for k in (1, 2) for x, y in _POWER_LOG_POINTS),
    )
)


def _arctan2_d(a: Any, y: Any, x: Any) -> Any:
    """a / (x**2 + y**2), scaled by max(|x|, |y|) so that the squares neither underflow
    (1e-200) nor overflow (1e200). The scale cancels exactly, so its own derivatives add
    nothing."""
    s = maximum(abs(x), abs(y))
    xs, ys = x / s, y / s
    return (a / s) / ((xs * xs + ys * ys) * s)


# fmt: off
elementwise("arctan2", np.arctan2,
            lambda g, out, y, x: (g * _arctan2_d(x, y, x), -g * _arctan2_d(y, y, x)),
            ("real", "positive"),  # away from the branch cut along x < 0
            jvp=lambda t, out, y, x: tangent_sum(t, lambda ty: ty * _arctan2_d(x, y, x),
                                                  lambda tx: -tx * _arctan2_d(y, y, x)),
            special_points=points((1.0, 2.0), (1.0, -2.0), (-1.0, -2.0), (0.0, 1.0),
                                  (1e200, 1e200), (1e-200, 1e-200), (inf, 1.0), (1.0, inf),
                                  (1.0, -inf), (inf, inf), (nan, 1.0), (1.0, nan)))
_LOGADDEXP_POINTS = points((0.3, 0.3), (0.0, 0.0), (1.0, 2.0), (1000.0, 0.0), (-1000.0, 0.0),
                           (1e300, 1e300), (40.0, -40.0), (inf, 1.0), (-inf, 1.0), (inf, inf),
                           (-inf, -inf), (inf, -inf), (nan, 1.0), (1.0, nan))
elementwise("logaddexp", np.logaddexp,
            lambda g, out, x, y: (g * sigmoid(x - y), g * sigmoid(y - x)),
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx * sigmoid(x - y),
                                                  lambda ty: ty * sigmoid(y - x)),
            special_points=_LOGADDEXP_POINTS)
# fmt: on


def _hypot_share(x: Any, out: Any) -> Any:
    # d/dx hypot(x, y) = x / hypot: 0 at the origin (the tip of a cone), as abs'(0), at
    # every order (a constant there: x / 1 would have derivative 1), with no 0 / 0.
    tip = out == 0
    return where(tip, 0.0, x / where(tip, 1.0, out))


# fmt: off
elementwise("hypot", np.hypot,
            lambda g, out, x, y: (g * _hypot_share(x, out), g * _hypot_share(y, out)),
            ("nonzero", "nonzero"),  # away from the cone's tip at the origin
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx * _hypot_share(x, out),
                                                  lambda ty: ty * _hypot_share(y, out)),
            special_points=points((3.0, 4.0), at(0.0, 0.0, convention="abs-at-zero"),
                                  at(-0.0, 0.0, convention="abs-at-zero"), (0.0, 2.0),
                                  (-1.5, 0.0), (1e200, 1e200), (1e-30, 1e-30), (inf, 1.0),
                                  (-inf, -inf), (nan, 1.0), (inf, nan)))
# d/dx log2(2**x + 2**y) = 1 / (1 + 2**(y - x)): analytic everywhere, so exact at every
# order (at ties too, where a max-based formula has a kink in each term). Not 2**(x - out):
# x - out rounds to 0 for huge x == y (1e300 + 1 is 1e300), giving 1 for 1/2.
def _logaddexp2_share(x: Any, y: Any) -> Any:
    return sigmoid((x - y) * math.log(2))


elementwise("logaddexp2", np.logaddexp2,
            lambda g, out, x, y: (g * _logaddexp2_share(x, y), g * _logaddexp2_share(y, x)),
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx * _logaddexp2_share(x, y),
                                                  lambda ty: ty * _logaddexp2_share(y, x)),
            special_points=_LOGADDEXP_POINTS)
# fmt: on

# ---------------------------------------------------------------- functions


def exp(x: Any) -> Any:
    """Elementwise ``numpy.exp``.

    >>> exp(1.0), fg.grad(exp)(0.0)
    (array(2.71828183), array(1.))
    """
    return apply_elementwise("exp", x)


def exp2(x: Any) -> Any:
    """Elementwise ``numpy.exp2``.

    >>> exp2(3.0), fg.grad(exp2)(0.0)
    (array(8.), array(0.69314718))
    """
    return apply_elementwise("exp2", x)


def expm1(x: Any) -> Any:
    """Elementwise ``numpy.expm1``.

    >>> expm1(1e-10), fg.grad(expm1)(0.0)
    (array(1.e-10), array(1.))
    """
    return apply_elementwise("expm1", x)


def log(x: Any) -> Any:
    """Elementwise ``numpy.log``.

    >>> log(np.e), fg.grad(log)(2.0)
    (array(1.), array(0.5))
    """
    return apply_elementwise("log", x)


def log2(x: Any) -> Any:
    """Elementwise ``numpy.log2``.

    >>> log2(8.0), fg.grad(log2)(1.0)
    (array(3.), array(1.44269504))
    """
    return apply_elementwise("log2", x)


def log10(x: Any) -> Any:
    """Elementwise ``numpy.log10``.

    >>> log10(1000.0), fg.grad(log10)(1.0)
    (array(3.), array(0.43429448))
    """
    return apply_elementwise("log10", x)


def log1p(x: Any) -> Any:
    """Elementwise ``numpy.log1p``.

    >>> log1p(1e-10), fg.grad(log1p)(0.0)
    (array(1.e-10), array(1.))
    """
    return apply_elementwise("log1p", x)


def sqrt(x: Any) -> Any:
    """Elementwise ``numpy.sqrt``.

    >>> sqrt(4.0), fg.grad(sqrt)(4.0)
    (array(2.), array(0.25))
    """
    return apply_elementwise("sqrt", x)


def cbrt(x: Any) -> Any:
    """Elementwise ``numpy.cbrt``.

    >>> cbrt(-8.0), fg.grad(cbrt)(8.0)
    (array(-2.), array(0.08333333))
    """
    return apply_elementwise("cbrt", x)


def sin(x: Any) -> Any:
    """Elementwise ``numpy.sin``.

    >>> sin(np.pi / 2), fg.grad(sin)(0.0)
    (array(1.), array(1.))
    """
    return apply_elementwise("sin", x)


def cos(x: Any) -> Any:
    """Elementwise ``numpy.cos``.

    >>> cos(0.0), fg.grad(cos)(np.pi / 2)
    (array(1.), array(-1.))
    """
    return apply_elementwise("cos", x)


def tan(x: Any) -> Any:
    """Elementwise ``numpy.tan``.

    >>> tan(np.pi / 4), fg.grad(tan)(0.0)
    (array(1.), array(1.))
    """
    return apply_elementwise("tan", x)


def arcsin(x: Any) -> Any:
    """Elementwise ``numpy.arcsin``.

    >>> arcsin(1.0), fg.grad(arcsin)(0.0)
    (array(1.57079633), array(1.))
    """
    return apply_elementwise("arcsin", x)


def arccos(x: Any) -> Any:
    """Elementwise ``numpy.arccos``.

    >>> arccos(0.0), fg.grad(arccos)(0.0)
    (array(1.57079633), array(-1.))
    """
    return apply_elementwise("arccos", x)


def arctan(x: Any) -> Any:
    """Elementwise ``numpy.arctan``.

    >>> arctan(1.0), fg.grad(arctan)(1.0)
    (array(0.78539816), array(0.5))
    """
    return apply_elementwise("arctan", x)


def sinh(x: Any) -> Any:
    """Elementwise ``numpy.sinh``.

    >>> sinh(0.0), fg.grad(sinh)(0.0)
    (array(0.), array(1.))
    """
    return apply_elementwise("sinh", x)


def cosh(x: Any) -> Any:
    """Elementwise ``numpy.cosh``.

    >>> cosh(0.0), fg.grad(cosh)(0.0)
    (array(1.), array(0.))
    """
    return apply_elementwise("cosh", x)


def tanh(x: Any) -> Any:
    """Elementwise ``numpy.tanh``.

    >>> tanh(np.array([0.0, 100.0])), fg.grad(tanh)(0.0)
    (array([0., 1.]), array(1.))
    """
    return apply_elementwise("tanh", x)


def arcsinh(x: Any) -> Any:
    """Elementwise ``numpy.arcsinh``.

    >>> arcsinh(0.0), fg.grad(arcsinh)(0.0)
    (array(0.), array(1.))
    """
    return apply_elementwise("arcsinh", x)


def arccosh(x: Any) -> Any:
    """Elementwise ``numpy.arccosh``.

    >>> arccosh(1.0), fg.grad(arccosh)(2.0)
    (array(0.), array(0.57735027))
    """
    return apply_elementwise("arccosh", x)


def arctanh(x: Any) -> Any:
    """Elementwise ``numpy.arctanh``.

    >>> arctanh(0.5), fg.grad(arctanh)(0.5)
    (array(0.54930614), array(1.33333333))
    """
    return apply_elementwise("arctanh", x)


def sigmoid(x: Any) -> Any:
    """1 / (1 + exp(-x)), computed without overflow.

    >>> sigmoid(np.array([-1000.0, 0.0, 1000.0])), fg.grad(sigmoid)(0.0)
    (array([0. , 0.5, 1. ]), array(0.25))
    """
    return apply_elementwise("sigmoid", x)


def power(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.power``, with broadcasting.

    >>> power(2.0, np.array([3.0, 0.5])), fg.grad(power)(2.0, 3.0)
    (array([8.        , 1.41421356]), array(12.))
    """
    return apply_elementwise("power", x, y)


def arctan2(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.arctan2``, with broadcasting.

    >>> arctan2(1.0, 1.0), fg.grad(arctan2)(1.0, 1.0)
    (array(0.78539816), array(0.5))
    """
    return apply_elementwise("arctan2", x, y)


def logaddexp(x: Any, y: Any) -> Any:
    """log(exp(x) + exp(y)) without overflow (NumPy's value); its derivatives are
    sigmoid(x - y) and sigmoid(y - x), smooth at x == y at every order.

    >>> logaddexp(1000.0, 1000.0), fg.grad(logaddexp)(0.0, 0.0)
    (array(1000.69314718), array(0.5))
    """
    return apply_elementwise("logaddexp", x, y)


def softplus(x: Any) -> Any:
    """log(1 + exp(x)) without overflow.

    >>> softplus(np.array([-1000.0, 1000.0])), fg.grad(softplus)(0.0)
    (array([   0., 1000.]), array(0.5))
    """
    return logaddexp(x, 0.0)


def log_sigmoid(x: Any) -> Any:
    """log(sigmoid(x)) = -softplus(-x), without overflow.

    >>> import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    >>> fnp.log_sigmoid(np.array([-1000.0, 0.0]))
    array([-1.00000000e+03, -6.93147181e-01])
    >>> float(fg.grad(fnp.log_sigmoid)(0.0))
    0.5
    """
    return -softplus(-x)


def hypot(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.hypot``: sqrt(x**2 + y**2) without overflow, with broadcasting.

    >>> hypot(3.0, np.array([4.0, 1e200]))
    array([5.e+000, 1.e+200])
    """
    return apply_elementwise("hypot", x, y)


def logaddexp2(x: Any, y: Any) -> Any:
    """log2(2**x + 2**y) without overflow, with broadcasting.

    >>> logaddexp2(np.array([1.0, 1000.0]), 1.0)
    array([   2., 1000.])
    """
    return apply_elementwise("logaddexp2", x, y)


def _scaled(ufunc: Any, x: Any) -> Any:
    # A fixed-factor ufunc (deg2rad, rad2deg) is x * ufunc(1) in its result dtype: NumPy
    # multiplies by the same constant, so the values agree bit for bit.
    dtype = np.asarray(ufunc(np.ones((), aval_of(x).dtype))).dtype
    return multiply(astype(x, dtype), ufunc(np.ones((), dtype)))


def deg2rad(x: Any) -> Any:
    """Degrees to radians, as ``numpy.deg2rad``.

    >>> deg2rad(np.array([180.0]))
    array([3.14159265])
    """
    return _scaled(np.deg2rad, x)


def rad2deg(x: Any) -> Any:
    """Radians to degrees, as ``numpy.rad2deg``.

    >>> rad2deg(np.array([np.pi / 2]))
    array([90.])
    """
    return _scaled(np.rad2deg, x)


radians, degrees = deg2rad, rad2deg

# sinc(x) = sum_k (-u)**k / (2k + 1)! with u = (pi x)**2. Below |x| < 0.05 the terms up to
# u**5 are exact to far below an ulp, and the polynomial gives exact derivatives at 0 (the
# quotient's 0 / 0 would not).
_SINC_SERIES = [(-1) ** k / math.factorial(2 * k + 1) for k in range(6)]


def sinc(x: Any) -> Any:
    """sin(pi x) / (pi x), with sinc(0) = 1, as ``numpy.sinc``; derivatives exact at 0.

    >>> sinc(np.array([0.0, 0.5]))
    array([1.        , 0.63661977])
    """
    px = multiply(x, math.pi)
    small = abs(x) < 0.05
    near = where(small, px, 0.0)  # the series only where selected: px**2 of a large x
    u = near * near  # overflows (float32 from 1e19), and its nan would leak through where
    series = _SINC_SERIES[-1]
    for c in reversed(_SINC_SERIES[:-1]):
        series = series * u + c
    safe = where(small, 1.0, px)
    return where(small, series, sin(safe) / safe)
