"""custom_vjp: the user's backward rule is what differentiation uses, in every composition.

A deliberately wrong rule shows up in the gradient, so these tests see the rule and not
the function's own derivative. The compiled function inlines the rule's graphs, so fused
and reference runs must agree and fusion never sees a custom_vjp node.
"""

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.fusion import Loop
from fastgrad.compiler.passes import simplify
from fastgrad.testing import check_grads

rng = np.random.default_rng(11)
X = rng.standard_normal((4, 5))


def op_names(graph):
    return [n.op.name for n in graph.nodes]


# A stable logsumexp whose backward pass is the softmax it already computed.
@fg.custom_vjp
def lse(x):
    return fnp.log(fnp.sum(fnp.exp(x), axis=-1))


def lse_fwd(x):
    m = fg.stop_gradient(fnp.max(x, axis=-1, keepdims=True))
    out = fnp.log(fnp.sum(fnp.exp(x - m), axis=-1)) + m[..., 0]
    return out, (x, out)


def lse_bwd(res, g):
    x, out = res
    return (g[..., None] * fnp.exp(x - out[..., None]),)


lse.defvjp(lse_fwd, lse_bwd)


# sin with a rule that is right (and differentiable, so grad of grad works), and one that
# is deliberately twice too large.
@fg.custom_vjp
def sin(x):
    return fnp.sin(x)


sin.defvjp(lambda x: (fnp.sin(x), x), lambda x, g: (g * fnp.cos(x),))


@fg.custom_vjp
def sin_wrong(x):
    return fnp.sin(x)


sin_wrong.defvjp(lambda x: (fnp.sin(x), x), lambda x, g: (2 * g * fnp.cos(x),))


@fg.custom_vjp
def round_ste(x):
    return fnp.rint(x)


round_ste.defvjp(lambda x: (fnp.rint(x), None), lambda res, g: (g,))


def test_the_users_rule_is_used():
    x = np.linspace(-1, 1, 5)
    loss = lambda x: fnp.sum(sin_wrong(x) * 3.0)  # noqa: E731
    for g in (fg.grad(loss), fg.jit(fg.grad(loss), fuse=False), fg.grad(fg.jit(loss))):
        np.testing.assert_allclose(g(x), 6 * np.cos(x), rtol=1e-12)
    np.testing.assert_allclose(fg.vjp(sin_wrong, x)[1](np.ones(5))[0], 2 * np.cos(x))
    # Called outside any trace, it is just the function.
    np.testing.assert_allclose(sin_wrong(x), np.sin(x))
    np.testing.assert_allclose(fg.jit(sin_wrong, fuse=False)(x), np.sin(x))


def test_stable_logsumexp_rule():
    x = X * 1000  # exp overflows in the plain function
    value, g = fg.value_and_grad(lambda x: fnp.sum(lse(x)))(x)
    np.testing.assert_allclose(value, np.sum(fnp.logsumexp(x, axis=-1)), rtol=1e-12)
    np.testing.assert_allclose(g, fnp.softmax(x), rtol=1e-12, atol=1e-300)
    check_grads(lambda x: lse(x), (X,), order=2, modes=("fwd", "rev"))


def test_printed_graph_shows_the_call_and_the_rule():
    graph = fg.make_graph(fg.value_and_grad(lambda x: fnp.sum(lse(x))))(X)
    assert "a: f64[4] = custom_vjp(lse)(x)" in str(graph)
    # The backward pass is the rule's: exp(x - out) from the residuals, no VJP of log.
    names = op_names(graph)
    assert names.count("custom_vjp_call") == 1 and "divide" not in names
    simplified = simplify(graph)
    assert "custom_vjp_call" not in op_names(simplified)
    assert op_names(simplified).count("exp") == 2  # forward, and the rule's softmax
    # The gradient alone needs only the residuals: the call itself is pruned.
    assert "custom_vjp_call" not in op_names(fg.make_graph(fg.grad(lambda x: fnp.sum(lse(x))))(X))


