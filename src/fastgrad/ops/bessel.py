"""scipy.special: Bessel functions of real order v, jv, yv, iv, kv and the exponentially
scaled ive, kve, with j0, j1, y0, y1, k0, k1, k0e, k1e. Records and functions; public under
fastgrad.scipy.special.

Each record is a library call into SciPy; its derivative in x is a recurrence in the order
(e.g. jv' = (j(v-1) - j(v+1)) / 2), so every order of derivative is more of the same
calls. There is no derivative in the order v: asking for one raises.
"""

from __future__ import annotations

import math
from typing import Any

from fastgrad.core.primitive import Point, at, points
from fastgrad.ops.elementwise import abs, sign, where
from fastgrad.ops.math import cosh, sinh
from fastgrad.ops.special import _apply, quiet
from fastgrad.ops.special_incomplete import held_fixed, scipy_special

__all__: list[str] = []  # public under fastgrad.scipy.special
inf, nan = math.inf, math.nan


def _bessel(name: str, derivative: Any, special_points: tuple[Point, ...]) -> None:
    scipy_special(name, *held_fixed(name, ["v"], derivative), ("real", "positive"), special_points)


def _ive_derivative(out: Any, v: Any, x: Any) -> Any:
    """d/dx exp(-abs(x)) iv(v, x). Off 0 it is (ive(v-1) + ive(v+1)) / 2 - sign(x) ive(v).
    Below 1/4 in magnitude it is written with the analytic cosh(x) iv and the kinked
    sign(x) sinh(x) iv, as i0e's and i1e's are: at 0, where exp(-abs(x)) has a kink, every
    order is then the average of the two one-sided derivatives (the scaled-bessel-at-zero
    row; the form off 0 would give iv's own derivatives there, ive''(0, 0) = 1/2 for 3/2)."""
    small = abs(x) < 0.25
    xs = where(small, x, 0.125)
    value, slope = iv(v, xs), (iv(v - 1.0, xs) + iv(v + 1.0, xs)) * 0.5
    near = sinh(xs) * value + cosh(xs) * slope - sign(xs) * (cosh(xs) * value + sinh(xs) * slope)
    xa = where(small, 1.0, x)
    away = (ive(v - 1.0, xa) + ive(v + 1.0, xa)) * 0.5 - sign(xa) * ive(v, xa)
    return where(small, near, away)


# Special points (v, x): x at 0 (the value 1, 0 or a pole as v is 0, positive or the second
# kind; the derivative infinite for 0 < v < 1), integer, half-integer and negative orders,
# negative x (nan for non-integer orders), large x, infinities and nan.
_COMMON = (
    (0.0, 1.0),
    (1.0, 2.0),
    (0.5, 1.5),
    (2.5, 30.0),
    (-1.0, 2.0),
    (-0.5, 2.0),
    (0.5, 0.0),
    (0.0, inf),
    (0.0, nan),
)
_AT_ZERO = ((0.0, 0.0), (1.0, 0.0), (2.0, 0.0))
_FIRST_KIND = points(*_COMMON, *_AT_ZERO, (1.0, -2.0), (0.5, -1.0), (0.0, 1e3))
_SECOND_KIND = points(*_COMMON, *_AT_ZERO, (0.0, -1.0), (0.0, 1e3))
# fmt: off
_bessel("jv", lambda out, v, x: (jv(v - 1.0, x) - jv(v + 1.0, x)) * 0.5, _FIRST_KIND)
_bessel("yv", lambda out, v, x: (yv(v - 1.0, x) - yv(v + 1.0, x)) * 0.5, _SECOND_KIND)
_bessel("iv", lambda out, v, x: (iv(v - 1.0, x) + iv(v + 1.0, x)) * 0.5,
        points(*_COMMON, *_AT_ZERO, (1.0, -2.0), (0.5, -1.0), (0.0, 700.0)))
