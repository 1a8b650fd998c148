"""fastgrad.scipy.stats: log densities, densities and CDFs against scipy.stats (eager,
jitted, float32 and float64, broadcast shapes), derivatives of orders 1 and 2 in every
argument against finite differences, frozen distributions and invalid parameters."""

import numpy as np
import pytest
import scipy.stats as ss
from hypothesis import given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.scipy.stats as fst
from fastgrad.testing import strategies as fstrat
from oracle import check_derivatives, check_values

# name -> (x in the support, parameters in SciPy's order: shape parameters, loc, scale).
CONTINUOUS = {
    "norm": (np.array([-1.2, 0.1, 2.5]), (0.3, 1.5)),
    "t": (np.array([-1.2, 0.1, 2.5]), (3.5, 0.2, 1.3)),
    "gamma": (np.array([0.1, 1.2, 3.5]), (2.5, -0.3, 1.2)),
    "beta": (np.array([-0.3, 0.4, 1.2]), (2.0, 3.0, -0.5, 2.0)),
    "expon": (np.array([-0.2, 0.4, 3.0]), (-0.5, 2.0)),
    "uniform": (np.array([-0.7, 0.4, 1.5]), (-1.0, 3.0)),
    "laplace": (np.array([-1.2, 0.5, 2.5]), (0.1, 0.7)),
    "logistic": (np.array([-1.2, 0.1, 2.5]), (0.2, 0.9)),
    "cauchy": (np.array([-1.2, 0.1, 2.5]), (0.1, 1.2)),
}
METHODS = ("logpdf", "pdf", "cdf", "logcdf", "sf", "logsf")
CASES = [(d, m) for d in CONTINUOUS for m in METHODS]
# Distributions whose CDFs and quantiles have no derivative in their shape parameters.
SHAPES_HELD = {"t": 1, "gamma": 1, "beta": 2}


def method(module, dist, name):
    return getattr(getattr(module, dist), name)


def differentiable(dist, name, args):
    """(function, arguments) with the shape parameters held fixed where the method has no
    derivative in them (the incomplete gamma and beta functions' shapes)."""
    fun = method(fst, dist, name)
    held = SHAPES_HELD.get(dist, 0) if name not in ("logpdf", "pdf") else 0
    shapes = args[1 : 1 + held]
    return (lambda x, *rest: fun(x, *shapes, *rest)), (args[0], *args[1 + held :])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("dist", "name"), CASES)
def test_continuous_values_match_scipy(dist, name, dtype):
    x, params = CONTINUOUS[dist]
    args = (x.astype(dtype), *(np.asarray(p, dtype) for p in params))
    fused = name == "logpdf"  # compiled once per distribution and dtype
    check_values(method(fst, dist, name), method(ss, dist, name), args, dtype, fused=fused)


@pytest.mark.parametrize(("dist", "name"), [c for c in CASES if c[1] != "pdf"])
def test_continuous_derivatives_in_every_argument(dist, name):
    x, params = CONTINUOUS[dist]
    args = (x, *(np.float64(p) for p in params))
    check_derivatives(*differentiable(dist, name, args), fused=name == "logpdf")


@pytest.mark.parametrize("dist", sorted(CONTINUOUS))
def test_quantiles(dist):
    _, params = CONTINUOUS[dist]
    q = np.array([0.01, 0.3, 0.9])
    edges = np.array([0.0, 1.0, -0.1, 1.1, np.nan])
    for name in ("ppf", "isf"):
        for dtype in (np.float32, np.float64):
            args = (q.astype(dtype), *(np.asarray(p, dtype) for p in params))
            check_values(method(fst, dist, name), method(ss, dist, name), args, dtype)
        check_values(method(fst, dist, name), method(ss, dist, name), (edges, *params),
                     np.float64)  # fmt: skip
        check_derivatives(*differentiable(dist, name, (q, *params)))


@pytest.mark.parametrize("dist", sorted(CONTINUOUS))
def test_moments_median_and_interval(dist):
    _, params = CONTINUOUS[dist]
    for name in ("mean", "var", "std", "median"):  # (median is ppf(0.5), tested above)
        check_values(method(fst, dist, name), method(ss, dist, name), params, np.float64)
        if name != "median" and dist != "cauchy":  # Cauchy's are NaN
            check_derivatives(method(fst, dist, name), tuple(np.float64(p) for p in params))
    check_values(lambda *p: fst.__dict__[dist].interval(0.9, *p),
                 lambda *p: ss.__dict__[dist].interval(0.9, *p), params, np.float64)  # fmt: skip
    frozen = fst.__dict__[dist](*params)
    np.testing.assert_allclose(frozen.mean(), ss.__dict__[dist](*params).mean())


