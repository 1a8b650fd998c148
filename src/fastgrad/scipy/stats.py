"""SciPy's stats distributions that fastgrad covers (log densities, densities, cdf, sf and
ppf), differentiable in every argument: they live in fastgrad.ops.stats."""

from fastgrad.ops.stats import (
    bernoulli,
    beta,
    cauchy,
    dirichlet,
    expon,
    gamma,
    laplace,
    logistic,
    multivariate_normal,
    norm,
    poisson,
    t,
    uniform,
)

__all__ = [
    "bernoulli", "beta", "cauchy", "dirichlet", "expon", "gamma", "laplace", "logistic",
    "multivariate_normal", "norm", "poisson", "t", "uniform",
]  # fmt: skip
