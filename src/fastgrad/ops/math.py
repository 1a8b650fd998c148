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

from fastgrad.core.tracing import aval_of
from fastgrad.ops.base import apply_elementwise, astype, tangent_sum
from fastgrad.ops.elementwise import abs, elementwise, maximum, multiply, subtract, where

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


# Unary float functions: d/dx, written with the output `out` where that is cheaper. The VJP
# (first line) scales the cotangent `g` by it, the JVP (second line) the tangent `t[0]`,
# never None for an op with one input.
# fmt: off
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
elementwise("sin", np.sin, lambda g, out, x: (g * cos(x),),
            jvp=lambda t, out, x: t[0] * cos(x))
elementwise("cos", np.cos, lambda g, out, x: (-g * sin(x),),
            jvp=lambda t, out, x: -t[0] * sin(x))
elementwise("tan", np.tan, lambda g, out, x: (g * (out * out + 1),), ("unit",),
            jvp=lambda t, out, x: t[0] * (out * out + 1))
elementwise("arcsin", np.arcsin, lambda g, out, x: (g / sqrt(1 - x * x),), ("unit",),
            jvp=lambda t, out, x: t[0] / sqrt(1 - x * x))
elementwise("arccos", np.arccos, lambda g, out, x: (-g / sqrt(1 - x * x),), ("unit",),
            jvp=lambda t, out, x: -t[0] / sqrt(1 - x * x))
elementwise("arctan", np.arctan, lambda g, out, x: (g / (x * x + 1),),
            jvp=lambda t, out, x: t[0] / (x * x + 1))
elementwise("sinh", np.sinh, lambda g, out, x: (g * cosh(x),),
            jvp=lambda t, out, x: t[0] * cosh(x))
elementwise("cosh", np.cosh, lambda g, out, x: (g * sinh(x),),
            jvp=lambda t, out, x: t[0] * sinh(x))
elementwise("tanh", np.tanh, lambda g, out, x: (g * (1 - out * out),),
            jvp=lambda t, out, x: t[0] * (1 - out * out))
elementwise("arcsinh", np.arcsinh, lambda g, out, x: (g / sqrt(x * x + 1),),
            jvp=lambda t, out, x: t[0] / sqrt(x * x + 1))
elementwise("arccosh", np.arccosh, lambda g, out, x: (g / sqrt(x * x - 1),), ("above_one",),
            jvp=lambda t, out, x: t[0] / sqrt(x * x - 1))
elementwise("arctanh", np.arctanh, lambda g, out, x: (g / (1 - x * x),), ("unit",),
            jvp=lambda t, out, x: t[0] / (1 - x * x))
elementwise("sigmoid", np.exp, lambda g, out, x: (g * out * (1 - out),), impl=_sigmoid,
            jvp=lambda t, out, x: t[0] * out * (1 - out))
# fmt: on
# fmt: on


def _power_vjp(g: Any, out: Any, x: Any, y: Any) -> tuple[Any, Any]:
    # Follows JAX at the edges: d/dx is 0 at x == y == 0 (not 0 * inf), d/dy is 0 where
    # x == 0. Elsewhere the plain formula, so that second derivatives stay exact.
    gx = g * where((x == 0) & (y == 0), 0.0, y * power(x, y - 1))
    gy = g * out * log(where(x == 0, 1.0, x))
    return gx, gy


def _power_jvp(t: Any, out: Any, x: Any, y: Any) -> Any:
    # The same partial derivatives as _power_vjp, with the same edges.
    return tangent_sum(
        t,
        lambda tx: tx * where((x == 0) & (y == 0), 0.0, y * power(x, y - 1)),
        lambda ty: ty * out * log(where(x == 0, 1.0, x)),
    )


# fmt: off
elementwise("power", np.power, _power_vjp, ("positive", "real"), loop="{0} ** {1}",
            jvp=_power_jvp)
elementwise("arctan2", np.arctan2,
            lambda g, out, y, x: (g * x / (x * x + y * y), -g * y / (x * x + y * y)),
            ("real", "positive"),  # away from the branch cut along x < 0
            jvp=lambda t, out, y, x: tangent_sum(t, lambda ty: ty * x / (x * x + y * y),
                                                  lambda tx: -tx * y / (x * x + y * y)))
# fmt: on
# fmt: on


def _hypot_share(x: Any, out: Any) -> Any:
    # d/dx hypot(x, y) = x / hypot: 0 at the origin, as abs'(0), with no 0 / 0 there.
    return x / where(out == 0, 1.0, out)