def test_moments_at_the_edges_match_scipy():
    for df in (0.5, 1.0, 1.5, 2.0, 2.5, -1.0):
        for name in ("mean", "var"):
            with np.errstate(all="ignore"):
                expected = getattr(ss.t, name)(df)
            np.testing.assert_allclose(getattr(fst.t, name)(df), expected)
    for dist, params in [("poisson", (2.5,)), ("bernoulli", (0.3,)), ("poisson", (-1.0,))]:
        for name in ("mean", "var", "std"):
            with np.errstate(all="ignore"):
                expected = method(ss, dist, name)(*params, loc=1)
            np.testing.assert_allclose(method(fst, dist, name)(*params, loc=1), expected)
    check_derivatives(lambda mu: fst.poisson.var(mu), (2.5,))


def test_the_cdfs_and_quantiles_of_t_gamma_beta_have_no_shape_derivative():
    with pytest.raises(ValueError, match="gammainc: no derivative with respect to its argument a"):
        fg.grad(lambda a: fst.gamma.cdf(1.0, a))(2.0)
    with pytest.raises(ValueError, match="stdtrit: no derivative with respect to its argument df"):
        fg.jvp(lambda df: fst.t.ppf(0.3, df), (3.0,), (1.0,))
    # their densities are differentiable in every argument
    check_derivatives(lambda a, b: fst.beta.logpdf(0.3, a, b), (2.0, 3.0))


@given(st.data())
def test_log_densities_on_broadcast_shapes(data):
    dist = data.draw(st.sampled_from(sorted(CONTINUOUS)))
    x, params = CONTINUOUS[dist]
    shapes = data.draw(fstrat.broadcastable_shapes(1 + len(params), max_side=3))
    args = [data.draw(fstrat.arrays(shapes[0], np.float64, "real")) * 0.2 + np.median(x)]
    for p, shape in zip(params, shapes[1:], strict=True):
        args.append(np.full(shape, p) + data.draw(fstrat.arrays(shape, np.float64, "unit")) * 0.1)
    check_values(method(fst, dist, "logpdf"), method(ss, dist, "logpdf"), args, np.float64,
                 fused=False)  # fmt: skip


def test_empty_and_unit_shapes():
    for x in (np.zeros((0, 3)), np.zeros((1, 1)), np.zeros(())):
        for dist in ("norm", "logistic"):
            check_values(method(fst, dist, "logpdf"), method(ss, dist, "logpdf"),
                         (x, np.zeros(x.shape[-1:]), 2.0), np.float64)  # fmt: skip
    for x in (np.zeros((0, 3)), np.zeros((2, 0, 3))):
        args = (x, MEAN, COV)
        check_values(fst.multivariate_normal.logpdf, ss.multivariate_normal.logpdf, args,
                     np.float64)  # fmt: skip


def test_outside_the_support_and_invalid_parameters_match_scipy():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0])
    for dist, params in [
        ("gamma", (2.0,)), ("gamma", (0.5,)), ("gamma", (1.0,)), ("beta", (2.0, 1.0)),
        ("beta", (0.5, 3.0)), ("expon", ()), ("uniform", ()), ("norm", (0.0, -1.0)),
        ("t", (-1.0,)), ("gamma", (-1.0,)),
    ]:  # fmt: skip
        for name in METHODS:
            with np.errstate(all="ignore"):
                expected = method(ss, dist, name)(x, *params)
            np.testing.assert_allclose(method(fst, dist, name)(x, *params), expected, rtol=1e-13)


# ---------------------------------------------------------------- discrete


DISCRETE = {
    "poisson": ((2.5,), ("logpmf", "pmf", "cdf", "sf", "logcdf", "logsf")),
    "bernoulli": ((0.3,), ("logpmf", "pmf", "cdf", "sf", "logcdf", "logsf")),
}


