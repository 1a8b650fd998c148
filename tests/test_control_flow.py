"""scan, fori_loop, while_loop, cond, switch and checkpoint: values against the Python loop
they stand for, derivatives against finite differences (orders 1 and 2, both modes) and
against the unrolled loop, compiled runs against the reference interpreter, and the
errors bad input gets.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.control_flow import LoopStep
from fastgrad.testing import check_grads, directional_derivative

rng = np.random.default_rng(14)
W = rng.standard_normal((3, 3)) * 0.5
U = rng.standard_normal((2, 3)) * 0.5


def rnn_step(W, U):
    def step(carry, x):
        h, total = carry
        h = fnp.tanh(h @ W + x @ U)
        return (h, total + fnp.sum(h * h)), fnp.sin(h)

    return step


def rnn_scan(W, U, h0, xs, reverse=False):
    (h, total), ys = fg.scan(rnn_step(W, U), (h0, 0.0), xs, reverse=reverse)
    return fnp.sum(ys * ys) + total + fnp.sum(h)


def rnn_unrolled(W, U, h0, xs, reverse=False):
    step = rnn_step(W, U)
    carry, ys = (h0, 0.0), [None] * len(xs)
    for t in reversed(range(len(xs))) if reverse else range(len(xs)):
        carry, ys[t] = step(carry, xs[t])
    h, total = carry
    ys_sum = sum((fnp.sum(y * y) for y in ys), start=0.0)
    return ys_sum + total + fnp.sum(h)


trips = st.integers(0, 4)
seeds = st.integers(0, 2**16)


def data(seed, T):
    r = np.random.default_rng(seed)
    return r.standard_normal(3), r.standard_normal((T, 2))


@given(T=trips, seed=seeds, reverse=st.booleans())
def test_scan_matches_the_python_loop_in_value_and_gradient(T, seed, reverse):
    h0, xs = data(seed, T)
    args = (W, U, h0, xs)
    f = lambda *a: rnn_scan(*a, reverse=reverse)  # noqa: E731
    g = lambda *a: rnn_unrolled(*a, reverse=reverse)  # noqa: E731
    np.testing.assert_allclose(f(*args), g(*args), rtol=1e-12)
    for got, want in zip(
        fg.grad(f, argnums=(0, 1, 2, 3))(*args),
        fg.grad(g, argnums=(0, 1, 2, 3))(*args),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@given(T=trips, seed=seeds)
def test_scan_derivatives_of_order_two_in_both_modes(T, seed):
    h0, xs = data(seed, T)
    check_grads(rnn_scan, (W, U, h0, xs), order=2, modes=("fwd", "rev"))


@given(T=st.integers(0, 3), seed=seeds, shape=st.sampled_from([(), (2,), (2, 2)]))
def test_scan_with_pytree_carry_and_outputs(T, seed, shape):
    r = np.random.default_rng(seed)
    init = {"a": r.standard_normal(shape), "b": (r.standard_normal(shape), np.int64(3))}
    xs = {"u": r.standard_normal((T, *shape)), "v": r.uniform(0.5, 1.5, (T,))}

    def f(a, b0, u, v):
        def step(c, x):
            a, (b, n) = c["a"], c["b"]
            a2 = a * x["v"] + fnp.cos(b)
            b2 = b - 0.5 * a * x["u"]
            return {"a": a2, "b": (b2, n + 1)}, {"p": a2 * b2, "n": n}

        c, ys = fg.scan(step, {"a": a, "b": (b0, np.int64(3))}, {"u": u, "v": v})
        counts.append(ys["n"])
        return fnp.sum(c["a"]) + fnp.sum(ys["p"]) + fnp.sum(c["b"][0] ** 2)

    def unrolled(a, b, u, v):
        total = 0.0
        for t in range(T):
            a, b = a * v[t] + fnp.cos(b), b - 0.5 * a * u[t]
            total = total + fnp.sum(a * b)
        return fnp.sum(a) + total + fnp.sum(b**2)

    args = (init["a"], init["b"][0], xs["u"], xs["v"])
    counts: list = []
    np.testing.assert_allclose(f(*args), unrolled(*args), rtol=1e-12)
    np.testing.assert_array_equal(counts[0], np.arange(3, 3 + T))  # an integer output
    check_grads(f, args, order=2, modes=("fwd", "rev"))


def test_scan_without_xs_integer_outputs_and_nesting():
    def inner(c, x):  # a nested scan over the columns
        return fg.scan(lambda s, col: (s * 0.5 + fnp.sin(col), s), c, x)

    def f(m):
        c, ys = fg.scan(inner, fnp.zeros(3), m)
        count, idx = fg.scan(lambda k, _: (k + 1, k * 2), 0, None, length=4)
        assert idx.dtype == np.int64 and idx.shape == (4,)
        return fnp.sum(c**2) + fnp.sum(ys * ys) + count

    def unrolled(m):
        c, total = fnp.zeros(3), 0.0
        for t in range(m.shape[0]):
            for k in range(m.shape[1]):
                total = total + fnp.sum(c * c)
                c = c * 0.5 + fnp.sin(m[t, k])
        return fnp.sum(c**2) + total + 4

    m = rng.standard_normal((2, 3, 3))
    np.testing.assert_allclose(f(m), unrolled(m))
    np.testing.assert_allclose(fg.grad(f)(m), fg.grad(unrolled)(m), rtol=1e-12)
    check_grads(f, (m,), order=2, modes=("fwd", "rev"))


def test_stop_gradient_custom_vjp_and_fnp_inside_a_body():
    @fg.custom_vjp
    def clipped(x):
        return fnp.clip(x, -1.0, 1.0)

    clipped.defvjp(lambda x: (fnp.clip(x, -1.0, 1.0), None), lambda _, g: (g,))  # straight-through

    def f(w, xs):
        def step(h, x):
            z = fnp.logsumexp(fnp.stack([h * w, x]), axis=0)
            return clipped(z) + fg.stop_gradient(h) * 0.1, fnp.softmax(z)

        h, ys = fg.scan(step, fnp.ones(2), xs)
        return fnp.sum(h) + fnp.sum(ys[:, 0])

    def unrolled(w, xs):
        h, total = fnp.ones(2), 0.0
        for t in range(len(xs)):
            z = fnp.logsumexp(fnp.stack([h * w, xs[t]]), axis=0)
            h = clipped(z) + fg.stop_gradient(h) * 0.1
            total = total + fnp.softmax(z)[0]
        return fnp.sum(h) + total

    w, xs = np.array([0.3, -0.7]), rng.standard_normal((4, 2))
    np.testing.assert_allclose(f(w, xs), unrolled(w, xs), rtol=1e-12)
    for k in (0, 1):
        np.testing.assert_allclose(
            fg.grad(f, k)(w, xs), fg.grad(unrolled, k)(w, xs), rtol=1e-10, atol=1e-14
        )


def test_compiled_scan_matches_the_reference_interpreter():
    h0, xs = data(1, 6)
    args = (W, U, h0, xs)
    for fun in (fg.value_and_grad(rnn_scan, argnums=(0, 1)), lambda *a: rnn_scan(*a, reverse=True)):
        got = fg.pytree.flatten(fg.jit(fun)(*args))[0]
        want = fg.pytree.flatten(fg.jit(fun, fuse=False)(*args))[0]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    hess = fg.jit(fg.hessian(lambda W: rnn_scan(W, U, h0, xs)))(W)
    np.testing.assert_allclose(hess, fg.hessian(lambda W: rnn_unrolled(W, U, h0, xs))(W), rtol=1e-9)


def test_a_compiled_scan_compiles_its_body_once_whatever_the_trip_count():
    f = fg.jit(fg.grad(rnn_scan))

    def body_kernels(T):
        plan = f.lower(W, U, *data(2, T)).executable.plan
        return [[k.source for k in s.kernels] for s in plan if isinstance(s, LoopStep)]

    short, long = body_kernels(3), body_kernels(40)
    assert len(short) == 2 and short == long  # forward and backward scan, same kernels
    h0, xs = data(2, 40)
    np.testing.assert_allclose(f(W, U, h0, xs), fg.grad(rnn_unrolled)(W, U, h0, xs), rtol=1e-10)


def test_value_and_grad_runs_the_forward_loop_once():
    # The forward scan that stacks residuals also gives the value: one forward loop.
    h0, xs = data(4, 5)
    plan = fg.jit(fg.value_and_grad(rnn_scan)).lower(W, U, h0, xs).executable.plan
    loops = [s for s in plan if isinstance(s, LoopStep)]
    assert [s.call.reverse for s in loops] == [False, True]


def loop_steps(fun, *args):
    """The control-flow steps of the plan of `fun` jitted, for these arguments."""
    return [s for s in fg.jit(fun).lower(*args).executable.plan if isinstance(s, LoopStep)]


def test_a_loop_of_small_matmuls_runs_them_on_one_blas_thread():
    from threadpoolctl import threadpool_info

    def blas_threads(x):  # x only ties the call to the step
        threads = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
        return np.array(min(threads, default=1), dtype=np.int64)

    def f(W, xs):
        def step(h, x):
            seen = fg.pure_callback(blas_threads, fg.ShapeDtypeStruct((), np.int64), x[0, 0])
            return fnp.tanh(h @ W + x), seen

        return fg.scan(step, xs[0], xs)

    small, big = rng.standard_normal((3, 3)), rng.standard_normal((210, 210))
    xs_small, xs_big = rng.standard_normal((4, 2, 3)), rng.standard_normal((2, 210, 210))
    assert [s.small_matmuls for s in loop_steps(f, small, xs_small)] == [True]
    assert [s.small_matmuls for s in loop_steps(f, big, xs_big)] == [False]  # 210^3 > 2^23
    h, seen = fg.jit(f)(small, xs_small)
    assert set(seen.tolist()) == {1}
    h_ref = xs_small[0]
    for x in xs_small:
        h_ref = np.tanh(h_ref @ small + x)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12)

    # A switch runs once: no limit of its own. A loop over one limits BLAS for both.
    def branch(W, x):
        return fg.cond(x[0, 0] > 0, lambda x: x @ W, lambda x: -x, x)

    (switch,) = loop_steps(branch, small, xs_small[0])
    assert switch.largest_matmul == 2 * 3 * 3 and not switch.small_matmuls
    (outer,) = loop_steps(
        lambda W, xs: fg.scan(lambda c, x: (c + branch(W, x), None), xs[0], xs), small, xs_small
    )
    (inner,) = [s for s in outer.bodies[0].plan if isinstance(s, LoopStep)]
    assert outer.small_matmuls and not inner.small_matmuls


def test_float32_scan_keeps_float32():
    xs = rng.standard_normal(5).astype(np.float32)
    f = lambda w: fnp.sum(fg.scan(lambda c, x: (c * w + x, c), 0.0, xs)[1])  # noqa: E731
    w = np.float32(0.5)
    assert fg.jit(fg.grad(f))(w).dtype == np.float32
    c, _ = fg.scan(lambda c, x: (c * w + x, c), 0.0, xs)
    assert c.dtype == np.float32  # a Python-scalar carry takes the body's dtype


# ---- fori_loop and while_loop


@given(lower=st.integers(-2, 2), n=st.integers(0, 4), seed=seeds)
def test_fori_loop_with_static_bounds_is_a_differentiable_scan(lower, n, seed):
    x = np.random.default_rng(seed).standard_normal(3)

    def f(x):
        return fnp.sum(fg.fori_loop(lower, lower + n, lambda i, v: fnp.sin(v) * (i + 1.5), x))

    def unrolled(x):
        for i in range(lower, lower + n):
            x = fnp.sin(x) * (i + 1.5)
        return fnp.sum(x)

    np.testing.assert_allclose(f(x), unrolled(x), rtol=1e-12)
    check_grads(f, (x,), order=2, modes=("fwd", "rev"))


def newton_sqrt(a):
    # Newton's iteration for sqrt(a), stopped by a data-dependent test.
    def body(c):
        x, k = c
        return 0.5 * (x + a / x), k + 1

    return fg.while_loop(lambda c: (fnp.abs(c[0] * c[0] - a) > 1e-12) & (c[1] < 50), body, (a, 0))[
        0
    ]


def test_while_loop_runs_a_data_dependent_trip_count_and_has_a_jvp():
    a = 2.0
    assert abs(float(newton_sqrt(a)) - np.sqrt(2.0)) < 1e-12
    out, t = fg.jvp(newton_sqrt, (a,), (1.0,))
    # The derivative of Newton's iterate converges to that of sqrt.
    np.testing.assert_allclose(t, 0.5 / np.sqrt(2.0), rtol=1e-9)
    check_grads(
        lambda x: fg.fori_loop(0, 3, lambda i, v: v * fnp.cos(v), x),
        (0.3,),
        modes=("fwd",),
        order=2,
    )
    compiled = fg.jit(lambda a: fg.jvp(newton_sqrt, (a,), (np.ones_like(a),)))
    np.testing.assert_allclose(compiled(np.array(3.0))[1], 0.5 / np.sqrt(3.0), rtol=1e-9)


def test_fori_loop_with_traced_bounds_is_a_while_loop():
    f = fg.jit(lambda n, x: fg.fori_loop(0, n, lambda i, v: v * 2.0 + i, x))
    assert float(f(np.int64(4), 1.0)) == 1.0 * 16 + (0 * 8 + 1 * 4 + 2 * 2 + 3)


def test_reverse_mode_through_while_loop_says_what_to_use():
    with pytest.raises(TypeError, match="scan, or fg.fori_loop with static"):
        fg.grad(newton_sqrt)(2.0)
    n = 3
    with pytest.raises(TypeError, match="Reverse-mode differentiation does not work"):
        fg.jit(lambda n, x: fg.grad(lambda x: fg.fori_loop(0, n, lambda i, v: v * v, x))(x))(n, 1.0)


# ---- cond and switch


def piecewise(x, w):
    return fg.cond(fnp.sum(x) > 0, lambda x: fnp.sin(x) * w, lambda x: x * x * w + 1.0, x)


@given(seed=seeds)
def test_cond_differentiates_through_the_branch_taken(seed):
    r = np.random.default_rng(seed)
    x, w = r.standard_normal(3), r.standard_normal(3)
    want = np.sin(x) * w if x.sum() > 0 else x * x * w + 1.0
    np.testing.assert_allclose(piecewise(x, w), want)
    check_grads(lambda x, w: fnp.sum(piecewise(x, w) ** 2), (x, w), order=2, modes=("fwd", "rev"))
    compiled = fg.jit(fg.grad(lambda x, w: fnp.sum(piecewise(x, w) ** 2), argnums=(0, 1)))
    reference = fg.grad(lambda x, w: fnp.sum(piecewise(x, w) ** 2), argnums=(0, 1))
    for a, b in zip(compiled(x, w), reference(x, w), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


@given(index=st.integers(-2, 4))
def test_switch_clamps_its_index_and_differentiates(index):
    branches = [lambda x: fnp.exp(x), lambda x: x**3, lambda x: fnp.tanh(x) * 2.0]
    x = np.array([0.2, -0.4])
    f = lambda x, i: fnp.sum(fg.switch(i, branches, x))  # noqa: E731
    k = min(max(index, 0), 2)
    np.testing.assert_allclose(f(x, index), np.sum(branches[k](x)))
    check_grads(lambda x: f(x, np.int32(index)), (x,), order=2, modes=("fwd", "rev"))
    assert float(fg.jit(f)(x, np.int32(index))) == pytest.approx(float(np.sum(branches[k](x))))


def test_cond_inside_scan():
    def f(xs):
        def step(c, x):
            c = fg.cond(x > 0, lambda c: c * x, lambda c: c - x, c)
            return c, c

        return fnp.sum(fg.scan(step, 1.0, xs)[1])

    xs = np.array([0.5, -1.0, 2.0, -0.3])
    check_grads(f, (xs,), order=2, modes=("fwd", "rev"))
    np.testing.assert_allclose(fg.jit(fg.grad(f))(xs), fg.grad(f)(xs), rtol=1e-12)


# ---- checkpoint


def test_checkpoint_gives_the_same_derivatives():
    step = lambda h, x: (fnp.tanh(h @ W + x @ U), fnp.sum(h))  # noqa: E731

    def f(h0, xs, remat):
        body = fg.checkpoint(step) if remat else step
        h, ys = fg.scan(body, h0, xs)
        return fnp.sum(h**2) + fnp.sum(ys)

    h0, xs = data(3, 5)
    np.testing.assert_allclose(fg.grad(f)(h0, xs, True), fg.grad(f)(h0, xs, False), rtol=1e-12)
    check_grads(lambda h0: f(h0, xs, True), (h0,), order=2, modes=("fwd", "rev"))
    compiled = fg.jit(fg.grad(f), static_argnums=2)
    np.testing.assert_allclose(compiled(h0, xs, True), fg.grad(f)(h0, xs, False), rtol=1e-12)


def test_checkpointed_body_stacks_only_its_inputs():
    def count_stacked(remat):
        step = lambda h, x: (fnp.tanh(fnp.sin(h @ W) + x @ U), None)  # noqa: E731
        body = fg.checkpoint(step) if remat else step
        graph = fg.make_graph(fg.grad(lambda h0, xs: fnp.sum(fg.scan(body, h0, xs)[0])))(
            *data(0, 4)
        )
        scans = [n for n in graph.nodes if n.op.name == "scan" and not n.params["call"].reverse]
        return sum(1 for n in scans if n.out.aval.shape[:1] == (4,))

    assert count_stacked(True) == 1 < count_stacked(False)


# ---- errors


def test_a_carry_that_changes_shape_or_dtype_names_the_leaf_and_both_types():
    xs = np.ones((3, 2))
    with pytest.raises(TypeError, match=r"carry\['h'\] has shape \(2,\).*shape \(1, 2\)"):
        fg.scan(lambda c, x: ({"h": c["h"][None] * x}, None), {"h": np.ones(2)}, xs)
    with pytest.raises(TypeError, match=r"carry\[1\] has .*dtype float32.*dtype float64"):
        fg.scan(lambda c, x: ((c[0], c[1] + x[0]), None), (1, np.float32(0)), xs)
    with pytest.raises(TypeError, match="while_loop: the carry leaf carry"):
        fg.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, fnp.stack([c[1], c[1]])), (0, 1.0))


def test_bad_predicates_and_indices():
    with pytest.raises(TypeError, match=r"predicate must be a boolean scalar, got f64\[\]"):
        fg.cond(np.float64(1.0), lambda: 1.0, lambda: 2.0)
    with pytest.raises(TypeError, match=r"boolean scalar, got bool\[2\]"):
        fg.jit(lambda x: fg.cond(x > 0, lambda: 1.0, lambda: 2.0))(np.ones(2))
    with pytest.raises(TypeError, match="cond_fun .* must return a boolean scalar"):
        fg.while_loop(lambda c: c, lambda c: c + 1.0, 1.0)
    with pytest.raises(TypeError, match="index must be an integer scalar"):
        fg.switch(0.5, [lambda: 1.0], ())


def test_xs_with_mismatched_leading_axes():
    with pytest.raises(ValueError, match=r"same leading axis, got xs\[0\]: 3, xs\[1\]: 4"):
        fg.scan(lambda c, x: (c, None), 0.0, (np.ones(3), np.ones((4, 2))))
    with pytest.raises(ValueError, match=r"and length=5, got xs: 3"):
        fg.scan(lambda c, x: (c, None), 0.0, np.ones(3), length=5)
    with pytest.raises(ValueError, match="give length="):
        fg.scan(lambda c, x: (c, None), 0.0)
    with pytest.raises(ValueError, match="is a scalar"):
        fg.scan(lambda c, x: (c, None), 0.0, np.float64(1.0))


def test_branch_output_mismatch_shows_both():
    with pytest.raises(
        TypeError,
        match=r"false_fun returns f64\[\] and true_fun returns f64\[3\]",
    ):
        fg.cond(True, lambda x: x, lambda x: fnp.sum(x), np.ones(3))
    with pytest.raises(
        TypeError, match=r"branch 0 returns \(f64\[3\], f64\[3\]\) and branch 1 returns f64\[3\]"
    ):
        fg.switch(0, [lambda x: (x, x), lambda x: x], np.ones(3))


inf = np.inf
# fmt: off
_AWKWARD = (  # kinks, ties, edges and non-finite values (docs/conventions.md)
    (fnp.relu, [0.0, -1.5, 2.0]),
    (fnp.abs, [0.0, -0.0, 2.0]),
    (lambda x: fnp.maximum(x, 1.0), [1.0, inf, -inf]),
    (lambda x: fnp.logaddexp(x, 0.3), [0.3, inf, -inf]),
    (lambda x: fnp.power(x, 0.0), [0.0, 2.0]),
    (fnp.sqrt, [0.0, 4.0]),
    (fnp.floor, [2.0, 1.5]),
)
_WRAPPED = {
    "scan": lambda f: lambda x: fg.scan(lambda c, _: (f(c), None), x, None, length=1)[0],
    "fori_loop": lambda f: lambda x: fg.fori_loop(0, 1, lambda i, v: f(v), x),
    "cond": lambda f: lambda x: fg.cond(np.bool_(True), f, lambda v: v * 0.0, x),
    "checkpoint": lambda f: fg.checkpoint(f),
}
# fmt: on


@pytest.mark.parametrize("how", sorted(_WRAPPED))
def test_conventions_hold_inside_loops_branches_and_checkpoints(how):
    """Control-flow primitives take no part in the registry's special-point audit: their
    rules compose their bodies' rules. So a body's derivatives at its awkward points are
    the same inside a loop, a branch or a checkpoint as outside, at every order and in
    every mode. (Where the derivative diverges, inf outside may be nan inside; at nan
    inputs, not tested here, a loop may give nan where straight code gives 0 at orders 2
    and 3: both are what the rows allow.)"""
    for f, x in _AWKWARD:
        x = np.asarray(x)
        inside = _WRAPPED[how](f)
        for k in (1, 2, 3):
            dirs = [(np.ones_like(x),)] * k
            for modes in itertools.product(("rev", "fwd"), repeat=k):
                want = directional_derivative(f, (x,), dirs, modes)
                got = directional_derivative(inside, (x,), dirs, modes)
                # Equal; or nan where outside it diverges (inf): both allowed there.
                same = (got == want) | (np.isnan(got) & ~np.isfinite(want))
                assert np.all(same), f"{how}, order {k}, {modes}: {got} != {want}"
