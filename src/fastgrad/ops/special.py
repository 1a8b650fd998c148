"""scipy.special: error and gamma functions, scaled Bessel functions and the logistic
functions. Records and functions; public under fastgrad.scipy.special (log-sum-exp and
softmax are in ops.log_sum_exp; xlogy and the information measures in ops.entropy).

Functions with no closed form here (erf, gammaln, digamma, ...) are primitives whose NumPy
reference is SciPy's ufunc: a fused loop has no scalar version of them yet, so each runs as
a library call over whole arrays. Their derivatives are written with these primitives and
fastgrad's math, so every order works. The others (expit, logit, ndtr, ...)
are exact compositions of existing ops and fuse with the code around them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import REGISTRY, Point, Primitive, at, points, register
from fastgrad.core.tracing import Tracer, aval_of, bind, is_python_scalar
from fastgrad.ops.base import (
    astype,
    batch_stacked,
    broadcast_shapes,
    coerce,
    promote,
    tangent_sum,
)
from fastgrad.ops.elementwise import (
    abs,
    sign,
    where,
)
from fastgrad.ops.math import exp, log, log1p, log_sigmoid, sigmoid

__all__: list[str] = []  # public under fastgrad.scipy.special

F = TypeVar("F", bound=Callable[..., Any])
_SQRT_PI = math.sqrt(math.pi)
_SQRT_2PI = math.sqrt(2 * math.pi)

# ---------------------------------------------------------------- records


def _same_float_eval(name: str) -> Callable[..., Aval]:
    def abstract_eval(*avals: Aval) -> Aval:
        first = avals[0]
        if any(a.shape != first.shape or a.dtype != first.dtype for a in avals):
            raise ValueError(f"{name} needs operands of one shape and dtype, got {avals}")
        if first.dtype.kind != "f":
            raise TypeError(f"{name} needs float operands, got {first}")
        return Aval(first.shape, first.dtype, weak=all(a.weak for a in avals))

    return abstract_eval


class _SciPySpecial:
    """scipy.special's functions by name, each importing SciPy when it first runs
    (importing scipy.special takes longer than importing all of fastgrad, and most
    programs call none of them)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            import scipy.special

            return getattr(scipy.special, name)(*args)

        call.__name__ = call.__qualname__ = name
        return call


sp = _SciPySpecial()


def _scipy_impl(fn: Any) -> Callable[..., np.ndarray]:
    # SciPy computes some functions (polygamma) in float64 only; results keep the
    # operands' dtype, as every fastgrad op does.
    return lambda *xs: np.asarray(fn(*xs)).astype(xs[0].dtype, copy=False)


def special(
    name: str,
    fn: Any,
    vjp: Callable[..., Any],
    jvp: Callable[..., Any],
    domain: tuple[str, ...],
    special_points: tuple[Point, ...],
) -> Primitive:
    """Register an elementwise function computed by SciPy as a library call (kind "other":
    a fused loop has no scalar version of it)."""
    return register(
        Primitive(
            name,
            _same_float_eval(name),
            _scipy_impl(fn),
            vjp,
            jvp,
            batch_stacked(name),
            domain=domain,
            special_points=special_points,
        )
    )


def _unary(
    name: str,
    fn: Any,
    derivative: Callable[[Any, Any], Any],
    domain: str,
    special_points: tuple[Point, ...],
) -> None:
    """A one-operand function whose derivative is `derivative(out, x)`."""
    special(
        name,
        fn,
        lambda g, out, x: (g * derivative(out, x),),
        lambda t, out, x: t[0] * derivative(out, x),
        (domain,),
        special_points,
    )


# Special points (see core.primitive.Point): poles, edges of the domain, where the value
# under- or overflows, tiny and huge arguments, infinities and nan.
inf, nan = math.inf, math.nan
_NONFINITE = (inf, -inf, nan)
_ERF = points(0.0, -0.0, 0.5, -3.0, 6.0, 30.0, 1e-300, *_NONFINITE)
# Zeros of gammaln (1, 2) and of digamma (1.46...), poles (0, -0.0, -1), negative
# non-integers, tiny and huge arguments.
_GAMMA = points(1.0, 2.0, 0.5, 1.4616321449683622, 1e-30, 0.0, -0.0, -1.0, -0.5, -2.5,
                25.0, 1e10, 1e300, *_NONFINITE)  # fmt: skip
