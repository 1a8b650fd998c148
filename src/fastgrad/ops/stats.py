"""scipy.stats: log densities, densities, CDFs, survival functions and quantiles of common
distributions, as compositions of fastgrad.ops.special, .special_incomplete and .linalg,
differentiable in every argument (the CDFs and quantiles of t, gamma and beta not in their
shape parameters, nor poisson's CDF in k) and fused with the code around them where their
parts fuse. Public under fastgrad.scipy.stats.

Each distribution is an object with SciPy's method names (`norm.logpdf(x, loc, scale)`);
calling it freezes its parameters (`norm(0.0, 2.0).logpdf(x)`). Invalid parameters (a
scale <= 0, a probability outside [0, 1]) give NaN, as in SciPy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of, is_python_scalar
from fastgrad.ops.base import broadcast_to, reshape, sum
from fastgrad.ops.elementwise import (
    abs,
    floor,
    isnan,
    logical_and,
    logical_not,
    stop_gradient,
    where,
)
from fastgrad.ops.entropy import xlog1py, xlogy
from fastgrad.ops.linalg import (
    as_float_arrays,
    cholesky,
    diag_embed,
    diagonal_of,
    mT,
    solve_triangular,
)
from fastgrad.ops.math import arctan, exp, expm1, log, log1p, log_sigmoid, sigmoid, sqrt, tan
from fastgrad.ops.shape import concatenate, squeeze
from fastgrad.ops.special import gammaln, log_ndtr, logit, ndtr, ndtri, quiet
from fastgrad.ops.special_incomplete import (
    beta_log_density,
    betainc,
    betaincinv,
    gamma_log_density,
    gammainc,
    gammaincc,
    gammainccinv,
    gammaincinv,
    stdtr,
    stdtrit,
    t_log_density,
)

__all__: list[str] = []  # public under fastgrad.scipy.stats

_LOG_2PI = math.log(2 * math.pi)


def _operand(x: Any) -> Any:
    return x if isinstance(x, Tracer) or is_python_scalar(x) else np.asarray(x)


class Frozen:
    """A distribution with its parameters fixed: `dist(*params).method(x)`."""

    def __init__(self, dist: Distribution, args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.dist, self.args, self.kwargs = dist, args, kwargs

    def __getattr__(self, method: str) -> Callable[..., Any]:
        fn = getattr(self.dist, method)
        # x (or q, or confidence) where the method takes one: mean() and var() take none.
        return lambda *x: fn(*x, *self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"{self.dist.name}(*{self.args}, **{self.kwargs}) (frozen)"


class Distribution:
    """A family of distributions; calling it freezes the parameters. `params` names the
    parameters after x, in SciPy's order, `defaults` those that have one."""

    name = "distribution"
    params: tuple[str, ...] = ()
    defaults: dict[str, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Frozen:
        return Frozen(self, args, kwargs)

    def __repr__(self) -> str:
        return f"<fastgrad.scipy.stats.{self.name}>"

    def _bind(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The parameters given by position or name, in order, defaults filled in."""
        where_ = f"{self.name}.{method}"
        if len(args) > len(self.params):
            raise TypeError(f"{where_} takes at most {len(self.params)} parameters after x")
        values = dict(zip(self.params, args, strict=False))
        for key, value in kwargs.items():
            if key not in self.params:
                raise TypeError(f"{where_} has no parameter {key!r} (it takes {self.params})")
            if key in values:
                raise TypeError(f"{where_} got parameter {key!r} twice")
            values[key] = value
        missing = [p for p in self.params if p not in values and p not in self.defaults]
        if missing:
            raise TypeError(f"{where_} is missing parameter(s) {missing}")
        return [_operand(values.get(p, self.defaults.get(p))) for p in self.params]


# ---------------------------------------------------------------- location-scale families


def _of_z(method: str) -> Callable[..., Any]:
    """LocScale's `method` (cdf, sf, ...): its standard form's function of z, as given."""

    @quiet
    def of_z(self: LocScale, x: Any, *args: Any, **kwargs: Any) -> Any:
        z, shapes, ok, _, _ = self._standard(method, x, args, kwargs)
        return where(ok, getattr(self, "_" + method)(z, *shapes), np.nan)

    return of_z


class LocScale(Distribution):
    """A continuous family with shape parameters, a location and a scale, given by its
    standard form's functions of z = (x - loc) / scale (of q for ppf, isf): a symmetric
    one's sf and isf follow from cdf and ppf, others' sf is 1 - cdf; logs unless given."""

    defaults = {"loc": 0.0, "scale": 1.0}

    def __init__(
        self,
        name: str,
        shapes: tuple[str, ...],
        logpdf: Callable[..., Any],
        cdf: Callable[..., Any],
        ppf: Callable[..., Any],
        valid: Callable[..., Any] = lambda *shapes: True,
        support: tuple[float, float] = (-math.inf, math.inf),
        symmetric: bool = False,
        sf: Callable[..., Any] | None = None,
        isf: Callable[..., Any] | None = None,
        logcdf: Callable[..., Any] | None = None,
        logsf: Callable[..., Any] | None = None,
        moments: Callable[..., tuple[Any, Any]] = lambda *shapes: (0.0, 1.0),
    ):
        self.name, self._logpdf, self._cdf, self._ppf = name, logpdf, cdf, ppf
        self._moments = moments
        self._valid, self._support = valid, support
        self.params = shapes + ("loc", "scale")
        if symmetric:
            sf = sf or (lambda z, *shapes: cdf(-z, *shapes))
            isf = isf or (lambda q, *shapes: -ppf(q, *shapes))
        self._sf = sf or (lambda z, *shapes: 1.0 - cdf(z, *shapes))
        self._isf = isf or (lambda q, *shapes: ppf(1.0 - q, *shapes))
        self._logcdf = logcdf or (lambda z, *shapes: log(cdf(z, *shapes)))
        self._logsf = logsf or (lambda z, *shapes: log(self._sf(z, *shapes)))

    def _standard(self, method: str, x: Any, args: Any, kwargs: Any) -> Any:
        """(z, safe shape parameters, validity, safe scale, loc)."""
        *shapes, loc, scale = self._bind(method, args, kwargs)
        ok = logical_and(scale > 0, self._valid(*shapes))
        # Safe parameters where they are invalid, so no inf or NaN reaches a gradient.
        scale = where(ok, scale, 1.0)
        z = (_operand(x) - loc) / scale
        return z, [where(ok, s, 1.0) for s in shapes], ok, scale, loc

    def _quantile(self, method: str, q: Any, args: Any, kwargs: Any) -> Any:
        """loc + scale * the standard quantile of q: the support's ends at q = 0 and 1 (the
        second at 0 for isf), NaN outside [0, 1]."""
        _, shapes, ok, scale, loc = self._standard(method, 0.0, args, kwargs)
        q = _operand(q)
        lo, hi = self._support[:: 1 if method == "ppf" else -1]
        fn = self._ppf if method == "ppf" else self._isf
        inside = logical_and(q > 0, q < 1)
        z = where(q == 0, lo, where(q == 1, hi, fn(where(inside, q, 0.5), *shapes)))
        return where(logical_and(ok, logical_and(q >= 0, q <= 1)), loc + scale * z, np.nan)

    @quiet
    def logpdf(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        z, shapes, ok, scale, _ = self._standard("logpdf", x, args, kwargs)
        return where(ok, self._logpdf(z, *shapes) - log(scale), np.nan)

    @quiet
    def pdf(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return exp(self.logpdf(x, *args, **kwargs))

    cdf, logcdf, sf, logsf = (_of_z(name) for name in ("cdf", "logcdf", "sf", "logsf"))

    @quiet
    def ppf(self, q: Any, *args: Any, **kwargs: Any) -> Any:
        return self._quantile("ppf", q, args, kwargs)

    @quiet
    def isf(self, q: Any, *args: Any, **kwargs: Any) -> Any:
        return self._quantile("isf", q, args, kwargs)

    @quiet
    def mean(self, *args: Any, **kwargs: Any) -> Any:
        _, shapes, ok, scale, loc = self._standard("mean", 0.0, args, kwargs)
        return where(ok, loc + scale * self._moments(*shapes)[0], np.nan)

    @quiet
    def var(self, *args: Any, **kwargs: Any) -> Any:
        _, shapes, ok, scale, _ = self._standard("var", 0.0, args, kwargs)
        return where(ok, scale * scale * self._moments(*shapes)[1], np.nan)

    @quiet
    def std(self, *args: Any, **kwargs: Any) -> Any:
        return sqrt(self.var(*args, **kwargs))

    @quiet
    def median(self, *args: Any, **kwargs: Any) -> Any:
        return self.ppf(0.5, *args, **kwargs)

    @quiet
    def interval(self, confidence: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        tail = (1.0 - _operand(confidence)) * 0.5
        return self.ppf(tail, *args, **kwargs), self.isf(tail, *args, **kwargs)


def _on(condition: Any, z: Any, value: Callable[[Any], Any], outside: Any) -> Any:
    """value(z) where `condition` holds, `outside` elsewhere (z made safe there)."""
    return where(condition, value(where(condition, z, 0.5)), outside)


def _on_unit(z: Any, value: Callable[[Any], Any], below: float, above: float) -> Any:
    """value(z) for z in [0, 1], `below` and `above` outside."""
    inside = logical_and(z >= 0, z <= 1)
    return where(z < 0, below, where(z > 1, above, value(where(inside, z, 0.5))))


def _laplace_ppf(q: Any) -> Any:
    lower = q < 0.5
    return where(lower, log(2.0 * where(lower, q, 0.25)), -log(2.0 - 2.0 * where(lower, 0.75, q)))


def _t_moments(df: Any) -> tuple[Any, Any]:
    # Mean 0 for df > 1 (inf below, as SciPy gives); variance df / (df - 2) for df > 2,
    # infinite for 1 < df <= 2.
    safe = where(df > 2, df, 3.0)
    var = where(df > 2, safe / (safe - 2.0), where(df > 1, np.inf, np.nan))
    return where(df > 1, 0.0, np.inf), var


# Each distribution's standard form: log density, cdf, ppf, and what else has a better form.
norm = LocScale(
    "norm", (), lambda z: -0.5 * z * z - 0.5 * _LOG_2PI, ndtr, ndtri, symmetric=True,
    logcdf=log_ndtr, logsf=lambda z: log_ndtr(-z),
)  # fmt: skip
norm.__doc__ = """The normal distribution (logpdf, pdf, cdf, logcdf, sf, logsf, ppf and isf).

>>> norm.cdf(0.0), norm.ppf(0.5, loc=3.0), norm(scale=2.0).logpdf(0.0)
(array(0.5), array(3.), array(-1.61208571))
>>> fg.grad(norm.logpdf)(1.0), fg.grad(norm.logpdf, argnums=2)(2.0, 0.0, 1.0)  # d/dx, d/dscale
(array(-1.), array(3.))
"""
t = LocScale(
    "t", ("df",), lambda z, df: t_log_density(df, z), lambda z, df: stdtr(df, z),
    lambda q, df: stdtrit(df, q), valid=lambda df: df > 0, symmetric=True, moments=_t_moments,
)  # fmt: skip
t.__doc__ = """Student's t distribution with `df` degrees of freedom.

>>> t.pdf(0.0, 1.0), t.cdf(1.0, 1.0), fg.grad(t.logpdf)(1.0, 1.0)
(array(0.31830989), array(0.75), array(-1.))
"""
gamma = LocScale(
    "gamma",
    ("a",),
    lambda z, a: _on(z >= 0, z, lambda z: gamma_log_density(a, z), -np.inf),
    lambda z, a: _on(z >= 0, z, lambda z: gammainc(a, z), 0.0),
    lambda q, a: gammaincinv(a, q),
    valid=lambda a: a > 0,
    support=(0.0, math.inf),
    sf=lambda z, a: _on(z >= 0, z, lambda z: gammaincc(a, z), 1.0),
    isf=lambda q, a: gammainccinv(a, q),
    moments=lambda a: (a, a),
)
gamma.__doc__ = """The gamma distribution with shape `a` (logpdf, pdf, cdf, ppf and more).

>>> gamma.pdf(1.0, 1.0), fg.grad(gamma.logpdf)(1.0, 3.0)
(array(0.36787944), array(1.))
"""
beta = LocScale(
    "beta",
    ("a", "b"),
    lambda z, a, b: _on_unit(z, lambda z: beta_log_density(a, b, z), -np.inf, -np.inf),
    lambda z, a, b: _on_unit(z, lambda z: betainc(a, b, z), 0.0, 1.0),
    lambda q, a, b: betaincinv(a, b, q),
    valid=lambda a, b: logical_and(a > 0, b > 0),
    support=(0.0, 1.0),
    sf=lambda z, a, b: _on_unit(z, lambda z: betainc(b, a, 1.0 - z), 1.0, 0.0),
    isf=lambda q, a, b: 1.0 - betaincinv(b, a, q),
    moments=lambda a, b: (a / (a + b), a * b / ((a + b) * (a + b) * (a + b + 1.0))),
)
beta.__doc__ = """The beta distribution with shapes `a` and `b` (logpdf, pdf, cdf, ppf and more).

>>> beta.pdf(0.5, 2.0, 2.0), fg.grad(beta.logpdf)(0.25, 2.0, 2.0)
(array(1.5), array(2.66666667))
"""
expon = LocScale(
    "expon",
    (),
    lambda z: where(z >= 0, -z, -np.inf),
    lambda z: _on(z >= 0, z, lambda z: -expm1(-z), 0.0),
    lambda q: -log1p(-q),
    support=(0.0, math.inf),
    sf=lambda z: _on(z >= 0, z, lambda z: exp(-z), 1.0),
    isf=lambda q: -log(q),
    logsf=lambda z: where(z >= 0, -z, 0.0),
    moments=lambda: (1.0, 1.0),
)
expon.__doc__ = """The exponential distribution (logpdf, pdf, cdf, ppf and more).

>>> expon.cdf(np.log(2.0)), fg.grad(expon.logpdf, argnums=2)(1.0, 0.0, 2.0)  # d/dscale
(array(0.5), array(-0.25))
"""
uniform = LocScale(
    "uniform",
    (),
    lambda z: where(logical_and(z >= 0, z <= 1), 0.0 * z, -np.inf),
    lambda z: where(z < 0, 0.0, where(z > 1, 1.0, z)),
    lambda q: q,
    support=(0.0, 1.0),
    moments=lambda: (0.5, 1.0 / 12.0),
)
uniform.__doc__ = """The uniform distribution on [loc, loc + scale] (logpdf, pdf, cdf, ppf...).

>>> uniform.pdf(np.array([0.5, 1.5])), uniform.cdf(3.0, loc=2.0, scale=4.0)
(array([1., 0.]), array(0.25))
"""
laplace = LocScale(
    "laplace",
    (),
    lambda z: -abs(z) - math.log(2),
    lambda z: where(z < 0, 0.5 * exp(where(z < 0, z, 0.0)), 1 - 0.5 * exp(-where(z < 0, 0.0, z))),
    _laplace_ppf,
    symmetric=True,
    moments=lambda: (0.0, 2.0),
)
logistic = LocScale(
    "logistic", (), lambda z: log_sigmoid(z) + log_sigmoid(-z), sigmoid, logit, symmetric=True,
    logcdf=log_sigmoid, logsf=lambda z: log_sigmoid(-z), moments=lambda: (0.0, math.pi**2 / 3),
)  # fmt: skip
logistic.__doc__ = """The logistic distribution (logpdf, pdf, cdf, ppf and more).

>>> logistic.cdf(0.0), fg.grad(logistic.logpdf)(0.0)
(array(0.5), array(0.))
"""
laplace.__doc__ = """The Laplace distribution (logpdf, pdf, cdf, ppf and more).

>>> laplace.pdf(0.0), fg.grad(laplace.logpdf)(2.0)
(array(0.5), array(-1.))
"""
cauchy = LocScale(
    "cauchy",
    (),
    lambda z: -log1p(z * z) - math.log(math.pi),
    lambda z: 0.5 + arctan(z) / math.pi,
    lambda q: tan((q - 0.5) * math.pi),
    symmetric=True,
    moments=lambda: (np.nan, np.nan),  # no mean, no variance
)
cauchy.__doc__ = """The Cauchy distribution (logpdf, pdf, cdf, ppf and more).

>>> cauchy.cdf(1.0), fg.grad(cauchy.logpdf)(1.0)
(array(0.75), array(-1.))
"""


# ---------------------------------------------------------------- discrete families


def _integer(k: Any) -> Any:
    """Whether k is a whole number (no gradient flows through k: it is a count)."""
    return logical_and(k == floor(k), logical_not(isnan(k)))


class Discrete(Distribution):
    """A discrete family on the integers, shifted by `loc`."""

    defaults = {"loc": 0}

    def __init__(
        self,
        name: str,
        shapes: tuple[str, ...],
        logpmf: Callable[..., Any],
        cdf: Callable[..., Any],
        valid: Callable[..., Any],
        moments: Callable[..., tuple[Any, Any]],
        sf: Callable[..., Any] | None = None,
    ):
        self.name, self._logpmf, self._cdf, self._valid = name, logpmf, cdf, valid
        self._moments = moments
        self._sf = sf or (lambda k, *shapes: 1.0 - cdf(k, *shapes))
        self.params = shapes + ("loc",)

    def _standard(self, method: str, k: Any, args: Any, kwargs: Any) -> Any:
        *shapes, loc = self._bind(method, args, kwargs)
        k = stop_gradient(_operand(k) - loc)  # a count: no gradient
        ok = self._valid(*shapes)
        return k, [where(ok, s, 0.5) for s in shapes], ok

    @quiet
    def logpmf(self, k: Any, *args: Any, **kwargs: Any) -> Any:
        k, shapes, ok = self._standard("logpmf", k, args, kwargs)
        support = logical_and(_integer(k), k >= 0)
        value = where(support, self._logpmf(where(support, k, 0.0), *shapes), -np.inf)
        return where(ok, value, np.nan)

    @quiet
    def pmf(self, k: Any, *args: Any, **kwargs: Any) -> Any:
        return exp(self.logpmf(k, *args, **kwargs))

    @quiet
    def cdf(self, k: Any, *args: Any, **kwargs: Any) -> Any:
        k, shapes, ok = self._standard("cdf", k, args, kwargs)
        return where(ok, self._cdf(floor(k), *shapes), np.nan)

    @quiet
    def sf(self, k: Any, *args: Any, **kwargs: Any) -> Any:
        k, shapes, ok = self._standard("sf", k, args, kwargs)
        return where(ok, self._sf(floor(k), *shapes), np.nan)

    @quiet
    def logcdf(self, k: Any, *args: Any, **kwargs: Any) -> Any:
        return log(self.cdf(k, *args, **kwargs))

    @quiet
    def mean(self, *args: Any, **kwargs: Any) -> Any:
        *shapes, loc = self._bind("mean", args, kwargs)
        ok = self._valid(*shapes)
        return where(ok, self._moments(*[where(ok, s, 0.5) for s in shapes])[0] + loc, np.nan)

    @quiet
    def var(self, *args: Any, **kwargs: Any) -> Any:
        *shapes, _ = self._bind("var", args, kwargs)
        ok = self._valid(*shapes)
        return where(ok, self._moments(*[where(ok, s, 0.5) for s in shapes])[1], np.nan)

    @quiet
    def std(self, *args: Any, **kwargs: Any) -> Any:
        return sqrt(self.var(*args, **kwargs))

    @quiet
    def logsf(self, k: Any, *args: Any, **kwargs: Any) -> Any:
        return log(self.sf(k, *args, **kwargs))


# P(K <= k) = Q(k + 1, mu) for k >= 0: mu's derivative is the incomplete gamma's in x.
poisson = Discrete(
    "poisson",
    ("mu",),
    lambda k, mu: xlogy(k, mu) - gammaln(k + 1) - mu,
    lambda k, mu: _on(k >= 0, k, lambda k: gammaincc(k + 1.0, mu), 0.0 * mu),
    valid=lambda mu: mu >= 0,
    moments=lambda mu: (mu, mu),
    sf=lambda k, mu: _on(k >= 0, k, lambda k: gammainc(k + 1.0, mu), 1.0 + 0.0 * mu),
)
poisson.__doc__ = """The Poisson distribution with mean `mu` (logpmf, pmf, cdf and sf). No
gradient flows through the count k.

>>> poisson.pmf(2.0, 3.0), fg.grad(poisson.logpmf, argnums=1)(2.0, 4.0)  # d/dmu
(array(0.22404181), array(-0.5))
"""
bernoulli = Discrete(
    "bernoulli",
    ("p",),
    lambda k, p: where(k <= 1, xlogy(k, p) + xlog1py(1 - k, -p), -np.inf),
    lambda k, p: where(k < 0, 0.0 * p, where(k < 1, 1 - p, 1.0 + 0.0 * p)),
    valid=lambda p: logical_and(p >= 0, p <= 1),
    moments=lambda p: (p, p * (1.0 - p)),
)
bernoulli.__doc__ = """The Bernoulli distribution with P(k = 1) = `p` (logpmf, pmf, cdf, sf).

>>> bernoulli.pmf(np.array([0.0, 1.0]), 0.25), fg.grad(bernoulli.logpmf, argnums=1)(1.0, 0.25)
(array([0.75, 0.25]), array(4.))
"""


# ---------------------------------------------------------------- multivariate


class Dirichlet(Distribution):
    """The Dirichlet distribution. As in SciPy, the components of x run along its first
    axis (K, or K - 1 with the last one implied); x outside the open simplex has density 0
    (log density -inf), and on plain arrays components that do not sum to 1 raise.

    >>> dirichlet.pdf(np.array([0.5, 0.5]), np.array([2.0, 2.0]))
    array(1.5)
    >>> fg.grad(dirichlet.logpdf, argnums=1)(np.array([0.5, 0.5]), np.array([1.0, 1.0]))
    array([0.30685282, 0.30685282])
    """

    name = "dirichlet"

    @quiet
    def logpdf(self, x: Any, alpha: Any) -> Any:
        x, alpha = _operand(x), _operand(alpha)
        k = aval_of(alpha).shape[0] if aval_of(alpha).ndim == 1 else -1
        xs = aval_of(x).shape
        if aval_of(alpha).ndim != 1 or not xs or xs[0] not in (k, k - 1):
            raise ValueError(
                f"dirichlet: alpha must be 1-D (K,) and x have K or K - 1 components along "
                f"its first axis, got alpha {aval_of(alpha).shape} and x {xs}"
            )
        if xs[0] == k - 1:
            x = concatenate([x, 1 - sum(x, axis=0, keepdims=True)], axis=0)
        if not isinstance(x, Tracer) and np.any(np.abs(np.sum(x, axis=0) - 1) > 1e-9):
            raise ValueError("dirichlet: the components of x must sum to 1 along axis 0")
        a = reshape(alpha, (k,) + (1,) * (len(xs) - 1))
        inside = logical_and(x > 0, x <= 1)
        all_inside = sum(logical_not(inside), axis=0) == 0
        log_norm = sum(gammaln(alpha)) - gammaln(sum(alpha))
        terms = sum(xlogy(a - 1, where(inside, x, 0.5)), axis=0)
        return where(all_inside, terms - log_norm, -np.inf)

    @quiet
    def pdf(self, x: Any, alpha: Any) -> Any:
        return exp(self.logpdf(x, alpha))


class MultivariateNormal(Distribution):
    """The multivariate normal distribution (logpdf and pdf of x (..., d)) by a Cholesky
    factor of `cov` (a scalar, the diagonal as a vector, or a (d, d) matrix; it must be
    positive definite: `allow_singular=True` is not supported). As in SciPy, with d == 1 a
    1-D x holds samples, and the result drops axes of size 1.

    >>> multivariate_normal.logpdf(np.zeros(2), cov=np.eye(2))
    array(-1.83787707)
    >>> fg.grad(multivariate_normal.logpdf)(np.array([1.0, 2.0]), np.zeros(2), np.diag([1.0, 4.0]))
    array([-1. , -0.5])
    """

    name = "multivariate_normal"

    @quiet
    def logpdf(self, x: Any, mean: Any = None, cov: Any = 1, allow_singular: bool = False) -> Any:
        if allow_singular:
            raise NotImplementedError(
                "multivariate_normal: allow_singular=True is not supported; pass a positive "
                "definite covariance"
            )
        operands = [x, cov] + ([] if mean is None else [mean])
        x, cov, *rest = as_float_arrays(*operands, fn="multivariate_normal.logpdf",
                                          names=("x", "cov", "mean"))  # fmt: skip
        d = _dimension(rest[0] if rest else None, cov)
        mean = reshape(rest[0], (d,)) if rest else np.zeros(d, aval_of(x).dtype)
        cov = _as_matrix(cov, d)
        if d == 1 and aval_of(x).ndim <= 1:
            x = reshape(x, (-1, 1))
        if aval_of(x).shape[-1:] != (d,):
            raise ValueError(
                f"multivariate_normal: x must have {d} components in its last axis, got shape "
                f"{aval_of(x).shape}"
            )
        factor = cholesky(cov)
        centered = reshape(x - mean, (-1, d))
        z = solve_triangular(factor, mT(centered), lower=True)
        maha = reshape(sum(z * z, axis=0), aval_of(x).shape[:-1])
        log_det = 2 * sum(log(diagonal_of(factor)))
        out = -0.5 * (d * _LOG_2PI + log_det + maha)
        return squeeze(out)

    @quiet
    def pdf(self, x: Any, mean: Any = None, cov: Any = 1, allow_singular: bool = False) -> Any:
        return exp(self.logpdf(x, mean, cov, allow_singular))


def _dimension(mean: Any, cov: Any) -> int:
    # SciPy's rule: the size of the mean if there is one, else that of a matrix cov, else 1.
    if mean is not None:
        return aval_of(mean).size
    return aval_of(cov).shape[0] if aval_of(cov).ndim == 2 else 1


def _as_matrix(cov: Any, d: int) -> Any:
    ndim = aval_of(cov).ndim
    if ndim == 0:
        return cov * np.eye(d, dtype=aval_of(cov).dtype)
    if ndim == 1:
        return diag_embed(broadcast_to(cov, (d,)))
    if aval_of(cov).shape != (d, d):
        raise ValueError(f"multivariate_normal: cov must be ({d}, {d}), got {aval_of(cov).shape}")
    return cov


dirichlet = Dirichlet()
multivariate_normal = MultivariateNormal()

# Doctest finds examples in functions and classes only: the families above are instances.
_FAMILIES = (norm, t, gamma, beta, expon, uniform, laplace, logistic, cauchy, poisson, bernoulli)
__test__ = {family.name: family.__doc__ for family in _FAMILIES}
