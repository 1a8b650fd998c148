"""scipy.special: incomplete gamma and beta functions, erfcx and zeta. Records and
functions; public under fastgrad.scipy.special.

Each is a library call into SciPy (imported when it first runs). They are differentiable,
at every order, in the argument their derivative is elementary in (x, or q for zeta); in
their shape parameters the derivative has no closed form, and asking for it raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.core.primitive import NoDerivative, Point, Primitive, points, register
from fastgrad.ops.base import batch_stacked
from fastgrad.ops.elementwise import where
from fastgrad.ops.math import exp
from fastgrad.ops.special import (
    _apply,
    _same_float_eval,
    betaln,
    gammaln,
    quiet,
    xlog1py,
    xlogy,
)

__all__: list[str] = []  # public under fastgrad.scipy.special

_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)
inf, nan = math.inf, math.nan


def scipy_special(
    name: str,
    vjp: Callable[..., Any],
    jvp: Callable[..., Any],
    domain: tuple[str, ...],
    special_points: tuple[Point, ...] = (),
    scipy_name: str | None = None,
) -> Primitive:
    """Register an elementwise function computed by SciPy's ufunc `scipy_name` (`name` by
    default) as a library call over whole arrays, its result in the operands' dtype."""
    ufunc_name = scipy_name or name

    def impl(*xs: np.ndarray) -> np.ndarray:
        import scipy.special  # here, not at the top: importing fastgrad does not load SciPy

        return np.asarray(getattr(scipy.special, ufunc_name)(*xs)).astype(xs[0].dtype, copy=False)

    return register(
        Primitive(
            name,
            _same_float_eval(name),
            impl,
            vjp,
            jvp,
            batch_stacked(name),
            domain=domain,
            special_points=special_points,
        )
    )