def test_fused_and_reference_agree_and_fusion_sees_plain_primitives():
    x = (X * 100).astype(np.float32)
    f = fg.value_and_grad(lambda x: fnp.sum(lse(x) * fnp.tanh(fnp.sum(x, axis=1))))
    steps = fg.jit(f).lower(x).executable.steps
    assert len(steps) == 1 and isinstance(steps[0], Loop)  # value and gradient in one loop
    fused, reference = fg.jit(f)(x), fg.jit(f, fuse=False)(x)
    for a, b in zip(fused, reference, strict=True):
        assert a.dtype == b.dtype == np.float32 and np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_straight_through_estimator_in_both_modes():
    x = np.array([0.2, 1.7, -0.6])
    np.testing.assert_array_equal(fg.jit(round_ste, fuse=False)(x), np.rint(x))
    g = fg.grad(lambda x: fnp.sum(round_ste(x) ** 2))(x)
    np.testing.assert_allclose(g, 2 * np.rint(x))
    # Forward mode uses the transpose of the rule: the identity here.
    v = np.array([1.0, -2.0, 0.5])
    out, tangent = fg.jvp(round_ste, (x,), (v,))
    np.testing.assert_array_equal(out, np.rint(x))
    np.testing.assert_array_equal(tangent, v)


def test_grad_of_grad_differentiates_the_rule():
    x = np.linspace(-1, 1, 5)
    second = fg.grad(lambda x: fnp.sum(fg.grad(lambda y: fnp.sum(sin(y)))(x)))(x)
    np.testing.assert_allclose(second, -np.sin(x), rtol=1e-12)
    np.testing.assert_allclose(fg.hessian(lambda x: fnp.sum(sin(x)))(x), np.diag(-np.sin(x)))
    check_grads(lambda x: sin(x) * x, (x,), order=3, modes=("fwd", "rev"))
    # A wrong rule is differentiated as written: d/dx [2 cos x] = -2 sin x.
    second_wrong = fg.grad(lambda x: fnp.sum(fg.grad(lambda y: fnp.sum(sin_wrong(y)))(x)))(x)
    np.testing.assert_allclose(second_wrong, -2 * np.sin(x), rtol=1e-12)


def test_pytrees_several_outputs_and_zero_cotangents():
    @fg.custom_vjp
    def affine(p, x):
        z = x @ p["w"] + p["b"]
        return {"z": z, "norm": fnp.sum(z * z)}, p["scale"]

    def fwd(p, x):
        out = affine.fun(p, x)
        return out, (p, x, out[0]["z"])

    def bwd(res, g):
        p, x, z = res
        (g_out, g_scale) = g
        gz = g_out["z"] + 2 * g_out["norm"] * z
        # no gradient for x; "scale" gets its own
        return {"w": x.T @ gz, "b": fnp.sum(gz, axis=0), "scale": g_scale}, None

    affine.defvjp(fwd, bwd)
    p = {"w": rng.standard_normal((5, 2)), "b": rng.standard_normal(2), "scale": 3.0}

    def loss(p, x, f):
        out, scale = f(p, x)
        return fnp.sum(fnp.sin(out["z"])) + 0.1 * out["norm"] * scale

    for f in (fg.grad(loss), fg.jit(fg.grad(loss), static_argnums=2, fuse=False)):
        got = f(p, X, affine)
        expected = fg.grad(loss)(p, X, affine.fun)
        assert set(got) == {"w", "b", "scale"}
        for k in got:
            np.testing.assert_allclose(got[k], expected[k], rtol=1e-12)
    gx = fg.grad(loss, argnums=1)(p, X, affine)
    np.testing.assert_array_equal(gx, np.zeros_like(X))  # the rule says x gets none
    check_grads(lambda w: loss({**p, "w": w}, X, affine), (p["w"],), modes=("fwd", "rev"))


