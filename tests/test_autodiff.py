"""grad, value_and_grad, vjp: argnums, has_aux, pytrees, composition, symbolic zeros."""

from collections import namedtuple

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.testing import check_grads

rng = np.random.default_rng(1)
X = rng.standard_normal((3, 4))
W = rng.standard_normal((4, 2))


def mse(params, x, y):
    pred = fnp.tanh(x @ params["w"] + params["b"])
    return fnp.mean((pred - y) ** 2)


PARAMS = {"w": W, "b": np.zeros(2)}
Y = rng.standard_normal((3, 2))


def test_grad_of_pytree_has_its_structure():
    g = fg.grad(mse)(PARAMS, X, Y)
    assert set(g) == {"w", "b"} and g["w"].shape == (4, 2) and g["b"].shape == (2,)
    eps = 1e-6
    w2 = W.copy()
    w2[1, 0] += eps
    w3 = W.copy()
    w3[1, 0] -= eps
    fd = (mse({"w": w2, "b": PARAMS["b"]}, X, Y) - mse({"w": w3, "b": PARAMS["b"]}, X, Y)) / (
        2 * eps
    )
    np.testing.assert_allclose(g["w"][1, 0], fd, rtol=1e-6)


def test_argnums_tuple_and_negative():
    gx, gp = fg.grad(mse, argnums=(1, 0))(PARAMS, X, Y)
    assert gx.shape == X.shape and set(gp) == {"w", "b"}
    gy = fg.grad(mse, argnums=-1)(PARAMS, X, Y)
    assert gy.shape == Y.shape


def test_value_and_grad_with_aux():
    def loss(w, x):
        z = x @ w
        return fnp.sum(z**2), {"z": z, "n": 3}

    (value, aux), g = fg.value_and_grad(loss, has_aux=True)(W, X)
    np.testing.assert_allclose(value, np.sum((X @ W) ** 2))
    np.testing.assert_allclose(aux["z"], X @ W)
    assert aux["n"] == 3
    np.testing.assert_allclose(g, 2 * X.T @ (X @ W))
    g2, aux2 = fg.grad(loss, has_aux=True)(W, X)
    np.testing.assert_allclose(g2, g)


def test_namedtuple_and_none_leaves():
    P = namedtuple("P", "a b")

    def f(p, unused):
        return fnp.sum(p.a * p.b)

    g = fg.grad(f)(P(np.ones(2), np.full(2, 3.0)), None)
    assert isinstance(g, P)
    np.testing.assert_array_equal(g.a, [3.0, 3.0])


def test_vjp_matches_jacobian():
    f = lambda x, w: fnp.sin(x @ w)  # noqa: E731
    out, vjp_fn = fg.vjp(f, X, W)
    ct = rng.standard_normal(out.shape)
    gx, gw = vjp_fn(ct)
    d = np.cos(X @ W) * ct
    np.testing.assert_allclose(gx, d @ W.T)
    np.testing.assert_allclose(gw, X.T @ d)
    out2, vjp2, aux = fg.vjp(lambda x: (x * 2, fnp.sum(x)), X, has_aux=True)
    np.testing.assert_allclose(aux, X.sum())
    np.testing.assert_array_equal(vjp2(np.ones_like(X))[0], np.full(X.shape, 2.0))


def test_compositions_agree():
    f = lambda w: mse({"w": w, "b": PARAMS["b"]}, X, Y)  # noqa: E731
    expected = fg.grad(f)(W)
    for g in (fg.jit(fg.grad(f)), fg.grad(fg.jit(f)), fg.jit(fg.grad(fg.jit(f)))):
        np.testing.assert_allclose(g(W), expected, rtol=1e-12)


def test_grad_of_grad_and_hessian_vector_product():
    f = lambda x: fnp.sum(fnp.sin(x) * x**2)  # noqa: E731
    x = np.linspace(-1, 1, 5)
    second = fg.grad(lambda x: fnp.sum(fg.grad(f)(x)))(x)
    expected = 2 * np.sin(x) + 4 * x * np.cos(x) - x**2 * np.sin(x)
    np.testing.assert_allclose(second, expected, rtol=1e-12)
    np.testing.assert_allclose(fg.jit(fg.grad(fg.grad(lambda x: x**4)))(3.0), 108.0)
    third = fg.grad(fg.grad(fg.grad(lambda x: fnp.exp(2 * x))))(0.5)
    np.testing.assert_allclose(third, 8 * np.exp(1.0))
    check_grads(f, (x,), order=3)


def test_closure_over_outer_tracer():
    # d/dx [x * (d/dy x*y)] = d/dx x^2 = 2x
    f = lambda x: x * fg.grad(lambda y: x * y)(1.0)  # noqa: E731
    np.testing.assert_allclose(fg.grad(f)(3.0), 6.0)
    np.testing.assert_allclose(fg.jit(fg.grad(f))(3.0), 6.0)
    h = lambda x: fg.jit(lambda y: x * y)(2.0)  # noqa: E731
    np.testing.assert_allclose(fg.grad(h)(5.0), 2.0)


def test_symbolic_zeros_build_no_backward_nodes():
    # y does not reach the output: its gradient is a zero broadcast, with no backward work.
    graph = fg.make_graph(fg.grad(lambda x, y: fnp.sum(fnp.exp(x)), argnums=1))(X, X)
    assert {n.op.name for n in graph.nodes} <= {"const", "broadcast_to"}
    g = fg.grad(lambda x, y: fnp.sum(fnp.exp(x)), argnums=(0, 1))(X, X)
    np.testing.assert_array_equal(g[1], np.zeros_like(X))


def test_integer_arguments_pass_through_grad():
    def loss(z, labels):
        return -fnp.mean(fnp.log_softmax(z)[np.arange(3), labels])

    labels = np.array([0, 1, 3])
    g = fg.grad(loss)(X, labels)
    p = np.exp(X) / np.exp(X).sum(1, keepdims=True)
    np.testing.assert_allclose(g, (p - np.eye(4)[labels]) / 3, rtol=1e-12)
    check_grads(loss, (X, labels), order=2)


def test_float32_end_to_end():
    p32 = {k: v.astype(np.float32) for k, v in PARAMS.items()}
    value, g = fg.jit(fg.value_and_grad(mse))(p32, X.astype(np.float32), Y.astype(np.float32))
    assert value.dtype == np.float32 and g["w"].dtype == np.float32
    value64, g64 = fg.value_and_grad(mse)(PARAMS, X, Y)
    np.testing.assert_allclose(g["w"], g64["w"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("order", [1, 2])
def test_check_grads_catches_a_wrong_rule(order, monkeypatch):
    from fastgrad.core.primitive import REGISTRY

    monkeypatch.setattr(REGISTRY["sin"], "vjp", lambda g, out, x: (g * fnp.sin(x),))
    with pytest.raises(AssertionError, match="finite differences"):
        check_grads(lambda x: fnp.sum(fnp.sin(x)), (np.linspace(0.1, 1, 4),), order=order)
