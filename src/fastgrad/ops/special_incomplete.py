"""scipy.special: incomplete gamma and beta functions, Student's t CDF, their inverses,
erfcx and zeta. Records and functions; public under fastgrad.scipy.special.

Each is a library call into SciPy (imported when it first runs). They are differentiable,
at every order, in the argument their derivative is elementary in (x, y, t, p, or q for zeta); in
their shape parameters the derivative has no closed form, and asking for it raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.core.primitive import NoDerivative, Point, Primitive, points, register
from fastgrad.ops.base import batch_stacked
from fastgrad.ops.elementwise import abs, where
from fastgrad.ops.entropy import xlog1py, xlogy
from fastgrad.ops.math import exp, log, log1p, power
from fastgrad.ops.special import (
    _apply,
    _same_float_eval,
    betaln,
    gammaln,
    quiet,
)

__all__: list[str] = []  # public under fastgrad.scipy.special

_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)
inf, nan = math.inf, math.nan


def scipy_special(
    name: str,
    vjp: Callable[..., Any],
    jvp: Callable[..., Any],
    fixed: tuple[int, ...],
    domain: tuple[str, ...],
    special_points: tuple[Point, ...] = (),
    scipy_name: str | None = None,
) -> Primitive:
    """Register an elementwise function computed by SciPy's ufunc `scipy_name` (`name` by
    default) as a library call over whole arrays, its result in the operands' dtype, with
    no derivative in its operands `fixed`. SciPy runs in float64: some of its float32
    loops (stdtrit) lose digits."""
    ufunc_name = scipy_name or name

    def impl(*xs: np.ndarray) -> np.ndarray:
        import scipy.special  # here, not at the top: importing fastgrad does not load SciPy

        out = getattr(scipy.special, ufunc_name)(*(x.astype(np.float64) for x in xs))
        return np.asarray(out).astype(xs[0].dtype, copy=False)

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
            held_fixed=fixed,
        )
    )


def held_fixed(
    name: str, fixed: Sequence[str], derivative: Callable[..., Any]
) -> tuple[Callable[..., Any], Callable[..., Any], tuple[int, ...]]:
    """VJP and JVP of f(p1, ..., x) whose derivative in its last operand x is
    `derivative(out, p1, ..., x)` and which has none in the parameters p1, ... (named
    `fixed` in the error a gradient flowing to one of them raises), and their positions."""

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

    return vjp, jvp, tuple(range(len(fixed)))


def _away_from_inf(x: Any, f: Callable[[Any], Any], at_inf: float, both: bool = False) -> Any:
    """f(x), or `at_inf` where x is +inf (or -inf too, with `both`); f is computed on a safe
    stand-in there, so that no inf - inf leaks into its derivatives. An infinite `at_inf`
    is abs(x) itself: its derivatives are infinite too (or nan), where a constant's would
    be a silent 0 (gammaincinv''(a, 1), tests/test_special_points.py)."""
    infinite = (abs(x) if both else x) == math.inf
    edge = abs(x) if at_inf == math.inf else at_inf
    return where(infinite, edge, f(where(infinite, 1.0, x)))


def _at_edges(x: Any, edges: Sequence[float], log_form: Any, power_form: Any) -> Any:
    """A density exp(log_form(x)) away from `edges`, and power_form(x) (its powers of x and
    1 - x written out) at them: there the log's derivatives are infinite (log(x)' at 0)
    and meet the density's 0, inf * 0, where the power's are x**(a-1)'s own (gammainc''(2,
    0) = 1). Each form is computed on a safe stand-in where it is not selected."""
    at_edge = x == edges[0]
    for e in edges[1:]:
        at_edge = at_edge | (x == e)
    middle = sum(edges) / len(edges) if len(edges) > 1 else 1.0
    return where(at_edge, power_form(where(at_edge, x, middle)),
                 exp(log_form(where(at_edge, middle, x))))  # fmt: skip


# The log densities whose integrals these functions are (also scipy.stats' log densities).


def gamma_log_density(a: Any, x: Any) -> Any:
    """log(x^(a-1) e^(-x) / Gamma(a)) for x >= 0; xlogy keeps a == 1 at x == 0 finite."""
    return xlogy(a - 1.0, x) - x - gammaln(a)


def beta_log_density(a: Any, b: Any, x: Any) -> Any:
    """log(x^(a-1) (1-x)^(b-1) / B(a, b)) for x in [0, 1]."""
    return xlogy(a - 1.0, x) + xlog1py(b - 1.0, -x) - betaln(a, b)


def t_log_density(df: Any, t: Any) -> Any:
    """The log density of Student's t distribution with df degrees of freedom."""
    # 1 / (sqrt(df) B(df/2, 1/2)) (1 + t^2/df)^-((df+1)/2): betaln, not the difference of
    # two gammaln, which cancels digits at large df (float32 stdtrit' at df = 1000: 1e-4).
    return -betaln(df * 0.5, 0.5) - 0.5 * log(df) - (df + 1.0) * 0.5 * log1p(t * t / df)