@pytest.mark.parametrize("dist", sorted(DISCRETE))
def test_discrete_values_and_derivatives(dist):
    params, names = DISCRETE[dist]
    k = np.array([-1.0, 0.0, 1.0, 2.0, 2.5, 7.0])
    for name in names:
        for dtype in (np.float32, np.float64):
            args = (k.astype(dtype), *(np.asarray(p, dtype) for p in params))
            check_values(method(fst, dist, name), method(ss, dist, name), args, dtype)
            shifted = [
                lambda k, *p, n=name, m=m: method(m, dist, n)(k, *p, loc=1) for m in (fst, ss)
            ]
            check_values(*shifted, args, dtype)
        inside = k[1:3] if dist == "bernoulli" else k[1:4]  # finite log-probabilities
        if (dist, name) == ("bernoulli", "logsf"):
            inside = k[1:2]  # P(K > 1) = 0
        check_derivatives(lambda *p, n=name, k=inside: method(fst, dist, n)(k, *p), params)
    # The count gets no gradient: it is not a continuous variable.
    assert fg.grad(lambda k: fst.poisson.logpmf(k, 2.0))(3.0) == 0


# ---------------------------------------------------------------- multivariate


rng = np.random.default_rng(8)
L = np.tril(rng.standard_normal((3, 3)), -1) + np.diag([1.0, 1.5, 0.8])
COV, MEAN, X = L @ L.T, rng.standard_normal(3), rng.standard_normal((4, 3))


@pytest.mark.parametrize(
    "args",
    [(X, MEAN, COV), (X[0], MEAN, COV), (X, MEAN, np.array([1.0, 2.0, 0.5])), (X, None, COV),
     (X[:, 0], 0.3, 2.0), (X[:0], MEAN, COV), (X.reshape(2, 2, 3), MEAN, COV)],
)  # fmt: skip
def test_multivariate_normal_matches_scipy(args):
    for name in ("logpdf", "pdf"):
        for dtype in (np.float32, np.float64):
            typed = tuple(a if a is None else np.asarray(a, dtype) for a in args)
            check_values(
                method(fst, "multivariate_normal", name),
                method(ss, "multivariate_normal", name),
                typed,
                dtype,
            )


def test_multivariate_normal_derivatives():
    check_derivatives(
        lambda x, m, f: fst.multivariate_normal.logpdf(x, m, f @ f.T), (X, MEAN, L), fused=True
    )


def test_dirichlet_matches_scipy():
    alpha = np.array([1.5, 2.0, 3.0])
    x = np.array([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3]]).T  # components along axis 0
    for args in [(x, alpha), (x[:, 0], alpha), (x[:2], alpha)]:
        check_values(fst.dirichlet.logpdf, ss.dirichlet.logpdf, args, np.float64)
        check_values(fst.dirichlet.pdf, ss.dirichlet.pdf, args, np.float64)
    check_derivatives(lambda x, a: fst.dirichlet.logpdf(x / x.sum(0), a), (x, alpha))
    with pytest.raises(ValueError, match="must sum to 1"):
        fst.dirichlet.logpdf(np.array([0.2, 0.2, 0.2]), alpha)


# ---------------------------------------------------------------- the distribution objects


def test_frozen_distributions_and_keyword_parameters():
    x = np.array([0.5, 1.5])
    np.testing.assert_allclose(fst.norm(0.2, scale=2.0).logpdf(x), ss.norm(0.2, 2.0).logpdf(x))
    np.testing.assert_allclose(fst.gamma(a=2.0).pdf(x), ss.gamma(a=2.0).pdf(x))
    np.testing.assert_allclose(fst.t.logpdf(x, df=3.0, scale=2.0), ss.t.logpdf(x, 3.0, 0, 2.0))
    assert "norm" in repr(fst.norm)


def test_distribution_errors():
    with pytest.raises(TypeError, match=r"gamma.logpdf is missing parameter\(s\) \['a'\]"):
        fst.gamma.logpdf(1.0)
    with pytest.raises(TypeError, match="has no parameter 'sigma'"):
        fst.norm.logpdf(1.0, sigma=2.0)
    with pytest.raises(TypeError, match="got parameter 'loc' twice"):
        fst.norm.logpdf(1.0, 0.0, loc=1.0)
    with pytest.raises(NotImplementedError, match="allow_singular"):
        fst.multivariate_normal.logpdf(X, MEAN, COV, allow_singular=True)
    with pytest.raises(ValueError, match="cov must be"):
        fst.multivariate_normal.logpdf(X, MEAN, np.eye(2))
