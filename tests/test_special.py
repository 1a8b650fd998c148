"""fastgrad.scipy.special: values against SciPy (eager, jitted, float32 and float64, shapes
with broadcasting and empty axes), derivatives of orders 1 and 2 in both modes against
finite differences, a few against mpmath at high precision, and the conventions at edges.
"""

import mpmath
import numpy as np
import pytest
import scipy.special as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastgrad as fg
import fastgrad.numpy as fnp
import fastgrad.scipy.special as fss
from fastgrad.testing import check_grads
from fastgrad.testing import strategies as fst
from oracle import check_derivatives, check_float32_gradients, check_values

# name -> input domains (see fastgrad.testing.strategies.DOMAINS); SciPy's function of the
# same name is the reference.
FUNCTIONS = {
    "erf": ("real",), "erfc": ("real",), "erfinv": ("unit",), "erfcinv": ("below_two",),
    "ndtr": ("real",), "ndtri": ("unit_interval",), "log_ndtr": ("real",),
    "gammaln": ("positive",), "digamma": ("positive",), "psi": ("positive",),
    "gamma": ("positive",), "polygamma": ("order", "positive"),
    "beta": ("positive", "positive"), "betaln": ("positive", "positive"),
    "i0e": ("nonzero",), "i1e": ("nonzero",), "i0": ("nonzero",), "i1": ("nonzero",),
    "expit": ("real",), "logit": ("unit_interval",), "log_expit": ("real",),
    "xlogy": ("real", "positive"), "xlog1py": ("real", "above_minus_one"),
    "entr": ("positive",), "rel_entr": ("positive", "positive"),
    "kl_div": ("positive", "positive"),
}  # fmt: skip
# Functions whose derivatives are also checked compiled (the others run the reference).
FUSED_DERIVATIVES = {"erf", "gammaln", "polygamma", "xlogy", "kl_div", "logit", "ndtr"}
# Registry records the functions exercise, for test_structural's coverage check.
COVERED = {
    "erf", "erfc", "erfinv", "erfcinv", "ndtri", "log_ndtr", "gammaln", "digamma", "gamma",
    "polygamma", "beta", "betaln", "i0e", "i1e",
}  # fmt: skip


def shapes_with_empty(n):
    return hnp.mutually_broadcastable_shapes(
        num_shapes=n, min_dims=0, max_dims=3, min_side=0, max_side=3
    ).map(lambda b: b.input_shapes)


def inputs(name, dtype, data, empty=True):
    domains = FUNCTIONS[name]
    shapes = data.draw(shapes_with_empty(len(domains)) if empty else fst.broadcastable_shapes(
        len(domains), max_side=3))  # fmt: skip
    return tuple(data.draw(fst.arrays(s, dtype, d)) for s, d in zip(shapes, domains, strict=True))


def differentiable(name, xs):
    """The function of `name` and its arguments, the order of polygamma (a whole number)
    held fixed so that finite differences do not move it."""
    fun = getattr(fss, name)
    if name == "polygamma":
        return (lambda x, n=xs[0]: fun(n, x)), xs[1:]
    return fun, xs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@given(data=st.data())
