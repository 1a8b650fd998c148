"""scipy.stats: log densities, densities and CDFs of common distributions, as compositions
of fastgrad.ops.special and .linalg, so they are differentiable in every argument and fuse
with the code around them. Public under fastgrad.scipy.stats.

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
from fastgrad.ops.linalg import (
    as_float_arrays,
    cholesky,
    diag_embed,
    diagonal_of,
    mT,
    solve_triangular,
)
from fastgrad.ops.math import arctan, exp, expm1, log, log1p, log_sigmoid, sigmoid
from fastgrad.ops.shape import concatenate, squeeze
from fastgrad.ops.special import betaln, gammaln, log_ndtr, ndtr, ndtri, quiet, xlog1py, xlogy

__all__: list[str] = []  # public under fastgrad.scipy.stats

_LOG_2PI = math.log(2 * math.pi)


def _operand(x: Any) -> Any:
    return x if isinstance(x, Tracer) or is_python_scalar(x) else np.asarray(x)


class Frozen:
    """A distribution with its parameters fixed: `dist(*params).method(x)`."""

    def __init__(self, dist: Distribution, args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.dist, self.args, self.kwargs = dist, args, kwargs

    def __getattr__(self, method: str) -> Callable[[Any], Any]:
        fn = getattr(self.dist, method)
        return lambda x: fn(x, *self.args, **self.kwargs)

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


class LocScale(Distribution):
    """A continuous family with shape parameters, a location and a scale: the density of
    x is that of z = (x - loc) / scale, divided by scale."""

    defaults = {"loc": 0.0, "scale": 1.0}

    def __init__(
        self,
        name: str,
        shapes: tuple[str, ...],
        logpdf: Callable[..., Any],
        cdf: Callable[..., Any] | None,
        valid: Callable[..., Any] = lambda *shapes: True,
    ):
        self.name, self._logpdf, self._cdf, self._valid = name, logpdf, cdf, valid
        self.params = shapes + ("loc", "scale")

    def _standard(self, method: str, x: Any, args: Any, kwargs: Any) -> Any:
        """(z, safe shape parameters, validity, safe scale, loc)."""
        *shapes, loc, scale = self._bind(method, args, kwargs)
        ok = logical_and(scale > 0, self._valid(*shapes))
        # Safe parameters where they are invalid, so no inf or NaN reaches a gradient.
        scale = where(ok, scale, 1.0)
        z = (_operand(x) - loc) / scale
        return z, [where(ok, s, 1.0) for s in shapes], ok, scale, loc

    @quiet
    def logpdf(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        z, shapes, ok, scale, _ = self._standard("logpdf", x, args, kwargs)
        return where(ok, self._logpdf(z, *shapes) - log(scale), np.nan)

    @quiet
    def pdf(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return exp(self.logpdf(x, *args, **kwargs))

    @quiet
    def cdf(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        if self._cdf is None:
            raise NotImplementedError(
                f"{self.name}.cdf needs an incomplete gamma or beta function, which fastgrad "
                "does not have yet"
            )
        z, shapes, ok, _, _ = self._standard("cdf", x, args, kwargs)
        return where(ok, self._cdf(z, *shapes), np.nan)


class Normal(LocScale):
    """The normal distribution, with logcdf, sf, logsf, ppf and isf besides logpdf, pdf, cdf.

    >>> norm.cdf(0.0), norm.ppf(0.5, loc=3.0), norm(scale=2.0).logpdf(0.0)
    (array(0.5), array(3.), array(-1.61208571))
    >>> fg.grad(norm.logpdf)(1.0), fg.grad(norm.logpdf, argnums=2)(2.0, 0.0, 1.0)  # d/dx, d/dscale
    (array(-1.), array(3.))
    """

    def __init__(self) -> None:
        super().__init__("norm", (), lambda z: -0.5 * z * z - 0.5 * _LOG_2PI, ndtr)

    @quiet
    def logcdf(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        z, _, ok, _, _ = self._standard("logcdf", x, args, kwargs)
        return where(ok, log_ndtr(z), np.nan)

    @quiet
    def sf(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        z, _, ok, _, _ = self._standard("sf", x, args, kwargs)
        return where(ok, ndtr(-z), np.nan)

    @quiet
    def logsf(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        z, _, ok, _, _ = self._standard("logsf", x, args, kwargs)
        return where(ok, log_ndtr(-z), np.nan)

    @quiet
    def ppf(self, q: Any, *args: Any, **kwargs: Any) -> Any:
        _, _, ok, scale, loc = self._standard("ppf", 0.0, args, kwargs)
        return where(ok, loc + scale * ndtri(q), np.nan)

    @quiet
    def isf(self, q: Any, *args: Any, **kwargs: Any) -> Any:
        _, _, ok, scale, loc = self._standard("isf", 0.0, args, kwargs)
        return where(ok, loc - scale * ndtri(q), np.nan)


def _t_logpdf(z: Any, df: Any) -> Any:
    half = (df + 1) * 0.5
    return (
        gammaln(half)
        - gammaln(df * 0.5)
        - 0.5 * (log(df) + math.log(math.pi))
        - half * log1p(z * z / df)
    )


def _on(condition: Any, z: Any, value: Callable[[Any], Any], outside: float) -> Any:
    """value(z) where `condition` holds, `outside` elsewhere (z made safe there)."""
    return where(condition, value(where(condition, z, 0.5)), outside)


norm = Normal()
t = LocScale("t", ("df",), _t_logpdf, None, valid=lambda df: df > 0)
t.__doc__ = """Student's t distribution with `df` degrees of freedom (logpdf and pdf; no cdf
yet).