# The kink at 0 of the factor exp(-abs(x)).
_BESSEL = points(at(0.0, convention="scaled-bessel-at-zero"),
                 at(-0.0, convention="scaled-bessel-at-zero"),
                 1.0, -2.0, 1e-30, -1e-30, 30.0, -700.0, 1e300, *_NONFINITE)  # fmt: skip


def _bessel_series(order: int, size: int) -> list[float]:
    """Coefficients of I_order(x) by powers of x, the first `size`."""
    bessel = [0.0] * size
    for m in range((size - order) // 2):
        k = 2 * m + order
        bessel[k] = 1 / (2**k * math.factorial(m) * math.factorial(m + order))
    return bessel


def _near_zero_series(order: int, odd: bool, degree: int = 18) -> tuple[float, ...]:
    """Coefficients, by powers of x, of d/dx [h(x) I_order(x)] with h = sinh if `odd`
    else cosh (exp(-abs(x)) I_order(x) is cosh(x) I_order(x) - sign(x) sinh(x) I_order(x))."""
    bessel = _bessel_series(order, degree + 2)
    hyper = [1 / math.factorial(k) if k % 2 == odd else 0.0 for k in range(degree + 2)]
    product = [math.fsum(hyper[i] * bessel[k - i] for i in range(k + 1)) for k in range(degree + 2)]
    return tuple((k + 1) * product[k + 1] for k in range(degree + 1))


def _polynomial(coefficients: tuple[float, ...], x: Any) -> Any:
    out = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        out = out * x + c
    return out


def _scaled_bessel_derivative(order: int, away: Callable[[Any], Any]) -> Callable[..., Any]:
    """The derivative of i0e or i1e. Off 0 it is `away(x)`, written with sign(x) and (for
    i1e) 1/x; below 1/4 in magnitude, where 1/x would cost precision in the derivatives
    of the derivative, it is the series of cosh(x) I_n(x) and sinh(x) I_n(x) (exact in
    floating point there). At 0, where the factor exp(-abs(x)) has a kink, every order
    is then the average of the two one-sided derivatives (sign(0) = 0)."""
    analytic, kinked = _near_zero_series(order, False), _near_zero_series(order, True)

    def derivative(out: Any, x: Any) -> Any:
        small = abs(x) < 0.25
        xs = where(small, x, 0.0)
        near = _polynomial(analytic, xs) - sign(x) * _polynomial(kinked, xs)
        return where(small, near, away(where(small, 1.0, x)))

    return derivative


# log_ndtr(x) = -x^2/2 - log(-x) - log(2 pi)/2 + log S(1/x^2) as x -> -inf, with S the
# asymptotic series sum_k (-1)^k (2k-1)!! z^k of the Mills ratio (to 1e-19 below -10).
_LOG_NDTR_TAIL = -10.0
_MILLS = tuple(float((-1) ** k * math.prod(range(1, 2 * k, 2))) for k in range(31))
_MILLS_SLOPE = tuple((k + 1) * c for k, c in enumerate(_MILLS[1:]))


def _log_ndtr_slope(out: Any, x: Any) -> Any:
    """pdf(x) / cdf(x), the derivative of log_ndtr, exact to rounding at every order. As
    exp(-x^2/2 - log_ndtr(x)) it cancels ever more digits in the left tail (and in its own
    derivatives): there it is the derivative of the asymptotic expansion. float32 works in
    float64, where the cancellation near the tail is far below float32's rounding."""
    wide = x if aval_of(x).dtype == np.float64 else astype(x, np.float64)
    tail = wide < _LOG_NDTR_TAIL
    xt = where(tail, wide, _LOG_NDTR_TAIL)
    z = 1.0 / (xt * xt)
    series = _polynomial(_MILLS_SLOPE, z) / _polynomial(_MILLS, z)
    tail_slope = -xt - (1.0 + 2.0 * z * series) / xt
    xs = where(tail, 0.0, wide)
    head_slope = exp(-xs * xs * 0.5 - log_ndtr(xs)) * (1 / _SQRT_2PI)
    return astype(where(tail, tail_slope, head_slope), aval_of(x).dtype)


# fmt: off
_unary("erf", sp.erf, lambda out, x: exp(-x * x) * (2 / _SQRT_PI), "real", _ERF)
_unary("erfc", sp.erfc, lambda out, x: exp(-x * x) * (-2 / _SQRT_PI), "real",
       points(0.0, 0.5, -3.0, 6.0, 26.5, 30.0, -30.0, *_NONFINITE))
_unary("erfinv", sp.erfinv, lambda out, x: exp(out * out) * (_SQRT_PI / 2), "unit",
       points(0.0, 0.5, -0.999999, 1.0, -1.0, 1.5, 1e-300, *_NONFINITE))
_unary("erfcinv", sp.erfcinv, lambda out, x: exp(out * out) * (-_SQRT_PI / 2), "below_two",
       points(1.0, 0.5, 1.5, 2e-10, 0.0, 2.0, 2.5, -0.5, *_NONFINITE))
_unary("ndtri", sp.ndtri, lambda out, x: exp(out * out * 0.5) * _SQRT_2PI, "unit_interval",
       points(0.5, 0.25, 1e-10, 0.0, 1.0, 1.5, *_NONFINITE))
_unary("log_ndtr", sp.log_ndtr, _log_ndtr_slope, "real",
       points(0.0, 2.0, -2.0, -9.5, -10.0, -10.5, -25.0, -40.0, -1e3, -1e10, 10.0, 40.0,
              1e300, *_NONFINITE))
_unary("gammaln", sp.gammaln, lambda out, x: digamma(x), "positive", _GAMMA)
_unary("digamma", sp.digamma, lambda out, x: polygamma(1, x), "positive", _GAMMA)
_unary("gamma", sp.gamma, lambda out, x: out * digamma(x), "positive",
       _GAMMA)
_unary("i0e", sp.i0e, _scaled_bessel_derivative(0, lambda x: i1e(x) - sign(x) * i0e(x)),
       "real", _BESSEL)
_unary("i1e", sp.i1e,
       _scaled_bessel_derivative(1, lambda x: i0e(x) - i1e(x) * (sign(x) + 1.0 / x)),
       "real", _BESSEL)
# fmt: on


def _polygamma_vjp(g: Any, out: Any, n: Any, x: Any) -> tuple[None, Any]:
    return None, g * polygamma(n + 1, x)  # n is an integer order: no gradient


special(
    "polygamma",
    sp.polygamma,
    _polygamma_vjp,
    lambda t, out, n, x: None if t[1] is None else t[1] * polygamma(n + 1, x),
    ("order", "positive"),
    # Orders 0 to 3 (the order has no derivative: as a piecewise constant, 0), negative
    # non-integers, poles at 0 and the negative integers, a large x, inf and nan.
    points((0.0, 0.5), (1.0, 1.0), (2.0, -0.5), (3.0, 25.0), (2.0, -1.5), (1.0, 0.0),
           (2.0, -2.0), (1.0, 1e10), (1.0, inf), (0.0, inf), (1.0, nan)),
)  # fmt: skip


def _beta_partials(a: Any, b: Any) -> tuple[Any, Any]:
    """d/da and d/db of log B(a, b)."""
    both = digamma(a + b)
    return digamma(a) - both, digamma(b) - both


def _log_beta_rule(scale: Callable[[Any], Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """VJP and JVP of a function whose derivative is scale(out) times that of log B(a, b)."""

    def vjp(g: Any, out: Any, a: Any, b: Any) -> tuple[Any, Any]:
        da, db = _beta_partials(a, b)
        return g * scale(out) * da, g * scale(out) * db

    def jvp(t: Any, out: Any, a: Any, b: Any) -> Any:
        da, db = _beta_partials(a, b)
        return tangent_sum(t, lambda ta: ta * da, lambda tb: tb * db) * scale(out)

    return vjp, jvp


# Poles (a or b at 0 or a negative integer), negative non-integers, a tiny and a large
# operand, infinities and nan.
_BETA = points((1.0, 1.0), (0.5, 0.5), (2.0, 3.5), (0.0, 1.0), (-1.0, 2.0), (-0.5, 2.0),
               (1e-30, 1.0), (1e10, 2.0), (inf, 1.0), (nan, 1.0))  # fmt: skip
special("beta", sp.beta, *_log_beta_rule(lambda out: out), ("positive", "positive"), _BETA)
special("betaln", sp.betaln, *_log_beta_rule(lambda out: 1.0), ("positive", "positive"), _BETA)


# ---------------------------------------------------------------- the primitives' functions


def _apply(name: str, *args: Any) -> Any:
    """Apply special function `name` after promoting its operands to one float dtype
    (integers to float64, as SciPy does) and broadcasting them."""
    args = tuple(_as_operand(a) for a in args)
    avals = [aval_of(a) for a in args]
    shape = broadcast_shapes(*(a.shape for a in avals), what=name)
    dtype, _ = promote(avals)
    if dtype.kind != "f":
        if dtype.kind not in "biu":
            raise TypeError(f"{name}: expected real numbers, got dtype {dtype}")
        dtype = np.dtype(np.float64)
    tracing = any(isinstance(a, Tracer) for a in args)
    return bind(
        REGISTRY[name],
        *(coerce(a, v, dtype, shape, tracing) for a, v in zip(args, avals, strict=True)),
    )


def _as_operand(x: Any) -> Any:
    # Python scalars stay weakly typed (they take the other operand's float dtype).
    return x if isinstance(x, Tracer) or is_python_scalar(x) else np.asarray(x)


def erf(x: Any) -> Any:
    """The error function, 2/sqrt(pi) times the integral of exp(-t^2) from 0 to x.

    >>> round(float(erf(0.5)), 10)
    0.5204998778
    """
    return _apply("erf", x)


def erfc(x: Any) -> Any:
    """1 - erf(x), accurate where erf(x) is near 1.

    >>> erfc(np.array([0.0, 10.0])), fg.grad(erfc)(0.0)
    (array([1.00000000e+00, 2.08848758e-45]), array(-1.12837917))
    """
    return _apply("erfc", x)


def erfinv(y: Any) -> Any:
    """The inverse of erf on (-1, 1).

    >>> erfinv(0.5), fg.grad(erfinv)(0.0)
    (array(0.47693628), array(0.88622693))
    """
    return _apply("erfinv", y)


def erfcinv(y: Any) -> Any:
    """The inverse of erfc on (0, 2).

    >>> erfcinv(0.5), fg.grad(erfcinv)(1.0)
    (array(0.47693628), array(-0.88622693))
    """
    return _apply("erfcinv", y)


def ndtri(p: Any) -> Any:
    """The standard normal quantile: the x with ndtr(x) = p.

    >>> ndtri(np.array([0.5, 0.975])), fg.grad(ndtri)(0.5)
    (array([0.        , 1.95996398]), array(2.50662827))
    """
    return _apply("ndtri", p)


def log_ndtr(x: Any) -> Any:
    """log(ndtr(x)), accurate far into the lower tail.

    >>> log_ndtr(-40.0), fg.grad(log_ndtr)(0.0)
    (array(-804.60844201), array(0.79788456))
    """
    return _apply("log_ndtr", x)


def gammaln(x: Any) -> Any:
    """log|Gamma(x)|; its derivative is digamma.

    >>> gammaln(np.array([1.0, 5.0])), fg.grad(gammaln)(1.0)  # -Euler's constant
    (array([0.        , 3.17805383]), array(-0.57721566))
    """
    return _apply("gammaln", x)


def digamma(x: Any) -> Any:
    """d/dx log Gamma(x) (also named psi).

    >>> digamma(1.0), fg.grad(digamma)(1.0)  # pi^2 / 6
    (array(-0.57721566), array(1.64493407))
    """
    return _apply("digamma", x)


psi = digamma


def polygamma(n: Any, x: Any) -> Any:
    """The n-th derivative of digamma; `n` is a nonnegative integer order (no gradient).

    >>> round(float(polygamma(1, 1.0)), 9)  # pi^2 / 6
    1.644934067
    """
    if not isinstance(n, Tracer):
        order = np.asarray(n)
        if order.dtype.kind == "f" and np.any(order != np.floor(order)) or np.any(order < 0):
            raise ValueError(f"polygamma: n must hold nonnegative integers, got {n!r}")
    # The order takes x's dtype: an integer order does not make float32 x float64.
    x = _as_operand(x)
    dtype = aval_of(x).dtype if aval_of(x).dtype.kind == "f" else np.dtype(np.float64)
    return _apply("polygamma", astype(_as_operand(n), dtype), x)


def gamma(x: Any) -> Any:
    """The gamma function.

    >>> gamma(5.0), fg.grad(gamma)(1.0)
    (array(24.), array(-0.57721566))
    """
    return _apply("gamma", x)


def beta(a: Any, b: Any) -> Any:
    """The beta function Gamma(a) Gamma(b) / Gamma(a + b).

    >>> beta(2.0, 3.0), fg.grad(beta)(1.0, 1.0)
    (array(0.08333333), array(-1.))
    """
    return _apply("beta", a, b)


def betaln(a: Any, b: Any) -> Any:
    """log|B(a, b)|, without overflow for large a, b.

    >>> betaln(1000.0, 1000.0), fg.grad(betaln)(1.0, 1.0)
    (array(-1388.48260164), array(-1.))
    """
    return _apply("betaln", a, b)


def i0e(x: Any) -> Any:
    """The exponentially scaled modified Bessel function of order 0, exp(-abs(x)) I0(x).

    >>> i0e(np.array([0.0, 1e6])), fg.grad(i0e)(1.0)
    (array([1.0000000e+00, 3.9894233e-04]), array(-0.25784919))
    """
    return _apply("i0e", x)


def i1e(x: Any) -> Any:
    """The exponentially scaled modified Bessel function of order 1, exp(-abs(x)) I1(x).

    >>> i1e(np.array([0.0, 1e6])), fg.grad(i1e)(0.0)
    (array([0.        , 0.00039894]), array(0.5))
    """
    return _apply("i1e", x)


# ---------------------------------------------------------------- compositions


def quiet(fn: F) -> F:
    """Run `fn` with NumPy's floating-point warnings off. On plain arrays compositions
    compute with NumPy's operators; like SciPy's functions they return inf and NaN as
    values, without warnings (traced code never warns)."""

    @functools.wraps(fn)
    def quiet_fn(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return quiet_fn  # type: ignore[return-value]


def _unscaled_bessel(order: int, scaled: Callable[[Any], Any], x: Any) -> Any:
    """I_order(x) = exp(abs(x)) times its scaled version, except below 1/4 in magnitude:
    there the two factors' kinks at 0 would meet in the derivatives (each at its own
    convention, their product's second derivative is not I_order's), so the analytic power
    series (its first 18 powers: exact in float64 there) gives it instead."""
    small = abs(x) < 0.25
    xs, away = where(small, x, 0.0), where(small, 1.0, x)
    series = _polynomial(tuple(_bessel_series(order, 18)), xs)
    return where(small, series, exp(abs(away)) * scaled(away))


@quiet
def i0(x: Any) -> Any:
    """The modified Bessel function of order 0, exp(abs(x)) i0e(x).

    >>> i0(np.array([0.0, 1.0])), fg.grad(i0)(1.0)  # i0' = i1
    (array([1.        , 1.26606588]), array(0.5651591))
    """
    return _unscaled_bessel(0, i0e, x)


@quiet
def i1(x: Any) -> Any:
    """The modified Bessel function of order 1, exp(abs(x)) i1e(x).

    >>> i1(np.array([0.0, 1.0])), fg.grad(i1)(0.0)
    (array([0.       , 0.5651591]), array(0.5))
    """
    return _unscaled_bessel(1, i1e, x)


@quiet
def ndtr(x: Any) -> Any:
    """The standard normal CDF, erfc(-x / sqrt(2)) / 2.

    >>> float(ndtr(0.0))
    0.5
    """
    return erfc(x * -(1 / math.sqrt(2))) * 0.5


def expit(x: Any) -> Any:
    """The logistic function 1 / (1 + exp(-x)), without overflow.

    >>> expit(np.array([-1000.0, 0.0])), fg.grad(expit)(0.0)
    (array([0. , 0.5]), array(0.25))
    """
    return sigmoid(x)


def log_expit(x: Any) -> Any:
    """log(expit(x)), accurate for large abs(x).

    >>> log_expit(np.array([-1000.0, 0.0])), fg.grad(log_expit)(0.0)
    (array([-1.00000000e+03, -6.93147181e-01]), array(0.5))
    """
    return log_sigmoid(x)


@quiet
def logit(p: Any) -> Any:
    """log(p / (1 - p)), the inverse of expit.

    >>> float(logit(0.5))
    0.0
    """
    return log(p) - log1p(-p)
