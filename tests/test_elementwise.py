"""Every elementwise primitive: NumPy reference, dtypes, broadcasting, and gradients."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.primitive import REGISTRY
from fastgrad.testing import check_grads
from fastgrad.testing import strategies as fst

ELEMENTWISE = sorted(
    name
    for name, p in REGISTRY.items()
    if p.kind == "elementwise" and p.ufunc is not None and name not in ("where",)
)
UNARY = [n for n in ELEMENTWISE if REGISTRY[n].ufunc.nin == 1]
BINARY = [n for n in ELEMENTWISE if REGISTRY[n].ufunc.nin == 2]
PIECEWISE_CONSTANT = {"sign", "floor", "ceil", "rint", "trunc", "floor_divide"}  # derivative 0
TIES = {"maximum", "minimum", "fmax", "fmin"}  # the first derivative jumps where x == y
REMAINDERS = {"remainder", "fmod"}  # jump where x / y is an integer


def reference(name, *xs):
    if name == "sigmoid":
        return 1 / (1 + np.exp(-xs[0]))
    return getattr(np, name)(*xs)


def in_domain(name, shapes, dtype):
    domains = REGISTRY[name].domain or ("real",) * len(shapes)
    if name.startswith("logical"):
        domains = ("bool",) * len(shapes)
    return st.tuples(*(fst.arrays(s, dtype, d) for s, d in zip(shapes, domains, strict=True)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", UNARY + BINARY)
@given(data=st.data())
def test_matches_numpy_eager_and_traced(name, dtype, data):
    nin = REGISTRY[name].ufunc.nin
    shapes = data.draw(fst.broadcastable_shapes(nin))
    xs = data.draw(in_domain(name, shapes, dtype))
    fn = getattr(fnp, name)
    with np.errstate(all="ignore"):
        expected = np.asarray(reference(name, *xs))
    eager = np.asarray(fn(*xs))
    traced = fg.jit(fn, fuse=False)(*xs)
    for got in (eager, traced):
        assert got.dtype == expected.dtype, (name, got.dtype, expected.dtype)
        assert got.shape == expected.shape
        tol = 1e-6 if dtype == np.float32 else 1e-13
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", [n for n in UNARY + BINARY if REGISTRY[n].vjp is not None])
@given(data=st.data())
def test_gradients_match_finite_differences(name, data):
    nin = REGISTRY[name].ufunc.nin
    shapes = data.draw(fst.broadcastable_shapes(nin))
    xs = data.draw(in_domain(name, shapes, np.float64))
    fn = getattr(fnp, name)
    if name in TIES:  # finite differences are wrong within eps of a tie
        gap = np.abs(np.subtract(*xs))
        assume(np.all((gap > 1e-3) | (gap == 0)))
    if name in REMAINDERS:  # ... and within eps of a jump
        ratio = xs[0] / xs[1]
        assume(np.all(np.abs(ratio - np.rint(ratio)) > 1e-3))
    if name in PIECEWISE_CONSTANT:  # finite differences jump at the steps; the rule is 0
        assert all(np.all(g == 0) for g in fg.vjp(fn, *xs)[1](np.ones_like(fn(*xs))))
    else:  # at ties the first derivative of maximum/minimum jumps, so check it only
        check_grads(fn, xs, order=1 if name in TIES else 2, modes=("fwd", "rev"))


@pytest.mark.parametrize("name", [n for n in UNARY + BINARY if REGISTRY[n].vjp is not None])
def test_float32_gradients_stay_float32(name):
    nin = REGISTRY[name].ufunc.nin
    x = np.full((2, 3), 0.5, np.float32)
    args = (x,) * nin
    if name == "arccosh":
        args = (x + 1,)
    grads = fg.grad(lambda *a: fnp.sum(getattr(fnp, name)(*a)), argnums=tuple(range(nin)))(*args)
    for g in grads:
        assert g.dtype == np.float32
    if name == "sigmoid":
        assert grads[0].shape == (2, 3)


def test_python_scalars_are_weak():
    x = np.ones(3, np.float32)
    assert (x * 2.0).dtype == np.float32
    assert fnp.multiply(x, 2.0).dtype == np.float32
    assert fg.jit(lambda x: x * 2.0 + 1)(x).dtype == np.float32
    assert fg.jit(lambda x, s: x * s)(x, 3.0).dtype == np.float32
    assert fg.grad(lambda x: fnp.sum(x * 2.0))(x).dtype == np.float32
    # NumPy scalars are not weak, as in NumPy.
    assert fnp.multiply(x, np.float64(2.0)).dtype == np.float64


def test_ints_promote_like_numpy():
    i = np.arange(3)
    assert fg.jit(lambda i: i / 2)(i).dtype == np.float64
    assert fg.jit(lambda i: i + 1)(i).dtype == np.int64
    assert fg.jit(lambda i, x: i * x)(i, np.ones(3, np.float32)).dtype == np.float64


def test_where_and_clip():
    x = np.array([-2.0, 0.5, 3.0])
    np.testing.assert_array_equal(fg.jit(lambda x: fnp.where(x > 0, x, 0.0))(x), [0, 0.5, 3])
    np.testing.assert_array_equal(fnp.clip(x, -1, 1), np.clip(x, -1, 1))
    g = fg.grad(lambda x: fnp.sum(fnp.where(x > 0, x * x, -x)))(x)
    np.testing.assert_array_equal(g, [-1.0, 1.0, 6.0])
    check_grads(lambda c, a, b: fnp.where(c, a, b), (x > 0, np.ones((2, 3)), x))


def test_maximum_ties_split_gradient_like_jax():
    x = np.array([1.0, 2.0, 3.0])
    gx, gy = fg.grad(lambda x, y: fnp.sum(fnp.maximum(x, y)), argnums=(0, 1))(x, np.full(3, 2.0))
    np.testing.assert_array_equal(gx, [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(gy, [1.0, 0.5, 0.0])
    np.testing.assert_array_equal(fg.grad(lambda x: fnp.sum(fnp.relu(x)))(x - 2), [0, 0, 1])


def test_power_edges():
    # docs/conventions.md, power-at-zero-base: d/dx 0**0 is 0 (x**0 is 1 for every x);
    # d/dy x**y at x == 0 is its limit, 0 for y > 0 (as JAX) and -inf at y == 0 (JAX: 0).
    g = fg.grad(lambda x, y: fnp.sum(x**y), argnums=(0, 1))(
        np.array([0.0, 2.0, 0.0]), np.array([0.0, 3.0, 2.0])
    )
    np.testing.assert_array_equal(g[0], [0.0, 12.0, 0.0])
    np.testing.assert_allclose(g[1], [-np.inf, 8 * np.log(2), 0.0])


def test_stable_derived_functions():
    x = np.array([-1000.0, 0.0, 1000.0], np.float32)
    assert np.all(np.isfinite(fnp.softplus(x)))
    np.testing.assert_allclose(fnp.sigmoid(x), [0, 0.5, 1])
    np.testing.assert_allclose(fg.grad(lambda x: fnp.sum(fnp.softplus(x)))(x), [0, 0.5, 1])
    check_grads(
        lambda a, b: fnp.logaddexp(a, b), (np.array([0.3, -2.0]), np.array([1.0, 5.0])), order=2
    )
    check_grads(fnp.log_sigmoid, (np.array([-3.0, 0.2, 4.0]),), order=2)


def test_float16_results_are_rejected_clearly():
    # NumPy gives float16 for small integers; fastgrad has no float16 kernels.
    with pytest.raises(TypeError, match="float16, which fastgrad does not support"):
        fg.jit(fnp.sqrt)(np.arange(3, dtype=np.int8))
    assert fg.jit(fnp.sqrt)(np.arange(3, dtype=np.int32)).dtype == np.float64
