"""The escape hatch: fg.primitive (a NumPy/SciPy function with the user's derivative rules)
and fg.pure_callback (a host function with none), eager, under jit (compiled and
reference), and under grad and jvp at several orders."""

import numpy as np
import pytest
import scipy.special

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.testing import check_grads

X = np.linspace(-1.0, 1.2, 5)

erf = fg.primitive(scipy.special.erf)
erf.defvjp(lambda g, out, x: (g * (2 / np.sqrt(np.pi)) * fnp.exp(-x * x),))

# exp whose rule uses its own result: grad of grad goes through the rule again.
exp = fg.primitive(np.exp)
exp.defvjp(lambda g, out, x: (g * out,))


def test_plain_arrays_call_the_function():
    calls = []
    f = fg.primitive(lambda x: calls.append(1) or np.sin(x))
    np.testing.assert_array_equal(f(X), np.sin(X))
    assert len(calls) == 1  # no tracing, no type inference on plain arrays


@pytest.mark.parametrize("fuse", [True, False])
def test_jit_runs_it_as_a_call_back_into_python(fuse):
    f = fg.jit(lambda x: fnp.sum(erf(x * 2.0) ** 2), fuse=fuse)
    np.testing.assert_allclose(f(X), np.sum(scipy.special.erf(X * 2) ** 2), rtol=1e-14)
    g = fg.jit(fg.grad(lambda x: fnp.sum(erf(x * 2.0) ** 2)), fuse=fuse)(X)
    expected = 2 * scipy.special.erf(2 * X) * 4 / np.sqrt(np.pi) * np.exp(-4 * X * X)
    np.testing.assert_allclose(g, expected, rtol=1e-13)


def test_derivatives_of_every_order_use_the_rule():
    check_grads(erf, (X,), order=3, modes=("rev",))
    check_grads(erf, (X,), order=2, modes=("fwd", "rev"))  # forward mode transposes the rule
    check_grads(lambda x: exp(x) * x, (X,), order=3, modes=("fwd", "rev"))
    third = fg.grad(fg.grad(fg.grad(lambda x: exp(x))))(0.5)
    np.testing.assert_allclose(third, np.exp(0.5))


def test_the_rule_is_what_differentiation_uses():
    wrong = fg.primitive(np.sin)
    wrong.defvjp(lambda g, out, x: (2 * g * fnp.cos(x),))
    np.testing.assert_allclose(fg.grad(lambda x: fnp.sum(wrong(x)))(X), 2 * np.cos(X))
    np.testing.assert_allclose(fg.jvp(wrong, (X,), (np.ones(5),))[1], 2 * np.cos(X))


def test_a_jvp_rule_is_used_in_forward_mode():
    seen = []
    sin = fg.primitive(np.sin)
    sin.defvjp(lambda g, out, x: (g * fnp.cos(x),))
    sin.defjvp(lambda t, out, x: seen.append(1) or t[0] * fnp.cos(x))
    check_grads(sin, (X,), order=2, modes=("fwd", "rev"))
    assert seen


def test_several_arguments_and_results_as_pytrees():
    def f(x, p):
        return np.sin(x) * p["a"], (np.cos(x), p["a"] * 2)

    def f_vjp(g, out, x, p):
        gx = g[0] * fnp.cos(x) * p["a"] - g[1][0] * fnp.sin(x)
        return gx, {"a": g[0] * fnp.sin(x) + 2 * g[1][1]}

    prim = fg.primitive(f)
    prim.defvjp(f_vjp)
    p = {"a": X + 2}
    check_grads(prim, (X, p), order=2, modes=("fwd", "rev"))
    for fuse in (True, False):
        out = fg.jit(prim, fuse=fuse)(X, p)
        np.testing.assert_allclose(out[1][0], np.cos(X))


def test_integer_arguments_and_keywords_pass_through():
    take = fg.primitive(lambda x, i, axis: np.take(x, i, axis=axis))
    take.defvjp(lambda g, out, x, i, axis: (_scatter(g, i, x), None))

    def loss(x):
        return fnp.sum(take(x, np.array([0, 2]), axis=0) ** 2)

    np.testing.assert_allclose(fg.grad(loss)(X), [2 * X[0], 0, 2 * X[2], 0, 0])
    np.testing.assert_allclose(fg.jit(loss)(X), X[0] ** 2 + X[2] ** 2)


