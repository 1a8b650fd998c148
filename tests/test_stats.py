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

# name -> (x in the support, parameters in SciPy's order, methods with a closed form).
CONTINUOUS = {
    "norm": (np.array([-1.2, 0.1, 2.5]), (0.3, 1.5), ("logpdf", "pdf", "cdf")),
    "t": (np.array([-1.2, 0.1, 2.5]), (3.5, 0.2, 1.3), ("logpdf", "pdf")),
    "gamma": (np.array([0.1, 1.2, 3.5]), (2.5, -0.3, 1.2), ("logpdf", "pdf")),
    "beta": (np.array([-0.3, 0.4, 1.2]), (2.0, 3.0, -0.5, 2.0), ("logpdf", "pdf")),
    "expon": (np.array([-0.2, 0.4, 3.0]), (-0.5, 2.0), ("logpdf", "pdf", "cdf")),
    "uniform": (np.array([-0.7, 0.4, 1.5]), (-1.0, 3.0), ("logpdf", "pdf", "cdf")),
    "laplace": (np.array([-1.2, 0.5, 2.5]), (0.1, 0.7), ("logpdf", "pdf", "cdf")),
    "logistic": (np.array([-1.2, 0.1, 2.5]), (0.2, 0.9), ("logpdf", "pdf", "cdf")),
    "cauchy": (np.array([-1.2, 0.1, 2.5]), (0.1, 1.2), ("logpdf", "pdf", "cdf")),
}
CASES = [(d, m) for d, (_, _, methods) in CONTINUOUS.items() for m in methods] + [
    ("norm", m) for m in ("logcdf", "sf", "logsf")
]


def method(module, dist, name):
    return getattr(getattr(module, dist), name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("dist", "name"), CASES)
def test_continuous_values_match_scipy(dist, name, dtype):
    x, params, _ = CONTINUOUS[dist]
    args = (x.astype(dtype), *(np.asarray(p, dtype) for p in params))
    fused = name == "logpdf"  # compiled once per distribution and dtype
    check_values(method(fst, dist, name), method(ss, dist, name), args, dtype, fused=fused)


@pytest.mark.parametrize(("dist", "name"), [c for c in CASES if c[1] != "pdf"])
def test_continuous_derivatives_in_every_argument(dist, name):
    x, params, _ = CONTINUOUS[dist]
    args = (x, *(np.float64(p) for p in params))
    check_derivatives(method(fst, dist, name), args, fused=name == "logpdf")


def test_normal_quantiles():
    q = np.array([0.01, 0.3, 0.9])
    for name in ("ppf", "isf"):
        check_values(method(fst, "norm", name), method(ss, "norm", name), (q, 0.2, 1.5),
                     np.float64)  # fmt: skip
        check_derivatives(method(fst, "norm", name), (q, 0.2, 1.5))


@given(st.data())
def test_log_densities_on_broadcast_shapes(data):
    dist = data.draw(st.sampled_from(sorted(CONTINUOUS)))
    x, params, _ = CONTINUOUS[dist]
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
        with np.errstate(all="ignore"):
            expected = ss.__dict__[dist].logpdf(x, *params)
        np.testing.assert_allclose(fst.__dict__[dist].logpdf(x, *params), expected, rtol=1e-14)


# ---------------------------------------------------------------- discrete


DISCRETE = {
    "poisson": ((2.5,), ("logpmf", "pmf")),
    "bernoulli": ((0.3,), ("logpmf", "pmf", "cdf", "sf")),
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
    with pytest.raises(NotImplementedError, match="incomplete gamma or beta"):
        fst.gamma.cdf(1.0, 2.0)
    with pytest.raises(NotImplementedError, match="allow_singular"):
        fst.multivariate_normal.logpdf(X, MEAN, COV, allow_singular=True)
    with pytest.raises(ValueError, match="cov must be"):
        fst.multivariate_normal.logpdf(X, MEAN, np.eye(2))
