"""Piecewise elementwise functions: the rounding divisions (remainder, fmod,
floor_divide), trunc, the NaN-ignoring extrema fmax and fmin, copysign and heaviside.

Records are built as in fastgrad.ops.elementwise; their loops call NumPy's scalar
functions, so fused results are NumPy's bit for bit. Derivatives follow the pieces: 0 for
the piecewise-constant ones, the kink conventions of abs and maximum for the others.
"""

from __future__ import annotations

import builtins
import functools
import operator
from typing import Any

import numpy as np

from fastgrad.core.primitive import at, points
from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import apply_elementwise, tangent_sum
from fastgrad.ops.elementwise import rint, sign, where
from fastgrad.ops.ufunc_records import elementwise

__all__ = [
    "around", "copysign", "floor_divide", "fmax", "fmin", "fmod", "heaviside", "mod",
    "remainder", "round", "trunc",
]  # fmt: skip

# ---------------------------------------------------------------- records

# Piecewise constant: the derivative is 0 wherever it exists.
_no_derivative = lambda g, out, *xs: (None,) * len(xs)  # noqa: E731
_no_tangent = lambda t, out, *xs: None  # noqa: E731


def _quotient(x: Any, out: Any, y: Any) -> Any:
    # The integer q with out == x - q * y, recovered from the result itself, so that it
    # agrees with NumPy's rounding (floor for remainder, truncation for fmod) even where
    # floor(x / y) would round the other way.
    return rint((x - out) / y)


def _remainder_vjp(g: Any, out: Any, x: Any, y: Any) -> tuple[Any, Any]:
    return g, -g * _quotient(x, out, y)


def _remainder_jvp(t: Any, out: Any, x: Any, y: Any) -> Any:
    return tangent_sum(t, lambda tx: tx, lambda ty: -ty * _quotient(x, out, y))


def _nan_ignoring_weight(a: Any, b: Any, a_wins: Any) -> Any:
    # d fmax(a, b) / da (or fmin's): 1 where a wins or b is NaN (the other operand is
    # taken), 0.5 at a tie (split as maximum's, the JAX rule), 0 where b wins or a is NaN.
    # Both NaN: the value is NaN, and so is the derivative.
    weight = where(a_wins | (b != b), 1.0, where(a == b, 0.5, 0.0))
    return where((a != a) & (b != b), np.nan, weight).astype(a.dtype)


def _fmax_weights(x: Any, y: Any) -> tuple[Any, Any]:
    return _nan_ignoring_weight(x, y, x > y), _nan_ignoring_weight(y, x, y > x)


def _fmin_weights(x: Any, y: Any) -> tuple[Any, Any]:
    return _nan_ignoring_weight(x, y, x < y), _nan_ignoring_weight(y, x, y < x)


def _extremum_rules(weights: Any) -> dict[str, Any]:
    def vjp(g: Any, out: Any, x: Any, y: Any) -> tuple[Any, Any]:
        wx, wy = weights(x, y)
        return g * wx, g * wy

    def jvp(t: Any, out: Any, x: Any, y: Any) -> Any:
        wx, wy = weights(x, y)
        return tangent_sum(t, lambda tx: tx * wx, lambda ty: ty * wy)

    return {"vjp": vjp, "jvp": jvp}


def _copysign_factor(x: Any, y: Any) -> Any:
    # d/dx copysign(x, y) = sign(x) * (+-1 by y's sign bit): 0 at x == 0, as abs'(0).
    return sign(x) * copysign(1.0, y)


# Special points (see fastgrad.core.primitive.Point): the jumps (x a multiple of y for the
# remainders, integers for trunc, 0 for heaviside), ties of fmax and fmin, nan operands
# (which fmax and fmin ignore), zero, infinite and nan divisors.
inf, nan = float("inf"), float("nan")
_jump = functools.partial(at, convention="piecewise-constant")
_rem_jump = functools.partial(at, convention="remainder-at-jumps")
# Where the value is NaN (a zero divisor, an infinite dividend, a NaN), d/dy is NaN and the
# orders 2 and 3 are 0, as everywhere (the "nan-inputs" convention).
_undefined = functools.partial(at, convention="nan-inputs")
_REMAINDER_POINTS = points(
    (7.0, 3.0),
    (-7.0, 3.0),
    (7.0, -3.0),
    (0.5, 3.0),
    _rem_jump(6.0, 3.0),
    _rem_jump(-6.0, 3.0),
    (7.0, inf),
    _undefined(inf, 3.0),
    _undefined(7.0, 0.0),
    _undefined(nan, 3.0),
    _undefined(7.0, nan),
)
_EXTREMUM_POINTS = (
    *(
        at(x, y, convention="maximum-minimum-ties")
        for x, y in ((1.0, 1.0), (0.0, -0.0), (inf, inf), (-inf, -inf))
    ),
    *points((1.0, 2.0), (2.0, 1.0), (inf, 1.0), (-inf, 1.0), (nan, nan)),
    at(nan, 1.0, convention="nan-inputs"),
    at(1.0, nan, convention="nan-inputs"),
)

