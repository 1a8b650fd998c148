"""Forward mode: jvp against finite differences and reverse mode; hessian and HVPs.

Every primitive's JVP rule is checked on its domain, driven by the tables of
test_elementwise and test_structural; random programs check both modes and their
agreement, with stop_gradient'ed values frozen for the finite differences.
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.fusion import Call, Loop
from fastgrad.core.primitive import REGISTRY
from fastgrad.testing import check_grads
from fastgrad.testing import strategies as fst
from test_elementwise import BINARY, PIECEWISE_CONSTANT, REMAINDERS, TIES, UNARY, in_domain
from test_structural import ALL

rng = np.random.default_rng(7)
X = rng.standard_normal((3, 4))
W = rng.standard_normal((4, 2))
B = rng.standard_normal(2)


def inner(a, b):
    return sum(float(np.sum(np.asarray(x, np.float64) * np.asarray(y, np.float64)))
               for x, y in zip(a, b, strict=True))  # fmt: skip


def op_names(graph):
    return [n.op.name for n in graph.nodes]


def loops_of(fun, *args):
    steps = fg.jit(fun).lower(*args).executable.steps
    return [s for s in steps if isinstance(s, Loop)], [s for s in steps if isinstance(s, Call)]


# ---------------------------------------------------------------- every rule


def test_every_differentiable_primitive_has_a_jvp_rule():
    assert [n for n, p in REGISTRY.items() if p.vjp is not None and p.jvp is None] == []
    # No rule where there is no derivative: those outputs are integer or boolean.
    assert [n for n, p in REGISTRY.items() if p.vjp is None and p.jvp is not None] == []


ELEMENTWISE_DIFF = [n for n in UNARY + BINARY if REGISTRY[n].jvp is not None]


@pytest.mark.parametrize("name", ELEMENTWISE_DIFF)
@settings(max_examples=6)
@given(data=st.data())
def test_elementwise_jvp_rules_match_finite_differences(name, data):
    nin = REGISTRY[name].ufunc.nin
    shapes = data.draw(fst.broadcastable_shapes(nin))
    xs = data.draw(in_domain(name, shapes, np.float64))
    fn = getattr(fnp, name)
    if name in PIECEWISE_CONSTANT:  # the rule is a symbolic zero: no tangent flows
        _, tangent = fg.jvp(fn, xs, tuple(np.ones_like(x) for x in xs))
        assert np.all(tangent == 0)
        return
    if name in TIES:  # finite differences are wrong within eps of a tie
        gap = np.abs(np.subtract(*xs))
        assume(np.all((gap > 1e-3) | (gap == 0)))
    if name in REMAINDERS:  # ... and within eps of a jump
        ratio = xs[0] / xs[1]
        assume(np.all(np.abs(ratio - np.rint(ratio)) > 1e-3))
    # Order 2 checks the JVP of the JVP, the JVP of the VJP and the VJP of the JVP too.
    order = 1 if name in TIES else 2
    check_grads(fn, xs, order=order, modes=("fwd", "rev"))


@pytest.mark.parametrize("name", ELEMENTWISE_DIFF)
def test_float32_tangents_stay_float32(name):
    nin = REGISTRY[name].ufunc.nin
    x = np.full((2, 3), 0.5, np.float32)
    args = (x + 1,) if name == "arccosh" else (x,) * nin
    out, tangent = fg.jvp(getattr(fnp, name), args, tuple(np.ones_like(a) for a in args))
    assert tangent.dtype == out.dtype == np.float32 and tangent.shape == (2, 3)


@pytest.mark.parametrize("case", range(len(ALL)), ids=[f"{n}-{i}" for i, (n, _) in enumerate(ALL)])
def test_structural_jvp_rules(case):
    name, (fun, _, args) = ALL[case]
    v = tuple(rng.standard_normal(a.shape) for a in args)
    out, tangent = fg.jvp(fun, args, v)
    assert np.shape(tangent) == np.shape(out) and tangent.dtype == out.dtype
    if name == "stop_gradient":  # d/dx [sg(x) * x] along v treats sg(x) as the constant x
        np.testing.assert_allclose(tangent, args[0] * v[0])
    elif out.dtype.kind != "f":  # argmax, argmin: no tangent, zeros of the output's dtype
        assert np.all(tangent == 0)
    else:
        check_grads(fun, args, order=2, modes=("fwd", "rev"))
    args32 = tuple(a.astype(np.float32) for a in args)
    out32, tangent32 = fg.jvp(fun, args32, tuple(np.ones_like(a) for a in args32))
    assert tangent32.dtype == out32.dtype


def test_check_grads_catches_wrong_jvp_rules(monkeypatch):
    f = lambda x: fnp.sum(fnp.sin(x))  # noqa: E731
    x = np.linspace(0.1, 1, 4)
    check_grads(f, (x,), order=2, modes=("fwd",))
    # A wrong second derivative: the first is right, so only order 2 sees it.
    monkeypatch.setattr(REGISTRY["cos"], "jvp", lambda t, out, x: t[0] * fnp.sin(x))
    check_grads(f, (x,), order=1, modes=("fwd",))
    with pytest.raises(AssertionError, match="finite differences"):
        check_grads(f, (x,), order=2, modes=("fwd",))
    monkeypatch.setattr(REGISTRY["sin"], "jvp", lambda t, out, x: t[0] * fnp.sin(x))
    with pytest.raises(AssertionError, match="JVP does not match finite differences"):
        check_grads(f, (x,), modes=("fwd",))


def test_check_grads_reports_forward_and_reverse_disagreeing(monkeypatch):
    monkeypatch.setattr(REGISTRY["exp"], "jvp", lambda t, out, x: t[0] * out * (1 + 1e-4))
    check_grads(fnp.exp, (np.linspace(0, 1, 3),), modes=("fwd",), rtol=1e-3)
    with pytest.raises(AssertionError, match="forward and reverse mode disagree"):
        check_grads(fnp.exp, (np.linspace(0, 1, 3),), modes=("fwd", "rev"))


# ---------------------------------------------------------------- random programs


def program_and_inputs(dtype):
    return fst.programs().flatmap(
        lambda p: st.tuples(
            st.just(p), st.tuples(*(fst.arrays(s, dtype, "real") for s in p.shapes))
        )
    )


@given(program_and_inputs(np.float64))
def test_random_programs_in_both_modes(case):
    program, xs = case
    assume(program.clear_of_jumps(xs))
    v = tuple(np.random.default_rng(1).standard_normal(x.shape) for x in xs)
    out, tangent = fg.jvp(program, xs, v)
    np.testing.assert_allclose(out, program(*xs), rtol=1e-12, atol=1e-12)
    # stop_gradient'ed values get no tangent: the same as freezing them.
    frozen = program.frozen(xs)
    np.testing.assert_allclose(tangent, fg.jvp(frozen, xs, v)[1], rtol=1e-12, atol=1e-12)
    traced = fg.jit(lambda xs, v: fg.jvp(program, xs, v), fuse=False)(xs, v)
    np.testing.assert_allclose(traced[1], tangent, rtol=1e-12, atol=1e-12)
    check_grads(frozen, xs, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5)


@settings(max_examples=8)
@given(program_and_inputs(np.float32))
def test_random_float32_programs_keep_float32_tangents(case):
    program, xs = case
    v = tuple(np.ones_like(x) for x in xs)
    out, tangent = fg.jit(lambda *xs: fg.jvp(program, xs, v), fuse=False)(*xs)
    assert out.dtype == tangent.dtype == np.float32
    expected = fg.jvp(
        program, tuple(x.astype(np.float64) for x in xs), tuple(t.astype(np.float64) for t in v)
    )[1]
    np.testing.assert_allclose(tangent, expected, rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------- jvp


def mlp(x, w, b):
    h = fnp.tanh(x @ w + b)  # b broadcasts over the rows
    return fnp.sum(h * h, axis=0), fnp.max(h, axis=1, keepdims=True), fnp.mean(h)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_jvp_and_vjp_agree_with_broadcasting_and_reductions(dtype):
    args = tuple(a.astype(dtype) for a in (X, W, B))
    v = tuple(rng.standard_normal(a.shape).astype(dtype) for a in args)
    out, tangent = fg.jvp(mlp, args, v)
    assert [t.dtype for t in tangent] == [dtype] * 3
    assert [t.shape for t in tangent] == [o.shape for o in out]
    u = [rng.standard_normal(o.shape).astype(dtype) for o in out]
    _, vjp_fn = fg.vjp(mlp, *args)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(inner(u, tangent), inner(vjp_fn(tuple(u)), v), rtol=tol)


def test_mlp_derivatives_in_both_modes():
    check_grads(mlp, (X, W, B), order=2, modes=("fwd", "rev"))


def test_pytrees_python_scalars_and_has_aux():
    params = {"w": W, "b": B}
    tangents = {"w": np.ones_like(W), "b": np.zeros_like(B)}

    def f(p, x):
        z = x @ p["w"] + p["b"]
        return {"z": z, "s": fnp.sum(z)}, len(x)

    out, tangent, aux = fg.jvp(f, (params, X), (tangents, np.zeros_like(X)), has_aux=True)
    assert aux == 3 and set(tangent) == {"z", "s"}
    np.testing.assert_allclose(tangent["z"], X @ np.ones_like(W))
    np.testing.assert_allclose(tangent["s"], np.sum(X @ np.ones_like(W)))
    # Python scalars stay weak: a float32 result keeps a float32 tangent.
    x32 = np.arange(3, dtype=np.float32)
    out, tangent = fg.jvp(lambda s: x32 * s, (2.0,), (1.0,))
    assert out.dtype == tangent.dtype == np.float32
    np.testing.assert_array_equal(tangent, x32)


def test_outputs_that_do_not_depend_on_the_tangents_get_zeros():
    labels = np.array([1, 0, 1])
    out, tangent = fg.jvp(lambda x: (x * 2, fnp.argmax(x, axis=1), labels * 3), (X,), (X,))
    np.testing.assert_array_equal(tangent[0], 2 * X)
    assert tangent[1].dtype == np.int64 and np.all(tangent[1] == 0)
    assert tangent[2].dtype == labels.dtype and np.all(tangent[2] == 0)


def test_only_values_that_depend_on_a_tangent_get_one():
    c = rng.standard_normal(4)
    graph = fg.make_graph(lambda x, v: fg.jvp(lambda x: fnp.exp(x) + fnp.sin(c) ** 2, (x,), (v,)))(
        c, c
    )
    names = op_names(graph)
    assert "cos" not in names  # sin(c) is a constant: no tangent is built for it
    assert names.count("exp") == 1  # the tangent reuses the primal exp
    # Behind a stop_gradient nothing is built either: only the primal tanh.
    graph = fg.make_graph(
        lambda x, v: fg.jvp(lambda x: x * fg.stop_gradient(fnp.tanh(x)), (x,), (v,))
    )(c, c)
    assert op_names(graph).count("tanh") == 1 and op_names(graph).count("multiply") == 2


def test_compositions_with_jit_and_grad_agree():
    f = lambda x: fnp.sum(fnp.sin(x) * x**2)  # noqa: E731
    x, v, w = np.linspace(-1, 1, 5), rng.standard_normal(5), rng.standard_normal(5)
    hess = np.diag(2 * np.sin(x) + 4 * x * np.cos(x) - x**2 * np.sin(x))
    hvp = fg.jvp(fg.grad(f), (x,), (v,))[1]  # forward over reverse
    np.testing.assert_allclose(hvp, hess @ v, rtol=1e-12)
    rof = fg.grad(lambda x: fg.jvp(f, (x,), (v,))[1])(x)  # reverse over forward
    np.testing.assert_allclose(rof, hess @ v, rtol=1e-12)
    fof = fg.jvp(lambda x: fg.jvp(f, (x,), (v,))[1], (x,), (w,))[1]  # forward over forward
    np.testing.assert_allclose(fof, w @ hess @ v, rtol=1e-12)
    for g in (
        fg.jit(lambda x, v: fg.jvp(fg.grad(f), (x,), (v,))[1], fuse=False),
        lambda x, v: fg.jvp(fg.jit(fg.grad(f)), (x,), (v,))[1],
        lambda x, v: fg.jvp(fg.grad(fg.jit(f, fuse=False)), (x,), (v,))[1],
    ):
        np.testing.assert_allclose(g(x, v), hess @ v, rtol=1e-12)


def test_nested_jvp_keeps_perturbations_apart():
    # d/dx [x * (d/dy (x + y))] = d/dx [x] = 1: the inner tangent must not leak out.
    f = lambda x: x * fg.jvp(lambda y: x + y, (1.0,), (1.0,))[1]  # noqa: E731
    np.testing.assert_allclose(fg.jvp(f, (3.0,), (1.0,))[1], 1.0)
    # d/dx [x * (d/dy x*y)] = d/dx x^2 = 2x, with the inner closure over the outer x.
    g = lambda x: x * fg.jvp(lambda y: x * y, (1.0,), (1.0,))[1]  # noqa: E731
    np.testing.assert_allclose(fg.jvp(g, (3.0,), (1.0,))[1], 6.0)
    np.testing.assert_allclose(fg.grad(g)(3.0), 6.0)


def test_stop_gradient_tangents_are_zero_at_every_nesting_level():
    x = np.array([0.5, 1.5])
    one = np.ones(2)
    f = lambda x: x * fg.stop_gradient(x * x)  # noqa: E731  as if x * c, c = x*x fixed
    np.testing.assert_allclose(fg.jvp(f, (x,), (one,))[1], x * x)
    tangent = lambda x: fg.jvp(f, (x,), (one,))[1]  # noqa: E731  sg(x*x): no derivative
    np.testing.assert_array_equal(fg.jvp(tangent, (x,), (one,))[1], [0.0, 0.0])
    np.testing.assert_array_equal(fg.grad(lambda x: fnp.sum(tangent(x)))(x), [0.0, 0.0])
    np.testing.assert_array_equal(fg.jvp(fg.grad(lambda x: fnp.sum(f(x))), (x,), (one,))[1], 0)
    np.testing.assert_array_equal(fg.jit(lambda x: fg.jvp(tangent, (x,), (one,))[1])(x), 0)
    # A stop_gradient inside a function differentiated at an inner level stops the outer
    # level too: g(x) = sg(x * x), h(x) = sg(x) * x.
    g = lambda x: fg.grad(lambda y: fnp.sum(y * fg.stop_gradient(x * y)))(x)  # noqa: E731
    np.testing.assert_allclose(g(x), x * x)
    np.testing.assert_array_equal(fg.jvp(g, (x,), (one,))[1], [0.0, 0.0])
    h = lambda x: fg.grad(lambda y: fnp.sum(y * fg.stop_gradient(y) * x))(x)  # noqa: E731
    np.testing.assert_allclose(fg.jvp(h, (x,), (one,))[1], x)
    np.testing.assert_allclose(fg.jit(fg.grad(lambda x: fnp.sum(h(x))))(x), x)
    # Pytrees: every float leaf is stopped; integer leaves pass through.
    k = lambda p, n: fg.stop_gradient(p)["a"] * p["b"] * n  # noqa: E731
    p = {"a": x, "b": x + 1}
    t = fg.jvp(lambda p: k(p, np.arange(2)), (p,), ({"a": one, "b": 2 * one},))[1]
    np.testing.assert_allclose(t, 2 * x * np.arange(2))


def test_jvp_of_an_elementwise_chain_is_one_fused_loop():
    f = lambda x: fnp.tanh(x * x + fnp.sin(x)) * fnp.exp(-x)  # noqa: E731
    g = lambda x, v: fg.jvp(f, (x,), (v,))  # noqa: E731
    x, v = rng.standard_normal(1000), rng.standard_normal(1000)
    loops, calls = loops_of(g, x, v)
    assert len(loops) == 1 and not calls
    assert len(loops[0].outputs) == 2  # the value and its tangent, from one pass over x, v
    fused, reference = fg.jit(g)(x, v), fg.jit(g, fuse=False)(x, v)
    for a, b in zip(fused, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(fused[1], g(x, v)[1], rtol=1e-12, atol=1e-14)


def test_fused_hessian_vector_product_matches_the_reference():
    def loss(w, x, labels):
        z = x @ w
        return -fnp.mean(fnp.log_softmax(z)[np.arange(len(labels)), labels])

    x, w = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((4, 3))
    labels, v = rng.integers(0, 3, 8), rng.standard_normal((4, 3))
    w, v = w.astype(np.float32), v.astype(np.float32)
    hvp = lambda w, v: fg.jvp(lambda w: fg.grad(loss)(w, x, labels), (w,), (v,))[1]  # noqa: E731
    fused, reference = fg.jit(hvp)(w, v), fg.jit(hvp, fuse=False)(w, v)
    assert fused.dtype == np.float32
    np.testing.assert_allclose(fused, reference, rtol=1e-5, atol=1e-6)
    h = fg.hessian(loss)(w.astype(np.float64), x, labels).reshape(12, 12)
    np.testing.assert_allclose(reference, (h @ v.reshape(-1)).reshape(4, 3), rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- hessian


def fd_hessian(f, x, eps=1e-5):
    g = fg.grad(f)
    cols = []
    for j in range(x.size):
        e = np.zeros(x.size)
        e[j] = eps
        e = e.reshape(x.shape)
        cols.append(((g(x + e) - g(x - e)) / (2 * eps)).reshape(-1))
    return np.stack(cols, axis=-1).reshape(x.shape + x.shape)


def test_hessian_against_formulas_and_finite_differences():
    a = rng.standard_normal((4, 4))
    x = rng.standard_normal(4)
    f = lambda x: 0.5 * x @ (a @ x) + fnp.sum(fnp.exp(x))  # noqa: E731
    expected = (a + a.T) / 2 + np.diag(np.exp(x))
    h = fg.hessian(f)(x)
    np.testing.assert_allclose(h, expected, rtol=1e-12)
    np.testing.assert_allclose(h, fd_hessian(f, x), rtol=1e-6, atol=1e-7)
    m = rng.standard_normal((2, 3))
    g = lambda m: fnp.sum(fnp.tanh(m) ** 2) * fnp.mean(m)  # noqa: E731
    hm = fg.hessian(g)(m)
    assert hm.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(hm, fd_hessian(g, m), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(hm.reshape(6, 6), hm.reshape(6, 6).T, rtol=1e-12)
    v = rng.standard_normal((2, 3))
    hvp = fg.jvp(fg.grad(g), (m,), (v,))[1]
    np.testing.assert_allclose(hvp, np.einsum("ijkl,kl->ij", hm, v), rtol=1e-12)
    np.testing.assert_allclose(fg.hessian(lambda s: s**4)(1.5), 12 * 1.5**2)


def test_hessian_of_several_arguments_and_pytrees():
    def f(x, p):
        return fnp.sum(fnp.sin(x) * p["w"]) * fnp.sum(p["b"] ** 2)

    x, p = rng.standard_normal(3), {"w": rng.standard_normal(3), "b": rng.standard_normal(2)}
    h = fg.hessian(f, argnums=(0, 1))(x, p)
    # The joint Hessian in z = [x, b, w] (pytree leaves in flatten order).
    joint = fg.hessian(lambda z: f(z[:3], {"b": z[3:5], "w": z[5:]}))(
        np.concatenate([x, p["b"], p["w"]])
    )
    spans = {"x": slice(0, 3), "b": slice(3, 5), "w": slice(5, 8)}
    blocks = {"x": lambda t: t[0], "b": lambda t: t[1]["b"], "w": lambda t: t[1]["w"]}
    for i in spans:
        for j in spans:
            np.testing.assert_allclose(
                blocks[j](blocks[i](h)), joint[spans[i], spans[j]], rtol=1e-12, atol=1e-15
            )
    hp = fg.hessian(f, argnums=1)(x, p)
    assert set(hp) == {"w", "b"} and hp["w"]["b"].shape == (3, 2)


def test_hessian_float32_jit_and_integer_arguments():
    def loss(w, labels):
        return -fnp.sum(fnp.log_softmax(w)[np.arange(2), labels])

    w, labels = rng.standard_normal((2, 3)).astype(np.float32), np.array([2, 0])
    h = fg.hessian(loss)(w, labels)
    assert h.dtype == np.float32 and h.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(fg.jit(fg.hessian(loss), fuse=False)(w, labels), h, rtol=1e-6)
    p = np.exp(w[0]) / np.exp(w[0]).sum()
    np.testing.assert_allclose(h[0, :, 0, :], np.diag(p) - np.outer(p, p), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(h[0, :, 1, :], 0)


# ---------------------------------------------------------------- errors


def test_jvp_errors_name_the_argument():
    f = lambda x, y: x * y  # noqa: E731
    x = np.ones(3)
    with pytest.raises(TypeError, match=r"primals must be a tuple or list .* fg.jvp\(f, \(x,\)"):
        fg.jvp(f, x, x)
    with pytest.raises(ValueError, match="got 2 primal.* but 1 tangent"):
        fg.jvp(f, (x, x), (x,))
    with pytest.raises(ValueError, match=r"tangent for argument y has structure .*\(\*, \*\)"):
        fg.jvp(f, (x, (x, x)), (x, [x, x]))
    with pytest.raises(ValueError, match=r"tangent for y has shape \(4,\), its primal \(3,\)"):
        fg.jvp(f, (x, x), (x, np.ones(4)))
    with pytest.raises(TypeError, match="tangent for x has dtype float64, its primal float32"):
        fg.jvp(f, (x.astype(np.float32), x), (x, x))
    with pytest.raises(TypeError, match="jvp needs float primals, but argument y has dtype int64"):
        fg.jvp(f, (x, np.arange(3)), (x, np.zeros(3)))
    with pytest.raises(TypeError, match="must return a pair"):
        fg.jvp(lambda x: x, (x,), (x,), has_aux=True)


def test_hessian_of_a_vector_or_pytree_output_nests_like_jax():
    x = np.array([1.0, 2.0, 3.0])
    h = fg.hessian(lambda x: x**3)(x)  # out + in + in
    assert h.shape == (3, 3, 3)
    np.testing.assert_allclose(h, np.einsum("i,ij,ik->ijk", 6 * x, np.eye(3), np.eye(3)))
    s, v = fg.hessian(lambda x: (fnp.sum(x**2), x * 2))(x)
    np.testing.assert_allclose(s, 2 * np.eye(3))
    np.testing.assert_array_equal(v, np.zeros((3, 3, 3)))


def test_hessian_errors():
    x = np.ones(3)
    with pytest.raises(TypeError, match="hessian needs float outputs, but output leaf 0"):
        fg.hessian(lambda x: (x > 0).astype(np.int64))(x)
    with pytest.raises(TypeError, match="hessian needs float arguments to differentiate"):
        fg.hessian(lambda i: fnp.sum(i * 1.0))(np.arange(3))
    with pytest.raises(ValueError, match="argnums 2 is out of range"):
        fg.hessian(lambda x: fnp.sum(x), argnums=2)(x)


def test_check_grads_rejects_unknown_modes():
    with pytest.raises(ValueError, match="'forward' is not a mode; use 'fwd'"):
        check_grads(fnp.sin, (np.ones(2),), modes=("forward",))