_bessel("kv", lambda out, v, x: (kv(v - 1.0, x) + kv(v + 1.0, x)) * -0.5,
        points(*_COMMON, *_AT_ZERO, (0.0, -1.0), (0.0, 700.0)))
# ive = exp(-abs(x)) iv and kve = exp(x) kv: the scale's derivative adds -sign(x) ive, kve.
_bessel("ive", _ive_derivative,
        points(*_COMMON, *(at(*p, convention="scaled-bessel-at-zero") for p in _AT_ZERO),
               (1.0, -2.0), (0.5, -1.0), (0.0, 0.125), (1.0, -0.25), (0.0, 1e4)))
_bessel("kve", lambda out, v, x: out - (kve(v - 1.0, x) + kve(v + 1.0, x)) * 0.5,
        points(*_COMMON, *_AT_ZERO, (0.0, -1.0), (0.0, 1e4)))
# fmt: on


@quiet
def jv(v: Any, x: Any) -> Any:
    """The Bessel function of the first kind of real order v. Differentiable in x.

    >>> round(float(jv(0.0, 1.0)), 12)
    0.765197686558
    """
    return _apply("jv", v, x)


@quiet
def yv(v: Any, x: Any) -> Any:
    """The Bessel function of the second kind of real order v. Differentiable in x.

    >>> round(float(yv(0.0, 1.0)), 12)
    0.088256964216
    """
    return _apply("yv", v, x)


@quiet
def iv(v: Any, x: Any) -> Any:
    """The modified Bessel function of the first kind of real order v. Differentiable in x.

    >>> round(float(iv(1.0, 1.0)), 12)
    0.565159103992
    """
    return _apply("iv", v, x)


@quiet
def kv(v: Any, x: Any) -> Any:
    """The modified Bessel function of the second kind of real order v. Differentiable in x.

    >>> round(float(kv(0.0, 1.0)), 12)
    0.421024438241
    """
    return _apply("kv", v, x)


@quiet
def ive(v: Any, x: Any) -> Any:
    """exp(-abs(x)) iv(v, x), without overflow for large x. Differentiable in x.

    >>> round(float(ive(0.0, 1.0)), 12)
    0.465759607594
    """
    return _apply("ive", v, x)


@quiet
def kve(v: Any, x: Any) -> Any:
    """exp(x) kv(v, x), without underflow for large x. Differentiable in x.

    >>> round(float(kve(0.0, 1.0)), 12)
    1.144463079807
    """
    return _apply("kve", v, x)


def j0(x: Any) -> Any:
    """jv(0, x).

    >>> round(float(j0(1.0)), 12)
    0.765197686558
    """
    return jv(0.0, x)


def j1(x: Any) -> Any:
    """jv(1, x).

    >>> round(float(j1(1.0)), 12)
    0.440050585745
    """
    return jv(1.0, x)


def y0(x: Any) -> Any:
    """yv(0, x).

    >>> round(float(y0(1.0)), 12)
    0.088256964216
    """
    return yv(0.0, x)


def y1(x: Any) -> Any:
    """yv(1, x).

    >>> round(float(y1(1.0)), 12)
    -0.7812128213
    """
    return yv(1.0, x)


def k0(x: Any) -> Any:
    """kv(0, x).

    >>> round(float(k0(1.0)), 12)
    0.421024438241
    """
    return kv(0.0, x)


def k1(x: Any) -> Any:
    """kv(1, x).

    >>> round(float(k1(1.0)), 12)
    0.601907230197
    """
    return kv(1.0, x)


def k0e(x: Any) -> Any:
    """kve(0, x) = exp(x) k0(x).

    >>> round(float(k0e(1.0)), 12)
    1.144463079807
    """
    return kve(0.0, x)


def k1e(x: Any) -> Any:
    """kve(1, x) = exp(x) k1(x).

    >>> round(float(k1e(1.0)), 12)
    1.636153486263
    """
    return kve(1.0, x)