def _gamma_density(out: Any, a: Any, x: Any) -> Any:
    # d/dx P(a, x), 0 at x = +inf
    def density(x: Any) -> Any:
        return _at_edges(x, (0.0,), lambda x: gamma_log_density(a, x),
                         lambda x: power(x, a - 1.0) * exp(-x - gammaln(a)))  # fmt: skip

    return _away_from_inf(x, density, 0.0)


def _beta_density(out: Any, a: Any, b: Any, x: Any) -> Any:
    # d/dx I_x(a, b)
    return _at_edges(
        x,
        (0.0, 1.0),
        lambda x: beta_log_density(a, b, x),
        lambda x: power(x, a - 1.0) * power(1.0 - x, b - 1.0) * exp(-betaln(a, b)),
    )


def _inverse_gamma_slope(out: Any, a: Any, y: Any) -> Any:
    # d/dy P^-1(a, y) = 1 / P'(a, out), infinite where out is (y = 1)
    return _away_from_inf(out, lambda x: exp(-gamma_log_density(a, x)), math.inf)


def _erfcx_derivative(out: Any, x: Any) -> Any:
    # erfcx(x) = exp(x^2) erfc(x), so erfcx' = 2 x erfcx - 2/sqrt(pi), with limit 0 at +inf.
    return _away_from_inf(x, lambda x: x * out * 2.0 - _TWO_OVER_SQRT_PI, 0.0)


def _t_density(out: Any, df: Any, t: Any) -> Any:
    return _away_from_inf(t, lambda t: exp(t_log_density(df, t)), 0.0, both=True)


def _inverse_t_slope(out: Any, df: Any, p: Any) -> Any:
    return _away_from_inf(out, lambda t: exp(-t_log_density(df, t)), math.inf, both=True)


def _no_derivative(name: str) -> tuple[Callable[..., Any], Callable[..., Any], tuple[int]]:
    """VJP and JVP of a one-operand function with no derivative available."""
    missing = NoDerivative(
        f"{name}: no derivative with respect to x (SciPy has no function for it). Wrap "
        f"the argument in fg.stop_gradient if no gradient needs to flow through it."
    )

    def jvp(t: Sequence[Any], out: Any, x: Any) -> Any:
        raise missing.error()

    return (lambda g, out, x: (missing,)), jvp, (0,)


# Special points (a, x): x at 0 (where the derivative is 1, 0 or infinite as a is 1, above
# or below 1) and at the edges of the domain, integer and half-integer shapes, large x and
# large shapes, tiny x, infinities and nan.
_GAMMA_POINTS = points(
    (1.0, 0.0),
    (0.5, 0.0),
    (2.0, 0.0),
    (2.5, 1.5),
    (0.5, 2.0),
    (3.0, 3.0),
    (2.0, 50.0),
    (100.0, 100.0),
    (0.5, 1e-30),
    (2.0, -1.0),
    (1.0, inf),
    (2.0, nan),
)
# (At y = 0 with a = 1/n, x ~ y**n: orders 2 and up are finite but come out nan, as
# slope'(0) * 0 = inf * 0; at other a < 1 they diverge, as tested at a = 0.75.)
_GAMMA_INVERSE_POINTS = points(
    (2.0, 0.5),
    (0.5, 0.25),
    (1.0, 0.0),
    (2.0, 0.0),
    (0.75, 0.0),
    (2.0, 1.0),
    (3.0, 1e-10),
    (2.0, 0.999),
    (100.0, 0.5),
    (2.0, 1.5),
    (2.0, nan),
)
_BETA_POINTS = points(
    (2.0, 3.0, 0.5),
    (0.5, 0.5, 0.25),
    (1.0, 1.0, 0.0),
    (0.5, 2.0, 0.0),
    (2.0, 0.5, 1.0),
    (2.0, 3.0, 1.0),
    (2.0, 3.0, 0.0),
    (1.0, 1.0, 1.0),
    (50.0, 50.0, 0.5),
    (2.0, 3.0, 1.5),
    (2.0, 3.0, nan),
)
_BETA_INVERSE_POINTS = points(
    (2.0, 3.0, 0.6875),
    (0.5, 0.5, 0.5),
    (2.0, 3.0, 0.0),
    (2.0, 3.0, 1.0),
    (1.0, 1.0, 0.25),
    (50.0, 50.0, 0.5),
    (2.0, 3.0, 1.5),
    (2.0, 3.0, nan),
)
_T_POINTS = points(
    (3.0, 0.0),
    (1.0, 1.0),
    (2.5, 2.0),
    (0.5, -3.0),
    (1000.0, 0.5),
    (1.0, -1e10),
    (1.0, inf),
    (3.0, -inf),
    (3.0, nan),
)
_T_INVERSE_POINTS = points(
    (3.0, 0.5),
    (1.0, 0.75),
    (2.5, 0.125),
    (3.0, 1e-10),
    (1.0, 0.0),
    (1.0, 1.0),
    (1000.0, 0.5),
    (3.0, 1.5),
    (3.0, nan),
)
# Hurwitz's zeta at integer and half-integer x, q near its pole at 0 and large, x at its
# pole 1; Riemann's at its pole, its trivial zero -2, x < 1, large x.
_ZETA_POINTS = points(
    (2.0, 1.0),
    (2.0, 2.0),
    (3.0, 0.5),
    (1.5, 0.001),
    (2.0, 1e10),
    (2.0, 0.0),
    (1.0, 1.0),
    (2.0, inf),
    (2.0, nan),
)
_RIEMANN_POINTS = points(2.0, 0.0, -1.0, 0.5, 1.0, -2.0, 50.0, inf, nan)