def held_fixed(
    name: str, fixed: Sequence[str], derivative: Callable[..., Any]
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """VJP and JVP of f(p1, ..., x) whose derivative in its last operand x is
    `derivative(out, p1, ..., x)` and which has none in the parameters p1, ... (named
    `fixed` in the error a gradient flowing to one of them raises)."""

    def missing(param: str) -> NoDerivative:
        return NoDerivative(
            f"{name}: no derivative with respect to its argument {param} (it has no closed "
            f"form here). Only {name}'s last argument is differentiable: hold {param} fixed, "
            f"e.g. with fg.stop_gradient({param}), if no gradient needs to flow through it."
        )

    def vjp(g: Any, out: Any, *args: Any) -> tuple[Any, ...]:
        return (*(missing(p) for p in fixed), g * derivative(out, *args))

    def jvp(t: Sequence[Any], out: Any, *args: Any) -> Any:
        for tangent, param in zip(t[:-1], fixed, strict=True):
            if tangent is not None:
                raise missing(param).error()
        return None if t[-1] is None else t[-1] * derivative(out, *args)

    return vjp, jvp


def _away_from_inf(x: Any, f: Callable[[Any], Any], at_inf: float) -> Any:
    """f(x), or `at_inf` where x is +inf (f is computed on a safe stand-in there, so that no
    inf - inf leaks into its derivatives)."""
    infinite = x == math.inf
    return where(infinite, at_inf, f(where(infinite, 1.0, x)))


def _gamma_density(out: Any, a: Any, x: Any) -> Any:
    # d/dx P(a, x) = x^(a-1) e^(-x) / Gamma(a); xlogy keeps a == 1 at x == 0 finite.
    return _away_from_inf(x, lambda x: exp(xlogy(a - 1.0, x) - x - gammaln(a)), 0.0)


def _beta_density(out: Any, a: Any, b: Any, x: Any) -> Any:
    # d/dx I_x(a, b) = x^(a-1) (1-x)^(b-1) / B(a, b)
    return exp(xlogy(a - 1.0, x) + xlog1py(b - 1.0, -x) - betaln(a, b))


def _erfcx_derivative(out: Any, x: Any) -> Any:
    # erfcx(x) = exp(x^2) erfc(x), so erfcx' = 2 x erfcx - 2/sqrt(pi), with limit 0 at +inf.
    return _away_from_inf(x, lambda x: x * out * 2.0 - _TWO_OVER_SQRT_PI, 0.0)


def _no_derivative(name: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """VJP and JVP of a one-operand function with no derivative available."""
    missing = NoDerivative(
        f"{name}: no derivative with respect to x (SciPy has no function for it). Wrap "
        f"the argument in fg.stop_gradient if no gradient needs to flow through it."
    )

    def jvp(t: Sequence[Any], out: Any, x: Any) -> Any:
        raise missing.error()

    return (lambda g, out, x: (missing,)), jvp


# fmt: off
scipy_special("gammainc", *held_fixed("gammainc", ["a"], _gamma_density),
              ("positive", "positive"))
scipy_special("gammaincc", *held_fixed("gammaincc", ["a"], lambda *xs: -_gamma_density(*xs)),
              ("positive", "positive"))
scipy_special("betainc", *held_fixed("betainc", ["a", "b"], _beta_density),
              ("positive", "positive", "unit_interval"))
scipy_special("erfcx", *held_fixed("erfcx", [], _erfcx_derivative), ("real",),
              points(0.0, -0.0, 0.5, -3.0, 5.0, 30.0, -26.0, -27.0, 1e-300, inf, -inf, nan))
# Hurwitz's zeta(x, q): d/dq = -x zeta(x + 1, q); Riemann's zeta(x) (also for x < 1).
scipy_special("zeta", *held_fixed("zeta", ["x"], lambda out, x, q: -x * zeta(x + 1.0, q)),
              ("above_one", "positive"))
scipy_special("riemann_zeta", *_no_derivative("zeta"), ("above_one",), scipy_name="zeta")
# fmt: on


@quiet
def gammainc(a: Any, x: Any) -> Any:
    """The regularized lower incomplete gamma function P(a, x), the integral of
    t^(a-1) e^(-t) from 0 to x over Gamma(a). Differentiable in x; not in a (raises).

    >>> round(float(gammainc(2.0, 1.0)), 12)  # 1 - 2/e
    0.264241117657
    """
    return _apply("gammainc", a, x)


@quiet
def gammaincc(a: Any, x: Any) -> Any:
    """The regularized upper incomplete gamma function Q(a, x) = 1 - P(a, x).
    Differentiable in x; not in a (raises).

    >>> round(float(gammaincc(2.0, 1.0)), 12)  # 2/e
    0.735758882343
    """
    return _apply("gammaincc", a, x)


@quiet
def betainc(a: Any, b: Any, x: Any) -> Any:
    """The regularized incomplete beta function I_x(a, b), the integral of
    t^(a-1) (1-t)^(b-1) from 0 to x over B(a, b). Differentiable in x; not in a, b (raises).

    >>> float(betainc(2.0, 3.0, 0.5))
    0.6875
    """
    return _apply("betainc", a, b, x)


@quiet
def erfcx(x: Any) -> Any:
    """The scaled complementary error function exp(x^2) erfc(x), without overflow for
    large x.

    >>> round(float(erfcx(1.0)), 12)
    0.427583576156
    """
    return _apply("erfcx", x)


@quiet
def zeta(x: Any, q: Any = None) -> Any:
    """The Hurwitz zeta function, the sum over n >= 0 of (n + q)^-x; with q=None Riemann's
    zeta function (defined for x < 1 too). Differentiable in q; not in x (raises).

    >>> round(float(zeta(2.0)), 12)  # pi^2 / 6
    1.644934066848
    >>> round(float(zeta(2.0, 2.0)), 12)  # pi^2 / 6 - 1
    0.644934066848
    """
    if q is None:
        return _apply("riemann_zeta", x)
    return _apply("zeta", x, q)
