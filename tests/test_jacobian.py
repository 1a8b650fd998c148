"""Jacobians (jacrev, jacfwd, hessian), linearize, and vjp/jvp of any output shape: against
finite-difference Jacobians, against each other, under jit, with pytrees in and out."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.testing import strategies as fst

rng = np.random.default_rng(4)


def numeric_jacobian(f, x, eps=1e-6):
    """Central differences: shape f(x).shape + x.shape."""
    out = np.asarray(f(x))
    cols = []
    for p in range(x.size):
        e = np.zeros(x.size)
        e[p] = eps
        e = e.reshape(x.shape)
        cols.append((np.asarray(f(x + e)) - np.asarray(f(x - e))).reshape(-1) / (2 * eps))
    if not cols:
        return np.zeros(out.shape + x.shape)
    return np.stack(cols, axis=-1).reshape(out.shape + x.shape)


def on_a_kink(f, x, eps=1e-6):
    """Whether one-sided differences of f at x disagree: x sits (within a step) on a kink
    such as a near tie of a max, where central differences average two slopes."""
    out = np.asarray(f(x))
    for p in range(x.size):
        e = np.zeros(x.size)
        e[p] = eps
        e = e.reshape(x.shape)
        ahead, behind = (np.asarray(f(x + e)) - out) / eps, (out - np.asarray(f(x - e))) / eps
        if not np.allclose(ahead, behind, rtol=1e-3, atol=1e-3):
            return True
    return False


def program_and_input():
    return fst.programs(max_inputs=1, stop_gradient=False).flatmap(
        lambda p: st.tuples(st.just(p), fst.arrays(p.shapes[0], np.float64, "real"))
    )


@given(program_and_input())
def test_jacobians_of_random_programs_match_finite_differences(case):
    program, x = case
    assume(program.clear_of_jumps([x]) and not on_a_kink(program, x))
    expected = numeric_jacobian(program, x)
    for jac in (fg.jacrev(program), fg.jacfwd(program), fg.jit(fg.jacrev(program), fuse=False)):
        got = jac(x)
        assert got.shape == expected.shape and got.dtype == np.float64
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(0,), (2, 0), (1,), (1, 1), ()])
def test_empty_and_unit_shapes(shape):
    x = np.ones(shape)
    for jac in (fg.jacrev, fg.jacfwd):
        got = jac(lambda x: fnp.sin(x) * 2.0)(x)
        assert got.shape == shape + shape
        np.testing.assert_allclose(got.reshape(x.size, x.size), np.diag(2 * np.cos(x).ravel()))
        assert jac(lambda x: fnp.sum(x))(x).shape == shape


def test_pytrees_in_and_out_nest_like_jax():
    def f(p, y):
        return {"a": p["w"] * y, "b": (fnp.sum(p["v"] ** 2), p["w"][0] * p["v"])}

    p = {"w": rng.standard_normal(2), "v": rng.standard_normal((2, 2))}
    y = rng.standard_normal(2)
    for argnums in (0, (0, 1)):
        rev, fwd = fg.jacrev(f, argnums)(p, y), fg.jacfwd(f, argnums)(p, y)
        assert fg.pytree.flatten(rev)[1] == fg.pytree.flatten(fwd)[1]
        for a, b in zip(fg.pytree.flatten(rev)[0], fg.pytree.flatten(fwd)[0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    jac = fg.jacrev(f)(p, y)
    np.testing.assert_allclose(jac["a"]["w"], np.diag(y))
    np.testing.assert_array_equal(jac["a"]["v"], np.zeros((2, 2, 2)))
    assert jac["b"][1]["v"].shape == (2, 2, 2, 2)
    np.testing.assert_allclose(jac["b"][0]["v"], 2 * p["v"])
    both = fg.jacfwd(f, argnums=(0, 1))(p, y)
    np.testing.assert_allclose(both["a"][1], np.diag(p["w"]))


def test_has_aux_jit_and_dtypes():
    def f(x):
        return fnp.tanh(x) * 3.0, {"norm": fnp.sum(x * x)}

    x = rng.standard_normal(3).astype(np.float32)
    for jac in (fg.jacrev, fg.jacfwd):
        (j, aux) = jac(f, has_aux=True)(x)
        assert j.dtype == np.float32 and j.shape == (3, 3)
        np.testing.assert_allclose(j, np.diag(3 / np.cosh(x) ** 2), rtol=1e-5)
        np.testing.assert_allclose(aux["norm"], np.sum(x * x), rtol=1e-6)
        fused = fg.jit(jac(f, has_aux=True))(x)
        np.testing.assert_allclose(fused[0], j, rtol=1e-6)
    # jacrev gives the input's dtype, jacfwd the output's, as in JAX.
    to32 = lambda x: x.astype(np.float32) * 2  # noqa: E731
    assert fg.jacrev(to32)(np.ones(2)).dtype == np.float64
    assert fg.jacfwd(to32)(np.ones(2)).dtype == np.float32
    assert fg.jacobian is fg.jacrev


def test_hessian_is_jacfwd_of_jacrev_and_composes():
    a = rng.standard_normal((3, 3))
    x = rng.standard_normal(3)
    f = lambda x: fnp.tanh(a @ x) * x  # noqa: E731
    h = fg.hessian(f)(x)
    assert h.shape == (3, 3, 3)
    np.testing.assert_allclose(h, fg.jacfwd(fg.jacrev(f))(x), rtol=1e-12)
    np.testing.assert_allclose(h, fg.jacrev(fg.jacrev(f))(x), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h, numeric_jacobian(fg.jacrev(f), x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(fg.jit(fg.hessian(f))(x), h, rtol=1e-12)
    value = lambda x: fnp.sum(f(x))  # noqa: E731
    np.testing.assert_allclose(fg.hessian(value)(x), h.sum(0), rtol=1e-12)


def test_jacobian_errors():
    with pytest.raises(TypeError, match="jacrev needs float arguments to differentiate"):
        fg.jacrev(lambda i: i * 1.0)(np.arange(3))
    with pytest.raises(TypeError, match="jacfwd needs float outputs, but output leaf 0"):
        fg.jacfwd(lambda x: (x > 0).astype(np.int64))(np.ones(2))
    with pytest.raises(TypeError, match="jacrev needs float outputs"):
        fg.jacrev(lambda x: (x, x > 0))(np.ones(2))
    with pytest.raises(ValueError, match="argnums 1 is out of range"):
        fg.jacfwd(lambda x: x, argnums=1)(np.ones(2))


# ---------------------------------------------------------------- linearize


def test_linearize_does_the_primal_work_once():
    calls = []

    def f(x, p):
        calls.append(1)
        return {"y": fnp.sin(x) * p["s"], "z": fnp.exp(x)}

    x, p = rng.standard_normal(3), {"s": rng.standard_normal(3)}
    out, f_jvp = fg.linearize(f, x, p)
    assert len(calls) == 1
    for _ in range(3):
        v, w = rng.standard_normal(3), {"s": rng.standard_normal(3)}
        expected = fg.jvp(f, (x, p), (v, w))[1]
        got = f_jvp(v, w)
        for key in ("y", "z"):
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-12)
    assert len(calls) == 4  # the three jvp calls above; f_jvp never calls f
    np.testing.assert_allclose(out["z"], np.exp(x))
    # The linear graph holds no sin or exp: those values were computed once, up front.
    graph = fg.make_graph(f_jvp)(v, w)
    assert not {"sin", "cos", "exp"} & {n.op.name for n in graph.nodes}
    np.testing.assert_allclose(fg.jit(f_jvp)(v, w)["y"], f_jvp(v, w)["y"], rtol=1e-12)


def test_linearize_inside_jit_and_grad():
    x, v = rng.standard_normal(3), rng.standard_normal(3)

    def directional(x, v):
        return fg.linearize(lambda x: fnp.sin(x) * x, x)[1](v)

    expected = fg.jvp(lambda x: fnp.sin(x) * x, (x,), (v,))[1]
    np.testing.assert_allclose(fg.jit(directional)(x, v), expected, rtol=1e-12)
    g = fg.grad(lambda x: fnp.sum(directional(x, v)))(x)
    np.testing.assert_allclose(g, numeric_jacobian(lambda x: np.sum(directional(x, v)), x), 1e-6)
    with pytest.raises(ValueError, match="tangent for x has shape"):
        fg.linearize(fnp.sin, x)[1](np.ones(4))
    out, f_jvp, aux = fg.linearize(lambda x: (fnp.sin(x), {"n": fnp.sum(x)}), x, has_aux=True)
    np.testing.assert_allclose(aux["n"], x.sum())
    np.testing.assert_allclose(f_jvp(v), np.cos(x) * v, rtol=1e-12)


# ---------------------------------------------------------------- vjp and jvp of any output


def test_vjp_and_jvp_of_pytree_outputs_of_any_shape():
    def f(x, y):
        return {"m": fnp.outer(x, y), "s": fnp.sum(x) * y[0], "e": x[:0]}

    x, y = rng.standard_normal(3), rng.standard_normal(2)
    out, vjp_fn = fg.vjp(f, x, y)
    ct = {"m": rng.standard_normal((3, 2)), "s": np.float64(0.7), "e": np.zeros(0)}
    gx, gy = vjp_fn(ct)
    np.testing.assert_allclose(gx, ct["m"] @ y + 0.7 * y[0], rtol=1e-12)
    np.testing.assert_allclose(gy, ct["m"].T @ x + np.array([0.7 * x.sum(), 0]), rtol=1e-12)
    v = (rng.standard_normal(3), rng.standard_normal(2))
    _, t = fg.jvp(f, (x, y), v)
    jac = fg.jacrev(f, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(t["m"], jac["m"][0] @ v[0] + jac["m"][1] @ v[1], rtol=1e-12)
    assert t["e"].shape == (0,)


# ---------------------------------------------------------------- of jitted functions


def test_jacobians_of_a_jitted_function_run_compiled_and_trace_once(monkeypatch):
    from test_jit import counting, leaves, refuse_interpreter

    def f(x, y):
        return {"a": fnp.tanh(x * y), "s": fnp.sum(fnp.sin(x) * y)}

    x, y = rng.standard_normal(3), rng.standard_normal(3)
    transforms = {
        "jacrev": lambda g, *a: fg.jacrev(g, argnums=(0, 1))(*a),
        "jacfwd": lambda g, *a: fg.jacfwd(g)(*a),
        "hessian": lambda g, *a: fg.hessian(g)(*a),
        "linearize": lambda g, *a: fg.linearize(g, *a)[1](x, y),
    }
    scales = (1.0, 2.0, 3.0)
    expected = {name: [t(f, x * c, y) for c in scales] for name, t in transforms.items()}
    body, traces = counting(f)
    jitted = fg.jit(body)
    refuse_interpreter(monkeypatch)
    for name, transform in transforms.items():
        for i, scale in enumerate(scales):
            got = transform(jitted, x * scale, y)
            np.testing.assert_allclose(leaves(got), leaves(expected[name][i]), 1e-10, 1e-13)
            if i == 0:
                count = len(traces)
        if name != "linearize":  # one compiled row or column function serves every call
            assert len(traces) == count, name