scipy_special(
    "gammainc",
    *held_fixed("gammainc", ["a"], _gamma_density),
    ("positive", "positive"),
    _GAMMA_POINTS,
)
scipy_special(
    "gammaincc",
    *held_fixed("gammaincc", ["a"], lambda *xs: -_gamma_density(*xs)),
    ("positive", "positive"),
    _GAMMA_POINTS,
)
scipy_special(
    "gammaincinv",
    *held_fixed("gammaincinv", ["a"], _inverse_gamma_slope),
    ("positive", "unit_interval"),
    _GAMMA_INVERSE_POINTS,
)
scipy_special(
    "gammainccinv",
    *held_fixed("gammainccinv", ["a"], lambda *xs: -_inverse_gamma_slope(*xs)),
    ("positive", "unit_interval"),
    _GAMMA_INVERSE_POINTS,
)
scipy_special(
    "betainc",
    *held_fixed("betainc", ["a", "b"], _beta_density),
    ("positive", "positive", "unit_interval"),
    _BETA_POINTS,
)
scipy_special(
    "betaincinv",
    *held_fixed("betaincinv", ["a", "b"], lambda out, a, b, y: exp(-beta_log_density(a, b, out))),
    ("positive", "positive", "unit_interval"),
    _BETA_INVERSE_POINTS,
)
scipy_special("stdtr", *held_fixed("stdtr", ["df"], _t_density), ("positive", "real"), _T_POINTS)
scipy_special(
    "stdtrit",
    *held_fixed("stdtrit", ["df"], _inverse_t_slope),
    ("positive", "unit_interval"),
    _T_INVERSE_POINTS,
)
scipy_special(
    "erfcx",
    *held_fixed("erfcx", [], _erfcx_derivative),
    ("real",),
    points(0.0, -0.0, 0.5, -3.0, 5.0, 30.0, -26.0, -27.0, 1e-300, inf, -inf, nan),
)
# Hurwitz's zeta(x, q): d/dq = -x zeta(x + 1, q); Riemann's zeta(x) (also for x < 1).
# At x = 1 zeta is inf for every q: `out * 0.0` makes the derivatives nan there, as they
# are, where -x zeta(x + 1, q) alone is finite.
scipy_special(
    "zeta",
    *held_fixed("zeta", ["x"], lambda out, x, q: -x * zeta(x + 1.0, q) + out * 0.0),
    ("above_one", "positive"),
    _ZETA_POINTS,
)
scipy_special(
    "riemann_zeta", *_no_derivative("zeta"), ("above_one",), _RIEMANN_POINTS, scipy_name="zeta"
)
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
def gammaincinv(a: Any, y: Any) -> Any:
    """The inverse of gammainc in x: the x with gammainc(a, x) = y. Differentiable in y;
    not in a (raises).

    >>> round(float(gammaincinv(2.0, gammainc(2.0, 1.5))), 12)
    1.5
    """
    return _apply("gammaincinv", a, y)


@quiet
def gammainccinv(a: Any, y: Any) -> Any:
    """The inverse of gammaincc in x: the x with gammaincc(a, x) = y. Differentiable in y;
    not in a (raises).

    >>> round(float(gammainccinv(2.0, gammaincc(2.0, 1.5))), 12)
    1.5
    """
    return _apply("gammainccinv", a, y)


@quiet
def betaincinv(a: Any, b: Any, y: Any) -> Any:
    """The inverse of betainc in x: the x with betainc(a, b, x) = y. Differentiable in y;
    not in a, b (raises).

    >>> float(betaincinv(2.0, 3.0, 0.6875))
    0.5
    """
    return _apply("betaincinv", a, b, y)


@quiet
def stdtr(df: Any, t: Any) -> Any:
    """The CDF of Student's t distribution with df degrees of freedom, at t.
    Differentiable in t; not in df (raises).

    >>> float(stdtr(3.0, 0.0))
    0.5
    """
    return _apply("stdtr", df, t)


@quiet
def stdtrit(df: Any, p: Any) -> Any:
    """The inverse of stdtr in t: the p-th quantile of Student's t distribution.
    Differentiable in p; not in df (raises).

    >>> round(float(stdtrit(1.0, 0.75)), 12)  # Cauchy's quartile
    1.0
    """
    return _apply("stdtrit", df, p)


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