# fmt: off
# Numba's float remainder returns +0 where NumPy gives a zero with the sign of y: the
# float loop follows NumPy (fmod, moved by y where the signs differ).
_REMAINDER = (
    "np.remainder({0}, {1}) if {T}(0.5) == 0 else {T}(F + ({1} if ({1} < 0) != (F < 0) "
    "else {T}(0)) if F != 0 else np.copysign({T}(0), {1}))"
).replace("F", "np.fmod({0}, {1})")
elementwise("remainder", np.remainder, _remainder_vjp, ("real", "nonzero"), loop=_REMAINDER,
            jvp=_remainder_jvp,
            special_points=_REMAINDER_POINTS + (_rem_jump(0.0, 3.0), _rem_jump(-0.0, 3.0)))
# Numba's np.fmod rounds integer quotients down, not towards zero: for integers the loop
# corrects Python's remainder instead ({T}(0.5) != 0 holds for float types only, so the
# branch is known when the loop compiles).
elementwise("fmod", np.fmod, _remainder_vjp, ("real", "nonzero"), jvp=_remainder_jvp,
            loop="np.fmod({0}, {1}) if {T}(0.5) != 0 else np.remainder({0}, {1}) - ({1} if "
                 "np.remainder({0}, {1}) != 0 and ({0} < 0) != ({1} < 0) else {T}(0))",
            special_points=_REMAINDER_POINTS + points((0.0, 3.0), (-0.0, 3.0)))
# Numba's float floor_divide differs from NumPy's at infinities: the float loop follows
# NumPy's own algorithm (the quotient of x - fmod(x, y), corrected by one where the signs
# differ, then rounded), the integer loop is Numba's, which agrees but for MIN // -1
# (Numba 0, NumPy MIN: the negation wraps).
_QUOTIENT = ("(({0} - np.fmod({0}, {1})) / {1} - ({T}(1) if np.fmod({0}, {1}) != 0 and "
             "(({1} < 0) != (np.fmod({0}, {1}) < 0)) else {T}(0)))")
_FLOOR_DIVIDE = (
    "({T}(-{0}) if {1} == -1 else np.floor_divide({0}, {1})) if {T}(0.5) == 0 else "
    "{T}({0} / {1} if {1} == 0 else "
    "((np.floor(Q) + ({T}(1) if Q - np.floor(Q) > 0.5 else {T}(0))) if Q != 0 else "
    "np.copysign({T}(0), {0} / {1})))"
).replace("Q", _QUOTIENT)
elementwise("floor_divide", np.floor_divide, _no_derivative, ("real", "nonzero"),
            loop=_FLOOR_DIVIDE, jvp=_no_tangent,
            special_points=points((7.0, 2.0), (-7.0, 2.0), _jump(6.0, 3.0), _jump(-0.0, 3.0),
                                  _jump(7.0, 0.0), _jump(0.0, 0.0), _jump(nan, 2.0),
                                  _jump(7.0, nan)))
elementwise("trunc", np.trunc, _no_derivative, jvp=_no_tangent,
            special_points=points(1.3, -1.3, 0.0, -0.0, 0.7, _jump(2.0), _jump(-2.0), inf,
                                  -inf, nan))
# At a tie (0.0 and -0.0 too) NumPy's fmax and fmin return the second operand.
elementwise("fmax", np.fmax, loop="{0} if {0} > {1} or {1} != {1} else {1}",
            special_points=_EXTREMUM_POINTS, **_extremum_rules(_fmax_weights))
elementwise("fmin", np.fmin, loop="{0} if {0} < {1} or {1} != {1} else {1}",
            special_points=_EXTREMUM_POINTS, **_extremum_rules(_fmin_weights))
elementwise("copysign", np.copysign,
            lambda g, out, x, y: (g * _copysign_factor(x, y), None), ("nonzero", "nonzero"),
            jvp=lambda t, out, x, y: None if t[0] is None else t[0] * _copysign_factor(x, y),
            special_points=points((1.5, -1.0), (-2.0, 1.0), (1.5, 2.0), (inf, -1.0),
                                  (-inf, 2.0), (nan, 1.0), at(0.0, 1.0, convention="abs-at-zero"),
                                  at(-0.0, -1.0, convention="abs-at-zero"), _jump(1.5, 0.0)))