def test_a_call_with_several_outputs_runs_its_rule_once():
    @fg.custom_vjp
    def sin_cos(x):
        return fnp.sin(x), fnp.cos(x)

    # J^T g = g0 cos x - g1 sin x, written with tan to mark the rule in the graph.
    sin_cos.defvjp(
        lambda x: (sin_cos.fun(x), x), lambda x, g: ((g[0] - g[1] * fnp.tan(x)) * fnp.cos(x),)
    )
    x, v = np.linspace(-1, 1, 5), rng.standard_normal(5)

    def loss(x):
        s, c = sin_cos(x)
        return fnp.sum(s * s + 3 * c)

    expected = 2 * np.sin(x) * np.cos(x) - 3 * np.sin(x)
    np.testing.assert_allclose(fg.grad(loss)(x), expected, rtol=1e-12)
    assert op_names(fg.make_graph(fg.grad(loss))(x)).count("tan") == 1
    out, tangent = fg.jvp(sin_cos, (x,), (v,))
    np.testing.assert_allclose(tangent[0], np.cos(x) * v, rtol=1e-12)
    np.testing.assert_allclose(tangent[1], -np.sin(x) * v, rtol=1e-12)
    assert op_names(fg.make_graph(lambda x, v: fg.jvp(sin_cos, (x,), (v,)))(x, v)).count("tan") == 1


def test_integer_and_nondiff_arguments():
    @fg.custom_vjp
    def pick_logprob(z, labels):
        return fnp.log_softmax(z)[np.arange(4), labels]

    def fwd(z, labels):
        logp = fnp.log_softmax(z)
        return logp[np.arange(4), labels], (fnp.exp(logp), labels)

    def bwd(res, g):
        p, labels = res
        onehot = (fnp.arange(5)[None, :] == labels[:, None]).astype(p.dtype)
        return (g[:, None] * (onehot - p), None)

    pick_logprob.defvjp(fwd, bwd)
    labels = np.array([0, 4, 2, 2])
    loss = lambda z, labels: -fnp.mean(pick_logprob(z, labels))  # noqa: E731
    expected = fg.grad(loss)(X, labels)
    p = np.exp(X) / np.exp(X).sum(1, keepdims=True)
    np.testing.assert_allclose(expected, (p - np.eye(5)[labels]) / 4, rtol=1e-12)
    np.testing.assert_allclose(fg.jit(fg.grad(loss))(X, labels), expected, rtol=1e-12)

    # A static argument: bwd gets it first and returns no cotangent for it.
    def softmax_fwd(x, axis):
        out = fnp.softmax(x, axis)
        return out, out

    def softmax_bwd(axis, out, g):
        return (out * (g - fnp.sum(g * out, axis=axis, keepdims=True)),)

    softmax = fg.custom_vjp(lambda x, axis=-1: fnp.softmax(x, axis), nondiff_argnums=(1,))
    softmax.defvjp(softmax_fwd, softmax_bwd)
    for axis in (0, -1):
        got = fg.vjp(lambda x, axis=axis: softmax(x, axis), X)[1](X)[0]
        want = fg.vjp(lambda x, axis=axis: fnp.softmax(x, axis), X)[1](X)[0]
        np.testing.assert_allclose(got, want, rtol=1e-12)
    check_grads(lambda x: softmax(x, axis=0), (X,), order=2, modes=("fwd", "rev"))
    check_grads(softmax, (X,), modes=("fwd", "rev"))  # the default axis


