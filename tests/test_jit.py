"""What a jitted function promises: a transform of it is compiled and cached too, in any
order of composition, and the arrays it closes over are baked in when it is traced."""

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.api import trace as api_trace

rng = np.random.default_rng(0)
X = rng.standard_normal((5, 3))
V = rng.standard_normal((5, 3))


def refuse_interpreter(monkeypatch):
    """From now on, running a graph on concrete arrays through the reference interpreter
    fails: what runs must be a compiled plan (inlining into a trace is still allowed)."""

    def refuse(graph, args):
        raise AssertionError("a graph ran through the reference interpreter, not compiled")

    monkeypatch.setattr(api_trace, "run_graph", refuse)


def counting(fun):
    """`fun`, and a list that grows each time its Python body runs (each trace)."""
    traces = []

    def counted(*args, **kwargs):
        traces.append(1)
        return fun(*args, **kwargs)

    counted.__name__ = fun.__name__
    return counted, traces


def loss(x, y):
    return fnp.sum(fnp.tanh(x * y) ** 2) + fnp.sum(fnp.sin(x))


def loss_and_aux(x, y):
    return loss(x, y), x * 2


def grad_norm(x, y):
    return fnp.sum(fg.grad(loss)(x, y) ** 2)


# (the function that is jitted, how the transform is applied to it)
COMPOSITIONS = {
    "grad": (loss, lambda f, x, y: fg.grad(f)(x, y)),
    "value_and_grad": (loss, lambda f, x, y: fg.value_and_grad(f, argnums=(0, 1))(x, y)),
    "grad has_aux": (loss_and_aux, lambda f, x, y: fg.grad(f, has_aux=True)(x, y)),
    "grad of jit of grad": (grad_norm, lambda f, x, y: fg.grad(f)(x, y)),
    "jvp of grad": (loss, lambda f, x, y: fg.jvp(fg.grad(f), (x, y), (V, 0 * y))),
    "hessian": (loss, lambda f, x, y: fg.hessian(f)(x[:2, :2], y[:2, :2])),
    "vjp of value_and_grad": (
        loss,
        lambda f, x, y: fg.vjp(fg.value_and_grad(f), x, y)[1]((1.0, x)),
    ),
}


def leaves(tree):
    return np.concatenate([np.ravel(g) for g in fg.pytree.flatten(tree)[0]])


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_a_transform_of_a_jitted_function_is_compiled_and_traced_once(name, monkeypatch):
    fun, apply = COMPOSITIONS[name]
    args = [(X * scale, V) for scale in (1.0, 2.0, 3.0)]
    expected = [apply(fun, *a) for a in args]  # not jitted: the reference interpreter
    body, traces = counting(fun)
    jitted = fg.jit(body)
    refuse_interpreter(monkeypatch)
    for i, (a, want) in enumerate(zip(args, expected, strict=True)):
        # the transform is made anew at every call, as users write it
        got = apply(jitted, *a)
        np.testing.assert_allclose(leaves(got), leaves(want), rtol=1e-10, atol=1e-13)
        if i == 0:
            first = len(traces)
    assert len(traces) == first  # later calls run the compiled plan: no trace


def test_transforms_of_jitted_functions_are_jitted_and_kept():
    f = fg.jit(loss)
    assert isinstance(fg.grad(f), type(f)) and fg.grad(f) is fg.grad(f)
    assert fg.grad(f) is not fg.grad(f, argnums=1)
    assert isinstance(fg.value_and_grad(fg.grad(fg.grad(f))), type(f))
    assert repr(fg.value_and_grad(fg.grad(f))) == "jit(value_and_grad(grad(loss)))"


def test_vjp_and_jvp_of_a_jitted_function(monkeypatch):
    body, traces = counting(lambda x: fnp.sin(x) * x)
    f = fg.jit(body)
    refuse_interpreter(monkeypatch)
    for _ in range(3):
        out, vjp_fn = fg.vjp(f, X)
        (ct,) = vjp_fn(V)
        np.testing.assert_allclose(out, np.sin(X) * X)
        np.testing.assert_allclose(ct, V * (np.cos(X) * X + np.sin(X)))
        out, t = fg.jvp(f, (X,), (V,))
        np.testing.assert_allclose(t, V * (np.cos(X) * X + np.sin(X)))
    assert len(traces) == 3  # the function, its backward pass, its jvp: once each
    _, vjp_fn, aux = fg.vjp(fg.jit(lambda x: (x * 2, x[0])), X, has_aux=True)
    np.testing.assert_array_equal(aux, X[0])
    np.testing.assert_array_equal(vjp_fn(V)[0], 2 * V)


def test_static_arguments_carry_over_and_are_never_differentiated():
    f = fg.jit(lambda x, n: fnp.sum(x**n), static_argnums=1)
    np.testing.assert_allclose(fg.grad(f)(X, 3), 3 * X**2)
    np.testing.assert_allclose(fg.hessian(f)(X[0], 3), np.diag(6 * X[0]))  # one hvp per column
    with pytest.raises(TypeError, match=r"argument\(s\) \[1\] are static"):
        fg.grad(f, argnums=1)
    with pytest.raises(TypeError, match=r"jvp of jit\(<lambda>\).*fg.jit\(lambda x"):
        fg.jvp(f, (X, 3), (V, 0))


def test_captured_arrays_are_baked_in_at_trace_time():
    # JAX's rule: a closure's arrays are read when the function is traced. Neither an
    # in-place change nor a rebinding of W reaches the traced function afterwards.
    W = np.ones(3)

    @fg.jit
    def f(x):
        return x * W

    x = np.arange(3.0)
    np.testing.assert_array_equal(f(x), x)
    W[:] = 2.0  # in place
    np.testing.assert_array_equal(f(x), x)
    W = np.full(3, 5.0)  # rebound  # noqa: F841
    np.testing.assert_array_equal(f(x), x)
    np.testing.assert_array_equal(f(np.arange(4.0)[:3] + 1), x + 1)  # a new trace would not
    g = fg.jit(lambda x: x * W)  # a new function sees the value W has now
    np.testing.assert_array_equal(g(x), 5 * x)
