"""Scan carries that add up batch sums (a weight's gradient in a backward scan) run as
one product or sum after the loop, products of stacked inputs by consts before it.
Oracles: the unrolled Python loop run by the reference interpreter (`fg.jit(f,
fuse=False)`), orders 1 and 2 and forward mode, and what the compiled body still does."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime import loop_hoisting
from fastgrad.runtime.control_flow import LoopStep

TOL = {np.float32: 1e-4, np.float64: 1e-11}


def _sums(w, dw, db, h, xs, reverse=False):
    """A scan whose carries `dw` and `db` add up `x_t.T @ h_t` and the rows of h_t."""

    def step(carry, x):
        dw, db, h = carry
        h = fnp.tanh(x @ w + h)
        return (dw + x.T @ h, db + fnp.sum(h, axis=0), h), fnp.sum(h * h, axis=1)

    return fg.scan(step, (dw, db, h), xs, reverse=reverse)


def _unrolled(w, dw, db, h, xs, reverse=False):
    ys = [None] * xs.shape[0]
    steps = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    for t in steps:
        h = fnp.tanh(xs[t] @ w + h)
        dw, db = dw + xs[t].T @ h, db + fnp.sum(h, axis=0)
        ys[t] = fnp.sum(h * h, axis=1)
    return (dw, db, h), fnp.stack(ys) if ys else fnp.zeros((0, h.shape[0]), h.dtype)


def _inputs(rng, steps, batch, hidden, dtype):
    return tuple(
        (rng.standard_normal(shape) * 0.5).astype(dtype)
        for shape in [
            (hidden, hidden),
            (hidden, hidden),
            (hidden,),
            (batch, hidden),
            (steps, batch, hidden),
        ]
    )


def _loop_steps(f, *args):
    f(*args)
    plan = f.lower(*args).executable.plan
    return [s for s in plan if isinstance(s, LoopStep)]


def _close(got, want, dtype):
    for g, w in zip(fg.pytree.flatten(got)[0], fg.pytree.flatten(want)[0], strict=True):
        np.testing.assert_allclose(g, w, rtol=TOL[dtype], atol=TOL[dtype])


def test_the_summed_carries_leave_the_loop():
    args = _inputs(np.random.default_rng(0), 4, 3, 5, np.float64)
    (step,) = _loop_steps(fg.jit(_sums), *args)
    body = step.bodies[0].graph
    # dw and db leave the carries; x_t @ w, computed before the loop, replaces x_t
    assert len(body.inputs) == len(step.call.body.inputs) - 2
    assert not any(n.op.name == "matmul" for n in body.nodes)


@settings(max_examples=10, deadline=None)
@given(
    steps=st.integers(0, 4),
    batch=st.integers(1, 3),
    hidden=st.integers(1, 4),
    dtype=st.sampled_from([np.float32, np.float64]),
    reverse=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_summed_carries_match_the_unrolled_loop(steps, batch, hidden, dtype, reverse, seed):
    args = _inputs(np.random.default_rng(seed), steps, batch, hidden, dtype)
    got = fg.jit(_sums, static_argnums=5)(*args, reverse)
    want = fg.jit(_unrolled, static_argnums=5, fuse=False)(*args, reverse)
    _close(got, want, dtype)
    assert all(g.dtype == dtype for g in fg.pytree.flatten(got)[0])


def _rnn_loss(w, wx, b, h, xs):
    def step(h, x):
        h = fnp.tanh(x @ wx + h @ w + b)
        return h, h

    h, hs = fg.scan(step, h, xs)
    return fnp.sum(hs * hs) + fnp.sum(h)


def _rnn_unrolled(w, wx, b, h, xs):
    total = 0.0
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] @ wx + h @ w + b)
        total = total + fnp.sum(h * h)
    return total + fnp.sum(h)


@settings(max_examples=6, deadline=None)
@given(
    steps=st.integers(0, 4),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_weight_gradients_of_orders_one_and_two_match_the_unrolled_loop(steps, dtype, seed):
    w, wx, b, h, xs = _inputs(np.random.default_rng(seed), steps, 3, 4, dtype)
    grad = fg.grad(_rnn_loss, argnums=(0, 1, 2))
    _close(
        fg.jit(grad)(w, wx, b, h, xs),
        fg.jit(fg.grad(_rnn_unrolled, argnums=(0, 1, 2)), fuse=False)(w, wx, b, h, xs),
        dtype,
    )

    def second(loss):  # a gradient of a gradient: the backward scan differentiated again
        return fg.grad(
            lambda w, wx: fnp.sum(fg.grad(loss, argnums=(0, 1))(w, wx, b, h, xs)[0] ** 2),
            argnums=(0, 1),
        )

    _close(
        fg.jit(second(_rnn_loss))(w, wx), fg.jit(second(_rnn_unrolled), fuse=False)(w, wx), dtype
    )


def test_the_backward_scan_of_a_gradient_sums_its_weights_after_the_loop():
    w, wx, b, h, xs = _inputs(np.random.default_rng(1), 5, 3, 4, np.float64)
    f = fg.jit(fg.grad(_rnn_loss, argnums=(0, 1, 2)))
    backward = [s for s in _loop_steps(f, w, wx, b, h, xs) if s.call.reverse]
    (step,) = backward
    body = step.bodies[0].graph
    # the three weights' accumulators leave, and the stacked inputs only they read; w.T
    # comes in, copied contiguous before the loop (BLAS is ~2x slower on the view)
    assert len(body.inputs) == len(step.call.body.inputs) - 5 + 1
    assert sum(n.op.name == "matmul" for n in body.nodes) == 1  # g_t @ w.T
    assert not any(n.op.name == "transpose" for n in body.nodes)


def test_a_long_loop_keeps_its_accumulators_in_the_loop(monkeypatch):
    monkeypatch.setattr(loop_hoisting, "STACK_BUDGET", 0)
    args = _inputs(np.random.default_rng(2), 3, 2, 3, np.float64)
    (step,) = _loop_steps(fg.jit(_sums), *args)
    assert len(step.bodies[0].graph.inputs) == len(step.call.body.inputs)
    _close(fg.jit(_sums)(*args), fg.jit(_unrolled, fuse=False)(*args), np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_carry_read_elsewhere_stays_in_the_loop(dtype):
    args = _inputs(np.random.default_rng(3), 3, 2, 3, dtype)

    def reads_dw(w, dw, db, h, xs):
        def step(carry, x):
            dw, h = carry
            h = fnp.tanh(x @ w + h @ dw)  # the accumulator is read: not a plain sum
            return (dw + x.T @ h, h), None

        return fg.scan(step, (dw, h), xs)[0]

    def unrolled(w, dw, db, h, xs):
        for t in range(xs.shape[0]):
            h = fnp.tanh(xs[t] @ w + h @ dw)
            dw = dw + xs[t].T @ h
        return dw, h

    (step,) = _loop_steps(fg.jit(reads_dw), *args)
    assert len(step.bodies[0].graph.outputs) == len(step.call.body.outputs)  # dw, h; ys
    _close(fg.jit(reads_dw)(*args), fg.jit(unrolled, fuse=False)(*args), dtype)


@pytest.mark.parametrize("kind", ["gram", "bias", "outer"])
def test_a_summed_carry_that_is_also_a_per_step_output_stays_in_the_loop(kind):
    """The running sum returned as ys reads the carry every step: it cannot be summed after
    the loop (it failed at the first call with "uses c0 before it is defined")."""
    xs = np.random.default_rng(6).standard_normal((40, 4, 3))
    terms = {
        "gram": lambda x: x.T @ x,
        "bias": lambda x: fnp.sum(x, axis=0),
        "outer": lambda x: x[:, :1] @ x[:, :1].T,
    }
    term = terms[kind]
    acc0 = np.zeros(np.shape(term(xs[0])))

    def running(acc0, xs):
        def step(acc, x):
            new = acc + term(x)
            return new, new * 2.0

        return fg.scan(step, acc0, xs)

    acc, ys = acc0, []
    for x in xs:
        acc = acc + np.asarray(term(x))
        ys.append(acc * 2.0)
    _close(fg.jit(running)(acc0, xs), (acc, np.stack(ys)), np.float64)


def test_forward_mode_through_a_hoisted_scan_matches_the_unrolled_loop():
    w, wx, b, h, xs = _inputs(np.random.default_rng(4), 4, 3, 4, np.float64)
    tangents = _inputs(np.random.default_rng(5), 4, 3, 4, np.float64)

    def jvp(loss):
        return lambda *t: fg.jvp(loss, (w, wx, b, h, xs), t)

    _close(
        fg.jit(jvp(_rnn_loss))(*tangents),
        fg.jit(jvp(_rnn_unrolled), fuse=False)(*tangents),
        np.float64,
    )


def _deep_loss(w, wx, b, h, xs, unrolled=False):
    def cell(h, x):  # w used twice: its gradient adds two products per step
        a = fnp.tanh(x @ wx + h @ w + b)
        return fnp.tanh(a @ w + h)

    if unrolled:
        for t in range(xs.shape[0]):
            h = cell(h, xs[t])
    else:
        h, _ = fg.scan(lambda h, x: (cell(h, x), None), h, xs)
    return fnp.sum(h * h)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_weight_used_twice_per_step_sums_both_products_after_the_loop(dtype):
    w, wx, b, h, xs = _inputs(np.random.default_rng(6), 5, 3, 4, dtype)
    grad = fg.grad(_deep_loss, argnums=(0, 1, 2))
    (step,) = [s for s in _loop_steps(fg.jit(grad), w, wx, b, h, xs) if s.call.reverse]
    assert sum(n.op.name == "matmul" for n in step.bodies[0].graph.nodes) == 2  # the cotangents
    want = fg.jit(fg.grad(lambda *a: _deep_loss(*a, unrolled=True), argnums=(0, 1, 2)), fuse=False)
    _close(fg.jit(grad)(w, wx, b, h, xs), want(w, wx, b, h, xs), dtype)