# heaviside(x, h0) is 0 below 0, 1 above, h0 at 0 (NaN for NaN): only h0 has a derivative,
# 1 where x == 0.
elementwise("heaviside", np.heaviside,
            lambda g, out, x, h0: (None, where(x == 0, g, 0.0)), ("nonzero", "real"),
            loop="{T}({1}) if {0} == 0 else ({T}({0} > 0) if {0} == {0} else {T}({0}))",
            jvp=lambda t, out, x, h0: None if t[1] is None else where(x == 0, t[1], 0.0),
            special_points=points((-1.0, 0.5), (2.0, 0.5), _jump(0.0, 0.5), _jump(-0.0, 0.5),
                                  (inf, 0.5), (-inf, 0.5), (nan, 0.5), (2.0, nan)))
# fmt: on


# ---------------------------------------------------------------- functions


def remainder(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.remainder`` (the sign of `y`, like Python's ``%``), with
    broadcasting. d/dx is 1 and d/dy is -floor(x / y), as NumPy rounds it.

    >>> remainder(np.array([-7.0, 7.0]), 3.0)
    array([2., 1.])
    """
    return apply_elementwise("remainder", x, y)


def fmod(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.fmod`` (the sign of `x`, like C's fmod), with broadcasting.

    >>> fmod(np.array([-7.0, 7.0]), 3.0)
    array([-1.,  1.])
    """
    return apply_elementwise("fmod", x, y)


def floor_divide(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.floor_divide`` (Python's ``//``), with broadcasting. Piecewise
    constant: its derivative is 0.

    >>> floor_divide(np.array([-7.0, 7.0]), 2.0)
    array([-4.,  3.])
    """
    return apply_elementwise("floor_divide", x, y)


def trunc(x: Any) -> Any:
    """Elementwise ``numpy.trunc`` (round towards zero); derivative 0.

    >>> trunc(np.array([-1.7, 1.7])), fg.grad(trunc)(1.7)
    (array([-1.,  1.]), array(0.))
    """
    return apply_elementwise("trunc", x)


def fmax(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.fmax``: the maximum, ignoring a NaN operand. Ties split the
    gradient equally, as `maximum`; where one operand is NaN the other gets it all.

    >>> fmax(np.array([1.0, np.nan]), np.array([np.nan, 2.0]))
    array([1., 2.])
    """
    return apply_elementwise("fmax", x, y)


def fmin(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.fmin``: the minimum, ignoring a NaN operand (gradient as `fmax`).

    >>> fmin(np.array([1.0, np.nan]), np.array([2.0, 3.0]))
    array([1., 3.])
    >>> fg.grad(fmin, argnums=1)(np.nan, 3.0)
    array(1.)
    """
    return apply_elementwise("fmin", x, y)


def copysign(x: Any, y: Any) -> Any:
    """Elementwise ``numpy.copysign``: abs(x) with the sign of `y`. d/dx is 0 at x == 0 (as
    `abs`), d/dy is 0.

    >>> copysign(np.array([1.5, -2.0]), -1.0)
    array([-1.5, -2. ])
    """
    return apply_elementwise("copysign", x, y)


def heaviside(x: Any, h0: Any) -> Any:
    """Elementwise ``numpy.heaviside``: 0 where x < 0, 1 where x > 0, `h0` where x == 0.

    >>> heaviside(np.array([-1.0, 0.0, 2.0]), 0.5)
    array([0. , 0.5, 1. ])
    """
    return apply_elementwise("heaviside", x, h0)


mod = remainder


def round(x: Any, decimals: int = 0) -> Any:
    """Round to `decimals` places, halves to even, as ``numpy.round``; derivative 0.

    >>> round(np.array([0.125, 2.5, 1234.5]), 2)
    array([1.2000e-01, 2.5000e+00, 1.2345e+03])
    """
    decimals = operator.index(decimals)
    if aval_of(x).dtype.kind != "f":
        if decimals >= 0:
            return x if isinstance(x, Tracer) else np.asarray(x)
        raise TypeError("round: integers to negative decimals are not supported")
    # NumPy's way: scale by a power of ten, round to an integer, scale back.
    scale = 10.0 ** builtins.abs(decimals)
    if decimals >= 0:
        return rint(x * scale) / scale
    return rint(x / scale) * scale


around = round