def test_repeated_and_nested_calls():
    # Two calls on different inputs, a call inside a jitted function used twice, and a rule
    # whose fwd calls another custom function.
    @fg.custom_vjp
    def outer(x):
        return lse(x) * 2

    outer.defvjp(lambda x: (lse(x) * 2, x), lambda x, g: (2 * g[..., None] * fnp.softmax(x),))
    inner = fg.jit(lambda x: lse(x) + outer(x))

    def f(x):
        return fnp.sum(lse(x) + lse(2 * x)) + fnp.sum(inner(x) * inner(-x))

    def plain(x):
        lse_ = lambda x: fnp.logsumexp(x, axis=-1)  # noqa: E731
        inner_ = lambda x: 3 * lse_(x)  # noqa: E731
        return fnp.sum(lse_(x) + lse_(2 * x)) + fnp.sum(inner_(x) * inner_(-x))

    np.testing.assert_allclose(fg.grad(f)(X), fg.grad(plain)(X), rtol=1e-12)
    fused = fg.jit(fg.value_and_grad(f))(X)
    reference = fg.jit(fg.value_and_grad(f), fuse=False)(X)
    for a, b in zip(fused, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert "custom_vjp_call" not in op_names(simplify(fg.make_graph(fg.grad(f))(X)))


def test_forward_mode_uses_the_transposed_rule():
    v = rng.standard_normal(X.shape)
    out, tangent = fg.jvp(sin_wrong, (X,), (v,))
    np.testing.assert_allclose(tangent, 2 * np.cos(X) * v)  # the rule, not the function
    u = rng.standard_normal(X.shape)
    np.testing.assert_allclose(
        np.sum(u * tangent), np.sum(fg.vjp(sin_wrong, X)[1](u)[0] * v), rtol=1e-12
    )
    hvp = fg.jvp(fg.grad(lambda x: fnp.sum(lse(x))), (X,), (v,))[1]
    expected = fg.jvp(fg.grad(lambda x: fnp.sum(fnp.logsumexp(x, axis=-1))), (X,), (v,))[1]
    np.testing.assert_allclose(hvp, expected, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- errors


def make(fwd, bwd, fun=lambda x, y: x * y, **kw):
    f = fg.custom_vjp(fun, **kw)
    f.defvjp(fwd, bwd)
    return f


def grad_of(f, *args):
    return fg.grad(lambda *a: fnp.sum(f(*a)))(*args)


def test_rule_errors_say_what_was_expected():
    x = np.ones(3)
    ok_fwd = lambda x, y: (x * y, (x, y))  # noqa: E731

    @fg.custom_vjp
    def f(x):
        return x

    with pytest.raises(TypeError, match=r"function f has no rule: call f.defvjp\(fwd, bwd\)"):
        grad_of(f, x)
    with pytest.raises(TypeError, match=r"fwd rule of <lambda> must return a pair"):
        grad_of(make(lambda x, y: x * y, lambda r, g: (g, g)), x, x)
    with pytest.raises(
        TypeError, match=r"output first, but its output is f64\[\] where .*f64\[3\]"
    ):
        grad_of(make(lambda x, y: (fnp.sum(x * y), None), lambda r, g: (g, g)), x, x)
    with pytest.raises(TypeError, match=r"one cotangent per differentiable argument \(2\), got 1"):
        grad_of(make(ok_fwd, lambda r, g: (g,)), x, x)
    with pytest.raises(
        TypeError, match=r"argument \(1\), got a single array; write `return \(g,\)`"
    ):
        grad_of(make(lambda x: (x, None), lambda r, g: g, fun=lambda x: x), x)
    with pytest.raises(
        ValueError, match=r"cotangent of shape \(1,\) for y, which has shape \(3,\)"
    ):
        grad_of(make(ok_fwd, lambda r, g: (g * r[1], fnp.sum(g, keepdims=True))), x, x)
    with pytest.raises(ValueError, match=r"returned for p has structure .*but the argument has"):
        grad_of(
            make(lambda p: (p["a"], None), lambda r, g: ((g,),), fun=lambda p: p["a"]),
            {"a": x},
        )
    with pytest.raises(TypeError, match="cotangent for n, which has dtype int64 .* return None"):
        grad_of(
            make(lambda x, n: (x * n, n), lambda n, g: (g * n, g * n), fun=lambda x, n: x * n),
            x,
            np.arange(3),
        )


def test_closures_and_traced_static_arguments_are_errors():
    x = np.ones(3)

    def loss(w):
        f = make(lambda x: (x * w, None), lambda r, g: (g,), fun=lambda x: x * w)
        return fnp.sum(f(x))

    with pytest.raises(TypeError, match=r"fwd rule of .* closes over the traced value `w`"):
        fg.grad(loss)(x)

    def loss2(w):
        f = make(lambda x: (x, None), lambda r, g: (g * w,), fun=lambda x: x)
        return fnp.sum(f(x))

    with pytest.raises(TypeError, match=r"bwd rule of .* closes over the traced value"):
        fg.grad(loss2)(x)
    f = make(lambda x, k: (x * k, None), lambda k, r, g: (g * k,), fun=lambda x, k: x * k,
             nondiff_argnums=1)  # fmt: skip
    np.testing.assert_allclose(grad_of(f, x, 3.0), 3 * x)
    with pytest.raises(
        TypeError, match="argument k of <lambda> is in nondiff_argnums but is a traced"
    ):
        fg.grad(lambda k: fnp.sum(f(x, k)))(3.0)