def _scatter(g, i, x):
    # g placed at positions i of an array like x, with fastgrad ops.
    onehot = (np.arange(x.shape[0])[None, :] == i[:, None]).astype(np.float64)
    return g @ onehot


def test_result_types_given_or_inferred():
    halve = fg.primitive(
        lambda x: x[::2].astype(np.float32),
        result_shape_dtypes=lambda x: fg.ShapeDtypeStruct(((x.shape[0] + 1) // 2,), np.float32),
    )
    got = fg.jit(halve)(X)
    assert got.dtype == np.float32 and got.shape == (3,)
    wrong = fg.primitive(np.sin, result_shape_dtypes=fg.ShapeDtypeStruct((4,), np.float64))
    with pytest.raises(TypeError, match=r"returned f64\[5\] for result leaf 0, but was declared"):
        fg.jit(wrong)(X)
    failing = fg.primitive(lambda x: np.linalg.cholesky(x))
    with pytest.raises(TypeError, match="could not find its result types .* result_shape_dtypes"):
        fg.jit(failing)(np.eye(2))


def test_rule_errors_are_clear():
    no_rule = fg.primitive(np.sin)
    with pytest.raises(TypeError, match="has no derivative \\(reverse mode\\)"):
        fg.grad(lambda x: fnp.sum(no_rule(x)))(X)
    bad = fg.primitive(np.sin)
    bad.defvjp(lambda g, out, x: g)
    with pytest.raises(TypeError, match="must return a tuple with one cotangent per positional"):
        fg.grad(lambda x: fnp.sum(bad(x)))(X)
    shape = fg.primitive(np.sin)
    shape.defvjp(lambda g, out, x: (g[:2],))
    with pytest.raises(ValueError, match=r"cotangent of shape \(2,\) for a value of shape \(5,\)"):
        fg.grad(lambda x: fnp.sum(shape(x)))(X)


# ---------------------------------------------------------------- pure_callback


def sorted_copy(x):
    return fg.pure_callback(np.sort, fg.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.mark.parametrize("fuse", [True, False])
def test_pure_callback_under_jit(fuse):
    f = fg.jit(lambda x: sorted_copy(x * 2.0) + 1.0, fuse=fuse)
    np.testing.assert_array_equal(f(X[::-1]), np.sort(X * 2) + 1)
    np.testing.assert_array_equal(sorted_copy(X[::-1]), np.sort(X))
    x32 = X.astype(np.float32)
    assert f(x32).dtype == np.float32


def test_pure_callback_has_no_derivative():
    with pytest.raises(TypeError, match=r"pure_callback\(sort\) has no derivative"):
        fg.grad(lambda x: fnp.sum(sorted_copy(x) ** 2))(X)
    with pytest.raises(TypeError, match="has no derivative \\(forward mode\\)"):
        fg.jvp(sorted_copy, (X,), (X,))
    # Cut by stop_gradient, the rest of the function is differentiated.
    g = fg.grad(lambda x: fnp.sum(sorted_copy(fg.stop_gradient(x)) * x))(X)
    np.testing.assert_array_equal(g, np.sort(X))


def test_pure_callback_checks_what_it_returns():
    spec = fg.ShapeDtypeStruct((5,), np.float32)
    with pytest.raises(TypeError, match=r"returned f64\[5\]"):
        fg.pure_callback(np.sort, spec, X)
    with pytest.raises(TypeError, match="result leaf 0 is a int"):
        fg.pure_callback(np.sort, 5, X)


def test_the_readme_example_runs_and_its_rule_is_right():
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"## The escape hatch.*?```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README escape hatch", "exec"), scope)  # noqa: S102
    x, struve = scope["x"], scope["struve"]
    np.testing.assert_allclose(scope["value"], np.sum(scipy.special.struve(1.0, x) ** 2))
    check_grads(lambda x: struve(1.0, x), (x,), order=2, modes=("fwd", "rev"))
    h = fg.hessian(scope["f"])(x)
    np.testing.assert_allclose(np.diag(h), np.diag(fg.jacfwd(fg.grad(scope["f"]))(x)))