# fmt: off
elementwise("hypot", np.hypot,
            lambda g, out, x, y: (g * _hypot_share(x, out), g * _hypot_share(y, out)),
            ("nonzero", "nonzero"),  # away from the cone's tip at the origin
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx * _hypot_share(x, out),
                                                  lambda ty: ty * _hypot_share(y, out)))
# d/dx log2(2**x + 2**y) = 2**(x - out): analytic everywhere, so exact at every order (at
# ties too, where a max-based formula has a kink in each term).
elementwise("logaddexp2", np.logaddexp2,
            lambda g, out, x, y: (g * exp2(x - out), g * exp2(y - out)),
            jvp=lambda t, out, x, y: tangent_sum(t, lambda tx: tx * exp2(x - out),
                                                  lambda ty: ty * exp2(y - out)))
# fmt: on

# ---------------------------------------------------------------- functions


def exp(x: Any) -> Any:
    """Elementwise ``numpy.exp``."""
    return apply_elementwise("exp", x)


def exp2(x: Any) -> Any:
    """Elementwise ``numpy.exp2``."""
    return apply_elementwise("exp2", x)


def expm1(x: Any) -> Any:
    """Elementwise ``numpy.expm1``."""
    return apply_elementwise("expm1", x)


def log(x: Any) -> Any:
    """Elementwise ``numpy.log``."""
    return apply_elementwise("log", x)


def log2(x: Any) -> Any:
    """Elementwise ``numpy.log2``."""
    return apply_elementwise("log2", x)


def log10(x: Any) -> Any:
    """Elementwise ``numpy.log10``."""
    return apply_elementwise("log10", x)


def log1p(x: Any) -> Any:
    """Elementwise ``numpy.log1p``."""
    return apply_elementwise("log1p", x)


def sqrt(x: Any) -> Any:
    """Elementwise ``numpy.sqrt``."""
    return apply_elementwise("sqrt", x)


def cbrt(x: Any) -> Any:
    """Elementwise ``numpy.cbrt``."""
    return apply_elementwise("cbrt", x)


def sin(x: Any) -> Any:
    """Elementwise ``numpy.sin``."""
    return apply_elementwise("sin", x)


def cos(x: Any) -> Any:
    """Elementwise ``numpy.cos``."""
    return apply_elementwise("cos", x)


def tan(x: Any) -> Any:
    """Elementwise ``numpy.tan``."""
    return apply_elementwise("tan", x)


def arcsin(x: Any) -> Any:
    """Elementwise ``numpy.arcsin``."""
    return apply_elementwise("arcsin", x)


def arccos(x: Any) -> Any:
    """Elementwise ``numpy.arccos``."""
    return apply_elementwise("arccos", x)


def arctan(x: Any) -> Any:
    """Elementwise ``numpy.arctan``."""
    return apply_elementwise("arctan", x)


def sinh(x: Any) -> Any:
    """Elementwise ``numpy.sinh``."""
    return apply_elementwise("sinh", x)


def cosh(x: Any) -> Any:
    """Elementwise ``numpy.cosh``."""
    return apply_elementwise("cosh", x)


def tanh(x: Any) -> Any:
    """Elementwise ``numpy.tanh``."""
    return apply_elementwise("tanh", x)


def arcsinh(x: Any) -> Any:
    """Elementwise ``numpy.arcsinh``."""
    return apply_elementwise("arcsinh", x)


def arccosh(x: Any) -> Any:
    """Elementwise ``numpy.arccosh``."""
    return apply_elementwise("arccosh", x)


def arctanh(x: Any) -> Any:
    """Elementwise ``numpy.arctanh``."""
    return apply_elementwise("arctanh", x)


def sigmoid(x: Any) -> Any:
    """1 / (1 + exp(-x)), computed without overflow."""
    return apply_elementwise("sigmoid", x)


def power(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.power``, with broadcasting."""
    return apply_elementwise("power", x, y)


def arctan2(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.arctan2``, with broadcasting."""
    return apply_elementwise("arctan2", x, y)


def logaddexp(x: Any, y: Any) -> Any:
    """log(exp(x) + exp(y)) without overflow."""
    big = maximum(x, y)
    return big + log1p(exp(-abs(subtract(x, y))))


def softplus(x: Any) -> Any:
    """log(1 + exp(x)) without overflow."""
    return logaddexp(x, 0.0)


def log_sigmoid(x: Any) -> Any:
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
    u = px * px
    series = _SINC_SERIES[-1]
    for c in reversed(_SINC_SERIES[:-1]):
        series = series * u + c
    safe = where(small, 1.0, px)
    return where(small, series, sin(safe) / safe)
