"""fg.random's permutation, choice, exponential, gamma, beta and dirichlet: bit-identical
samples on every path, determinism per key, their distributions (chi-square on small cases,
Kolmogorov-Smirnov against SciPy), and gamma's implicit gradient against mpmath, SciPy's
inverse CDF and the expectations' known derivatives."""

import itertools

import mpmath
import numpy as np
import pytest
from scipy import special, stats

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad import random as fr
from fastgrad.ops.gamma import _sample_grad, _second_partial

KEY = fr.key(2024)
N = 20_000
P3 = np.array([0.2, 0.3, 0.5])


def _samplers(dtype):
    return {
        "exponential": lambda k, x, a: fr.exponential(k, x.shape, dtype),
        "gamma": lambda k, x, a: fr.gamma(k, a),
        "gamma_broadcast": lambda k, x, a: fr.gamma(k, 0.4, x.shape, dtype),
        "beta": lambda k, x, a: fr.beta(k, a, 2.0),
        "dirichlet": lambda k, x, a: fr.dirichlet(k, a),
        "permutation_int": lambda k, x, a: fr.permutation(k, 10),
        "permutation": lambda k, x, a: fr.permutation(k, x, axis=1),
        "permutation_independent": lambda k, x, a: fr.permutation(k, x, independent=True),
        "choice": lambda k, x, a: fr.choice(k, 7, (5,)),
        "choice_p": lambda k, x, a: fr.choice(k, x, (2, 2), p=P3),
        "choice_no_replace": lambda k, x, a: fr.choice(k, 9, (2, 3), replace=False),
        "choice_no_replace_p": lambda k, x, a: fr.choice(k, x, (2,), replace=False, p=P3),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_bits_on_every_path(dtype, monkeypatch):
    monkeypatch.setattr(fg.config, "compile", "sync")  # the kernels, not the first NumPy run
    samplers = _samplers(dtype)

    def fun(k, x, a):
        return {name: sample(k, x, a) for name, sample in samplers.items()}

    x = np.arange(12, dtype=dtype).reshape(3, 4)
    a = np.linspace(0.3, 5.0, 12).reshape(3, 4).astype(dtype)
    eager = fun(KEY, x, a)
    fused = fg.jit(fun)(KEY, x, a)
    reference = fg.jit(fun, fuse=False)(KEY, x, a)
    for name, value in eager.items():
        value = np.asarray(value)
        assert value.dtype == (dtype if value.dtype.kind == "f" else np.int64), name
        for got in (fused[name], reference[name], fun(KEY, x, a)[name]):
            assert got.dtype == value.dtype, name
            np.testing.assert_array_equal(got, value, err_msg=name)


def test_determinism_per_key():
    k1, k2 = fr.split(KEY)
    x = np.arange(20.0)
    np.testing.assert_array_equal(fr.permutation(k1, x), fr.permutation(k1, x))
    assert not np.array_equal(fr.permutation(k1, x), fr.permutation(k2, x))
    assert sorted(fr.permutation(k1, x)) == list(x)
    rows = fr.permutation(k1, np.arange(200).reshape(10, 20), axis=1, independent=True)
    assert all(sorted(r) == list(range(i * 20, i * 20 + 20)) for i, r in enumerate(rows))
    assert len({tuple(np.argsort(r)) for r in rows}) == 10
    drawn = fr.choice(k1, 50, (50,), replace=False)
    assert sorted(drawn.tolist()) == list(range(50))
    assert not np.array_equal(fr.gamma(k1, 2.0, (5,)), fr.gamma(k2, 2.0, (5,)))


# ---------------------------------------------------------------- distributions


def _chi_square(counts, expected):
    return stats.chisquare(counts, np.asarray(expected) * np.sum(counts)).pvalue


def test_permutation_and_choice_without_replacement_are_uniform():
    orders = list(itertools.permutations(range(3)))
    count = {o: 0 for o in orders}
    pairs = {o: 0 for o in itertools.permutations(range(3), 2)}
    for i in range(1500):
        k = fr.fold_in(KEY, i)
        count[tuple(fr.permutation(k, 3).tolist())] += 1
        pairs[tuple(fr.choice(k, 3, (2,), replace=False).tolist())] += 1
    assert _chi_square(list(count.values()), [1 / 6] * 6) > 1e-3
    assert _chi_square(list(pairs.values()), [1 / 6] * 6) > 1e-3
    # Independent rows: N permutations of 3 in one call.
    rows = fr.permutation(KEY, np.tile(np.arange(3), (N, 1)), axis=1, independent=True)
    codes = rows @ np.array([9, 3, 1])
    observed = [np.sum(codes == np.array(o) @ np.array([9, 3, 1])) for o in orders]
    assert _chi_square(observed, [1 / 6] * 6) > 1e-3


def test_choice_with_probabilities():
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = fr.choice(KEY, 4, (N,), p=p)
    counts = np.bincount(draws, minlength=4)
    assert counts[1] == 0  # a zero weight is never drawn
    assert _chi_square(counts[[0, 2, 3]], p[[0, 2, 3]]) > 1e-3
    uniform = np.bincount(fr.choice(KEY, 5, (N,)), minlength=5)
    assert _chi_square(uniform, [0.2] * 5) > 1e-3
    # Without replacement, ordered pairs (i, j) have probability p_i p_j / (1 - p_i).
    pairs = {o: 0 for o in itertools.permutations(range(3), 2)}
    for i in range(1500):
        pairs[tuple(fr.choice(fr.fold_in(KEY, i), 3, (2,), replace=False, p=P3).tolist())] += 1
    expected = [P3[i] * P3[j] / (1 - P3[i]) for i, j in pairs]
    assert _chi_square(list(pairs.values()), expected) > 1e-3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exponential_and_gamma_statistics(dtype):
    e = fr.exponential(fr.key(1), (N,), dtype)
    assert e.dtype == dtype and e.min() >= 0
    assert stats.kstest(e, stats.expon.cdf).pvalue > 1e-3
    for a in (0.05, 0.4, 1.0, 4.5, 200.0):
        z = fr.gamma(fr.key(2), np.asarray(a, dtype), (N,))
        assert z.dtype == dtype and z.min() >= 0
        assert stats.kstest(z, stats.gamma(a).cdf).pvalue > 1e-3, a
    z = fr.gamma(fr.key(3), np.array([0.5, 2.0, 9.0]), (N, 3))
    for j, a in enumerate((0.5, 2.0, 9.0)):
        assert stats.kstest(z[:, j], stats.gamma(a).cdf).pvalue > 1e-3, a
    bad = fr.gamma(KEY, np.array([0.0, -1.0, np.nan, np.inf]))
    assert np.isnan(bad).all()


@pytest.mark.parametrize("a, b", [(0.001, 0.002), (0.02, 0.01)])
def test_beta_at_tiny_parameters_where_the_gammas_underflow(a, b):
    # Both gammas underflow for a large share of samples: those are taken in log space.
    x = fr.beta(fr.key(4), a, b, (N,))
    assert not np.isnan(x).any()
    for t in (1e-200, 1e-30, 0.5):
        p = float(mpmath.betainc(a, b, 0, mpmath.mpf(t), regularized=True))
        assert abs(np.mean(x < t) - p) < 5 * np.sqrt(p * (1 - p) / N) + 1e-4, t
    x32 = fr.beta(fr.key(4), np.float32(a), np.float32(b), (1000,))
    assert x32.dtype == np.float32 and not np.isnan(x32).any()
    jitted = fg.jit(lambda k: fr.beta(k, a, b, (1000,)))(fr.key(4))
    np.testing.assert_allclose(jitted, x[:1000], rtol=1e-13, atol=1e-300)  # element i: counter i


def test_beta_and_dirichlet_statistics():
    x = fr.beta(fr.key(4), 0.7, 2.5, (N,))
    assert stats.kstest(x, stats.beta(0.7, 2.5).cdf).pvalue > 1e-3
    alpha = np.array([0.5, 2.0, 3.5])
    d = fr.dirichlet(fr.key(5), alpha, (N,))
    assert d.shape == (N, 3)
    np.testing.assert_allclose(d.sum(axis=1), 1.0, rtol=1e-14)
    for j in range(3):  # each coordinate is Beta(alpha_j, sum - alpha_j)
        marginal = stats.beta(alpha[j], alpha.sum() - alpha[j])
        assert stats.kstest(d[:, j], marginal.cdf).pvalue > 1e-3
    with pytest.raises(ValueError, match="dirichlet: alpha must have at least one axis"):
        fr.dirichlet(KEY, 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dirichlet_at_tiny_alpha(dtype, monkeypatch):
    # Every gamma of a row underflows at these alpha (rows were 0 / 0 = NaN): the rows are
    # normalized in log space. Moments against Dirichlet's, and each marginal against its
    # Beta by Kolmogorov-Smirnov where a float of this dtype holds it (the law conditioned
    # on [lo, hi]: below lo values are subnormal or 0, near 1 they round to 1).
    monkeypatch.setattr(fg.config, "compile", "sync")
    alpha = np.array([0.002, 0.004, 0.006], dtype)
    d = fr.dirichlet(fr.key(7), alpha, (N,))
    assert d.dtype == dtype and not np.isnan(d).any()
    np.testing.assert_allclose(d.sum(axis=1), 1.0, rtol=4 * np.finfo(dtype).eps)
    a, total = alpha.astype(np.float64), float(alpha.sum())
    np.testing.assert_allclose(d.mean(axis=0), a / total, atol=0.012)
    np.testing.assert_allclose(
        d.var(axis=0), a * (total - a) / (total**2 * (total + 1)), atol=0.006
    )
    lo, hi = (1e-30, 1 - 1e-4) if dtype == np.float32 else (1e-200, 1 - 1e-9)
    for j in range(3):
        marginal = stats.beta(a[j], total - a[j])
        f_lo, f_hi = marginal.cdf(lo), marginal.cdf(hi)
        x = d[:, j].astype(np.float64)
        x = x[(x > lo) & (x < hi)]
        assert len(x) > N // 20  # enough for the test to have power
        cdf = lambda t, m=marginal, lo_=f_lo, hi_=f_hi: (m.cdf(t) - lo_) / (hi_ - lo_)  # noqa: E731
        assert stats.kstest(x, cdf).pvalue > 1e-3
    jitted = fg.jit(lambda k, al: fr.dirichlet(k, al, (N,)))(fr.key(7), alpha)
    # ln g reaches -1e4 here (ln(u) / alpha): its rounding, through exp, is ~1e-12 relative.
    rtol = 1e-10 if dtype == np.float64 else 4 * np.finfo(dtype).eps
    np.testing.assert_allclose(jitted, d, rtol=rtol, atol=1e-300)
    g = fg.grad(lambda al: fnp.mean(fr.dirichlet(fr.key(7), al, (N,))[:, 0]))(alpha)
    assert np.isfinite(g).all()


# ---------------------------------------------------------------- gamma's gradient


def _implicit_mp(a, z):
    """dz/da = -(dF/da) / (dF/dz) with mpmath's regularized incomplete gamma function."""
    a, z = mpmath.mpf(a), mpmath.mpf(z)
    df_da = mpmath.diff(lambda b: mpmath.gammainc(b, 0, z, regularized=True), a)
    return float(-df_da / (z ** (a - 1) * mpmath.exp(-z) / mpmath.gamma(a)))


def test_gamma_sample_gradient_against_mpmath():
    points = [(0.01, 1e-40), (0.1, 0.05), (0.1, 3.0), (0.5, 0.2), (1.0, 8.0), (2.0, 1e-4),
              (3.3, 3.0), (50.0, 35.0), (50.0, 75.0), (1000.0, 1100.0), (1e4, 1.03e4)]  # fmt: skip
    with mpmath.workdps(40):
        expected = [_implicit_mp(a, z) for a, z in points]
    a, z = np.array(points).T
    np.testing.assert_allclose(_sample_grad(a, z), expected, rtol=1e-8)


def test_gamma_gradient_follows_the_quantile():
    # The sample moves with a as its CDF level's quantile does (SciPy's inverse, at a + h).
    a, h = np.array([0.3, 1.0, 2.5, 40.0]), 1e-6
    z = fr.gamma(KEY, a, (50, 4))
    grad = fg.grad(lambda a: fnp.sum(fr.gamma(KEY, a, (50, 4))))(a)
    moved = special.gammaincinv(a + h, special.gammainc(a, z))
    back = special.gammaincinv(a - h, special.gammainc(a, z))
    np.testing.assert_allclose(grad, np.sum((moved - back) / (2 * h), axis=0), rtol=1e-5)
    # Forward mode, and vmap over a batch of shape parameters, give the same.
    _, tangent = fg.jvp(lambda a: fr.gamma(KEY, a, (50, 4)), (a,), (np.ones(4),))
    np.testing.assert_allclose(tangent.sum(axis=0), grad, rtol=1e-12)
    per_a = fg.vmap(fg.grad(lambda s: fnp.sum(fr.gamma(KEY, s, (50,)))))(a)
    loop = [fg.grad(lambda s: fnp.sum(fr.gamma(KEY, s, (50,))))(s) for s in a]
    np.testing.assert_allclose(per_a, loop, rtol=1e-12)


def test_gamma_gradient_against_finite_differences_of_the_sampler():
    # At a fixed key the sampler is d v(x) with d = a - 1/3 (Marsaglia-Tsang): a smooth
    # map of a, but not the quantile map the implicit gradient follows, so the two agree
    # closely (Wilson-Hilferty: v's law is nearly gamma) and not to rounding.
    a, h = 6.0, 1e-6
    fd = (fr.gamma(KEY, a + h, (200,)) - fr.gamma(KEY, a - h, (200,))) / (2 * h)
    g = np.array([fg.grad(lambda s, i=i: fr.gamma(KEY, s, (200,))[i])(a) for i in range(3)])
    np.testing.assert_allclose(g, fd[:3], rtol=0.05)


def test_expectations_have_the_right_gradients():
    # Unbiased: d/da E[f(z)] for known moments, from the mean over many samples.
    a = 1.7
    g1, g2 = (fg.grad(lambda a, p=p: fnp.mean(fr.gamma(KEY, a, (N,)) ** p))(a) for p in (1, 2))
    assert abs(g1 - 1.0) < 0.05 and abs(g2 - (2 * a + 1)) < 0.15
    a, b = 2.0, 3.0
    ga, gb = fg.grad(lambda a, b: fnp.mean(fr.beta(KEY, a, b, (N,))), argnums=(0, 1))(a, b)
    np.testing.assert_allclose([ga, gb], [b / (a + b) ** 2, -a / (a + b) ** 2], atol=4e-3)
    alpha = np.array([1.0, 2.0, 3.0])
    g = fg.grad(lambda al: fnp.mean(fr.dirichlet(KEY, al, (N,))[:, 0]))(alpha)
    np.testing.assert_allclose(g, [5 / 36, -1 / 36, -1 / 36], atol=4e-3)


def _second_partial_mp(a, z):
    """(d^2F/da^2) / (dF/dz) with mpmath's regularized incomplete gamma function."""
    a, z = mpmath.mpf(a), mpmath.mpf(z)
    d2f_da2 = mpmath.diff(lambda b: mpmath.gammainc(b, 0, z, regularized=True), a, 2)
    return float(d2f_da2 / (z ** (a - 1) * mpmath.exp(-z) / mpmath.gamma(a)))


def test_gamma_second_derivative_follows_the_quantile():
    points = [(0.01, 1e-40), (0.1, 0.05), (0.5, 0.2), (1.0, 8.0), (2.0, 1e-4), (3.3, 3.0),
              (50.0, 75.0), (1e4, 1.03e4)]  # fmt: skip
    with mpmath.workdps(40):
        expected = [_second_partial_mp(a, z) for a, z in points]
    a, z = np.array(points).T
    np.testing.assert_allclose(_second_partial(a, z), expected, rtol=1e-5)
    # d^2z/da^2 against second differences of SciPy's quantile at the sample's CDF level.
    a, h = np.array([0.3, 1.0, 2.5, 40.0]), 1e-3
    z = fr.gamma(KEY, a, (50, 4))
    hess = fg.hessian(lambda a: fnp.sum(fr.gamma(KEY, a, (50, 4))))(a)
    level = special.gammainc(a, z)
    quantile = [special.gammaincinv(a + d, level) for d in (h, 0.0, -h)]
    fd = np.sum((quantile[0] - 2 * quantile[1] + quantile[2]) / h**2, axis=0)
    np.testing.assert_allclose(np.diag(hess), fd, rtol=2e-4)
    assert np.all(hess == np.diag(np.diag(hess)))  # each a moves only its own samples
    # Forward over reverse gives the same.
    g = fg.grad(lambda a: fnp.sum(fr.gamma(KEY, a, (50, 4))))
    _, hvp = fg.jvp(g, (a,), (np.ones(4),))
    np.testing.assert_allclose(hvp, np.diag(hess), rtol=1e-12)
    with pytest.raises(NotImplementedError, match="a third derivative in it"):
        fg.grad(fg.grad(fg.grad(lambda a: fnp.sum(fr.gamma(KEY, a, (3,))))))(2.0)


def test_gradients_flow_through_permutation_and_choice():
    w = np.arange(1.0, 7.0)

    def loss(x):
        return fnp.sum(w * fr.permutation(KEY, x)) + fnp.sum(fr.choice(KEY, x, (4,)) ** 2)

    fg.testing.check_grads(loss, (np.linspace(-1.0, 1.0, 6),), order=2)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="choice: cannot draw 5 of 3 without replacement"):
        fr.choice(KEY, 3, (5,), replace=False)
    with pytest.raises(ValueError, match=r"choice: p must have shape \(3,\)"):
        fr.choice(KEY, 3, (2,), p=np.ones(4) / 4)
    with pytest.raises(ValueError, match="permutation: x must be an int or an array"):
        fr.permutation(KEY, np.float64(2.0))
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        fr.gamma(KEY, 2.0, dtype=np.int32)
    with pytest.raises(ValueError, match="gamma's shape and a: shapes"):
        fr.gamma(KEY, np.ones(3), (2,))
    with pytest.raises(ValueError, match=r"gamma: shape \(3,\) must be a broadcast of a's"):
        fr.gamma(KEY, np.ones((2, 3)), (3,))