def test_values_match_scipy_on_random_shapes(name, dtype, data):
    xs = inputs(name, dtype, data)
    check_values(getattr(fss, name), getattr(sp, name), xs, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_values_fused(name, dtype):
    rng = np.random.default_rng(2)
    shapes = [(2, 3), (3,)][: len(FUNCTIONS[name])]
    xs = tuple(
        _sample(rng, s, d).astype(dtype) for s, d in zip(shapes, FUNCTIONS[name], strict=True)
    )
    check_values(getattr(fss, name), getattr(sp, name), xs, dtype, fused=True)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_derivatives_orders_1_and_2(name):
    rng = np.random.default_rng(3)
    shapes = [(2, 3), (3,)][: len(FUNCTIONS[name])]
    xs = tuple(_sample(rng, s, d) for s, d in zip(shapes, FUNCTIONS[name], strict=True))
    check_derivatives(*differentiable(name, xs), fused=name in FUSED_DERIVATIVES)


def _sample(rng, shape, domain):
    if domain == "order":
        return rng.integers(*fst.ORDERS, shape, endpoint=True).astype(np.float64)
    lo, hi = fst.DOMAINS[domain]
    x = rng.uniform(lo, hi, shape)
    return x * rng.choice([-1, 1], shape) if domain == "nonzero" else x


@settings(max_examples=5)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@given(data=st.data())
def test_gradients_on_random_shapes(name, data):
    xs = inputs(name, np.float64, data, empty=False)
    check_grads(*differentiable(name, xs), modes=("rev",))


@pytest.mark.parametrize("name", ["erf", "gammaln", "polygamma", "betaln", "xlogy", "logit"])
def test_float32_gradients_stay_float32(name):
    args = tuple(np.full(3, 1.0 if d == "order" else 0.5) for d in FUNCTIONS[name])
    check_float32_gradients(*differentiable(name, args))


# ---------------------------------------------------------------- high precision


def test_second_derivatives_against_mpmath():
    mpmath.mp.dps = 30
    cases = [
        (fss.gammaln, lambda t: mpmath.psi(1, t), [0.3, 1.7, 4.2]),
        (fss.digamma, lambda t: mpmath.psi(2, t), [0.3, 1.7, 4.2]),
        (lambda x: fss.polygamma(2, x), lambda t: mpmath.psi(4, t), [0.3, 1.7, 4.2]),
        (fss.erfinv, lambda t: mpmath.diff(mpmath.erfinv, t, 2), [-0.9, 0.1, 0.6]),
        (
            fss.log_ndtr,
            lambda t: mpmath.diff(lambda s: mpmath.log(mpmath.ncdf(s)), t, 2),
            [-30.0, -1.0, 3.0],
        ),  # fmt: skip
    ]
    for fun, second, points in cases:
        x = np.array(points)
        d2 = fg.vjp(fg.grad(lambda x, f=fun: fnp.sum(f(x))), x)[1](np.ones(3))[0]
        expected = [float(second(mpmath.mpf(t))) for t in points]
        np.testing.assert_allclose(d2, expected, rtol=1e-9, atol=1e-12)


def test_log_ndtr_far_in_the_tail():
    mpmath.mp.dps = 50
    x = np.array([-40.0, -10.0, 5.0])
    expected = [float(mpmath.log(mpmath.ncdf(t))) for t in x]
    np.testing.assert_allclose(fg.jit(fss.log_ndtr)(x), expected, rtol=1e-13)
    slope = [float(mpmath.diff(lambda s: mpmath.log(mpmath.ncdf(s)), t)) for t in x]
    np.testing.assert_allclose(fg.grad(lambda x: fnp.sum(fss.log_ndtr(x)))(x), slope, rtol=1e-12)


# ---------------------------------------------------------------- edges and conventions


EDGES = np.array([-1.0, 0.0, 0.5, 2.0, np.inf, np.nan])


@pytest.mark.parametrize("name", ["xlogy", "xlog1py", "rel_entr", "kl_div"])
def test_binary_edges_match_scipy(name):
    x, y = np.meshgrid(EDGES, EDGES)
    with np.errstate(all="ignore"):
        expected = getattr(sp, name)(x, y)
    for fun in (getattr(fss, name), fg.jit(getattr(fss, name))):
        np.testing.assert_allclose(fun(x, y), expected, rtol=1e-15)


@pytest.mark.parametrize("name", ["entr", "logit", "expit", "log_expit", "ndtr", "erf", "i1e"])
def test_unary_edges_match_scipy(name):
    x = np.concatenate([EDGES, -EDGES, [1.0, 1e-300, -50.0, 50.0]])
    with np.errstate(all="ignore"):
        expected = getattr(sp, name)(x)
    for fun in (getattr(fss, name), fg.jit(getattr(fss, name))):
        np.testing.assert_allclose(fun(x), expected, rtol=1e-15)


def test_xlogy_gradient_at_zero_follows_jax():
    gx, gy = fg.grad(lambda x, y: fss.xlogy(x, y), argnums=(0, 1))(0.0, 2.0)
    assert gx == np.log(2.0) and gy == 0.0
    gx, gy = fg.grad(lambda x, y: fss.xlogy(x, y), argnums=(0, 1))(0.0, 0.0)
    assert gx == -np.inf and gy == 0.0  # d/dx = log(0), as JAX; 0 along x == 0
    assert fg.grad(fss.entr)(0.0) == np.inf  # -log(0) - 1: the edge of entr's domain
    np.testing.assert_allclose(fg.grad(fss.i1e)(0.0), 0.5)


def test_logsumexp_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    cases = [
        ({}, (a,)),
        ({"axis": 1}, (a,)),
        ({"axis": (0, 1), "keepdims": True}, (a,)),
        ({"axis": 0, "b": np.abs(b)}, (a,)),
        ({"axis": -1, "b": b, "return_sign": True}, (a,)),
        ({"axis": 0}, (np.full((2, 3), -np.inf),)),
        ({"axis": 1}, (np.zeros((2, 0)),)),
        ({"b": np.array([0.0, 1.0])}, (np.array([1000.0, 1.0]),)),
    ]
    for kwargs, args in cases:
        check_values(lambda x, k=kwargs: fss.logsumexp(x, **k),
                     lambda x, k=kwargs: sp.logsumexp(x, **k), args, np.float64)  # fmt: skip
    check_derivatives(lambda a, b: fss.logsumexp(a, 1, b=b), (a, np.abs(b)))
    check_derivatives(lambda a, b: fss.logsumexp(a, 0, b=b, return_sign=True)[0], (a, b))
    assert np.isnan(fss.logsumexp(np.array([1.0, 2.0]), b=np.array([1.0, -1.0])))


def test_softmax_and_log_softmax_default_to_all_axes_like_scipy():
    x = np.random.default_rng(1).standard_normal((2, 3)) * 30
    for axis in (None, 0, (0, 1)):
        check_values(lambda x, a=axis: fss.softmax(x, a), lambda x, a=axis: sp.softmax(x, a),
                     (x,), np.float64)  # fmt: skip
        check_values(lambda x, a=axis: fss.log_softmax(x, a),
                     lambda x, a=axis: sp.log_softmax(x, a), (x,), np.float64)  # fmt: skip
        check_derivatives(lambda x, a=axis: fss.softmax(x, a), (x / 30,))


def test_polygamma_needs_whole_orders():
    with pytest.raises(ValueError, match="nonnegative integers"):
        fss.polygamma(1.5, 2.0)
    with pytest.raises(ValueError, match="nonnegative integers"):
        fss.polygamma(-1, 2.0)
    assert fss.polygamma(np.array([0, 1]), np.ones(2, np.float32)).dtype == np.float32


def test_special_functions_are_library_calls_between_fused_loops():
    def f(x):
        return fnp.sum(fss.gammaln(x * x + 1.0) * fnp.exp(-x))

    x = np.linspace(0.1, 2.0, 7)
    lowered = fg.jit(fg.value_and_grad(f)).lower(x)
    assert "library call" in lowered.explain()
    value, grad = fg.jit(fg.value_and_grad(f))(x)
    np.testing.assert_allclose(value, np.sum(sp.gammaln(x * x + 1) * np.exp(-x)), rtol=1e-13)
    np.testing.assert_allclose(grad, fg.jit(fg.grad(f), fuse=False)(x), rtol=1e-13)


def test_scipy_ufuncs_on_traced_values_call_fastgrads():
    x = np.linspace(0.2, 2.0, 4)
    f = lambda x: np.sum(sp.erf(x) * sp.gammaln(x) + sp.xlogy(x, x) + sp.expit(x))  # noqa: E731
    np.testing.assert_allclose(fg.jit(f)(x), f(x), rtol=1e-13)
    np.testing.assert_allclose(fg.grad(f)(x), fg.grad(lambda x: fnp.sum(
        fss.erf(x) * fss.gammaln(x) + fss.xlogy(x, x) + fss.expit(x)))(x), rtol=1e-13)  # fmt: skip
    with pytest.raises(fg.TracerError, match="scipy.special.struve on a traced value"):
        fg.jit(lambda x: sp.struve(x, x))(x)