>>> t.pdf(0.0, 1.0), fg.grad(t.logpdf)(1.0, 1.0)
(array(0.31830989), array(-1.))
"""
gamma = LocScale(
    "gamma",
    ("a",),
    lambda z, a: _on(z >= 0, z, lambda z: xlogy(a - 1, z) - z - gammaln(a), -np.inf),
    None,
    valid=lambda a: a > 0,
)
gamma.__doc__ = """The gamma distribution with shape `a` (logpdf and pdf; no cdf yet).

>>> gamma.pdf(1.0, 1.0), fg.grad(gamma.logpdf)(1.0, 3.0)
(array(0.36787944), array(1.))
"""
beta = LocScale(
    "beta",
    ("a", "b"),
    lambda z, a, b: _on(
        logical_and(z >= 0, z <= 1),
        z,
        lambda z: xlogy(a - 1, z) + xlog1py(b - 1, -z) - betaln(a, b),
        -np.inf,
    ),
    None,
    valid=lambda a, b: logical_and(a > 0, b > 0),
)
beta.__doc__ = """The beta distribution with shapes `a` and `b` (logpdf and pdf; no cdf yet).

>>> beta.pdf(0.5, 2.0, 2.0), fg.grad(beta.logpdf)(0.25, 2.0, 2.0)
(array(1.5), array(2.66666667))
"""
expon = LocScale(
    "expon",
    (),
    lambda z: where(z >= 0, -z, -np.inf),
    lambda z: where(z >= 0, -expm1(-where(z >= 0, z, 0.0)), 0.0),
)
expon.__doc__ = """The exponential distribution (logpdf, pdf and cdf).

>>> expon.cdf(np.log(2.0)), fg.grad(expon.logpdf, argnums=2)(1.0, 0.0, 2.0)  # d/dscale
(array(0.5), array(-0.25))
"""
uniform = LocScale(
    "uniform",
    (),
    lambda z: where(logical_and(z >= 0, z <= 1), 0.0 * z, -np.inf),
    lambda z: where(z < 0, 0.0, where(z > 1, 1.0, z)),
)
uniform.__doc__ = """The uniform distribution on [loc, loc + scale] (logpdf, pdf and cdf).

>>> uniform.pdf(np.array([0.5, 1.5])), uniform.cdf(3.0, loc=2.0, scale=4.0)
(array([1., 0.]), array(0.25))
"""
laplace = LocScale(
    "laplace",
    (),
    lambda z: -abs(z) - math.log(2),
    lambda z: where(z < 0, 0.5 * exp(where(z < 0, z, 0.0)), 1 - 0.5 * exp(-where(z < 0, 0.0, z))),
)
laplace.__doc__ = """The Laplace distribution (logpdf, pdf and cdf).

>>> laplace.pdf(0.0), fg.grad(laplace.logpdf)(2.0)
(array(0.5), array(-1.))
"""
logistic = LocScale("logistic", (), lambda z: log_sigmoid(z) + log_sigmoid(-z), sigmoid)
logistic.__doc__ = """The logistic distribution (logpdf, pdf and cdf).

>>> logistic.cdf(0.0), fg.grad(logistic.logpdf)(0.0)
(array(0.5), array(0.))
"""
cauchy = LocScale(
    "cauchy", (), lambda z: -log1p(z * z) - math.log(math.pi), lambda z: 0.5 + arctan(z) / math.pi
)
cauchy.__doc__ = """The Cauchy distribution (logpdf, pdf and cdf).

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
    ):
        self.name, self._logpmf, self._cdf, self._valid = name, logpmf, cdf, valid
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
        return 1.0 - self.cdf(k, *args, **kwargs)


def _poisson_cdf(k: Any, mu: Any) -> Any:
    raise NotImplementedError(
        "poisson.cdf needs the incomplete gamma function, which fastgrad does not have yet"
    )


poisson = Discrete(
    "poisson",
    ("mu",),
    lambda k, mu: xlogy(k, mu) - gammaln(k + 1) - mu,
    _poisson_cdf,
    valid=lambda mu: mu >= 0,
)
poisson.__doc__ = """The Poisson distribution with mean `mu` (logpmf and pmf; no cdf yet). No
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
