"""Loop bodies that allocate nothing per iteration: two arenas used in turn, the final
carry copied out. Oracles: the unrolled Python loop run by the reference interpreter
(`fg.jit(f, fuse=False)`), and the buffers' addresses."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.control_flow import LoopStep
from fastgrad.runtime.executable import compile_graph
from fastgrad.transforms.scan import ScanCall

TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _cell(w, h, x):
    return fnp.tanh(h @ w + x)


def scanned(w, h, xs):
    def step(h, x):
        h = _cell(w, h, x)
        return h, fnp.sum(h * h, axis=1)

    h, ys = fg.scan(step, h, xs)
    return h, ys


def unrolled(w, h, xs):
    ys = []
    for t in range(xs.shape[0]):
        h = _cell(w, h, xs[t])
        ys.append(fnp.sum(h * h, axis=1))
    return h, fnp.stack(ys) if ys else fnp.zeros((0, h.shape[0]), h.dtype)


def _inputs(rng, steps, batch, hidden, dtype):
    return (
        (rng.standard_normal((hidden, hidden)) * 0.5).astype(dtype),
        rng.standard_normal((batch, hidden)).astype(dtype),
        rng.standard_normal((steps, batch, hidden)).astype(dtype),
    )


def _body(seed, steps, batch, hidden):
    """Inputs of `scanned`, and the compiled body of its loop (after one call)."""
    w, h, xs = _inputs(np.random.default_rng(seed), steps, batch, hidden, np.float64)
    f = fg.jit(scanned)
    f(w, h, xs)
    plan = f.lower(w, h, xs).executable.plan
    step = next(s for s in plan if isinstance(s, LoopStep))
    assert isinstance(step.call, ScanCall)
    return (w, h, xs), step.bodies[0]


def test_iterations_alternate_between_two_sets_of_buffers():
    (w, h, xs), body = _body(0, 3, 2, 4)
    run = body.iterations()
    first = run([w, h, xs[0]])
    second = run([w, first[0], xs[1]])
    third = run([w, second[0], xs[2]])
    assert not np.shares_memory(first[0], second[0])
    assert third[0].ctypes.data == first[0].ctypes.data  # no new memory
    np.testing.assert_allclose(third[0], np.tanh(second[0] @ w + xs[2]), rtol=1e-12)


@settings(max_examples=10, deadline=None)
@given(
    steps=st.integers(0, 4),
    batch=st.integers(1, 3),
    hidden=st.integers(1, 4),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_scan_matches_the_unrolled_loop_and_returns_fresh_arrays(steps, batch, hidden, dtype, seed):
    rng = np.random.default_rng(seed)
    args = _inputs(rng, steps, batch, hidden, dtype)
    f = fg.jit(scanned)
    h, ys = f(*args)
    kept = (h.copy(), ys.copy())
    want_h, want_ys = fg.jit(unrolled, fuse=False)(*args)
    np.testing.assert_allclose(h, want_h, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)
    np.testing.assert_allclose(ys, want_ys, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)
    f(*(a * 0.5 for a in args))  # a second call leaves the first call's results alone
    np.testing.assert_array_equal(h, kept[0])
    np.testing.assert_array_equal(ys, kept[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradient_and_while_loop_through_alternating_bodies(dtype):
    rng = np.random.default_rng(3)
    args = _inputs(rng, 5, 3, 4, dtype)

    def loss(w, h, xs):
        h, ys = scanned(w, h, xs)
        return fnp.sum(h) + fnp.sum(ys)

    def unrolled_loss(w, h, xs):
        h, ys = unrolled(w, h, xs)
        return fnp.sum(h) + fnp.sum(ys)

    got = fg.jit(fg.grad(loss, argnums=(0, 1)))(*args)
    want = fg.jit(fg.grad(unrolled_loss, argnums=(0, 1)), fuse=False)(*args)
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=TOL[dtype] * 20, atol=TOL[dtype] * 20)

    def halve(x):
        return fg.while_loop(lambda c: fnp.sum(c * c) > 1.0, lambda c: c * 0.5, x)

    x = args[1]
    out = fg.jit(halve)(x)
    ref = x.copy()
    while np.sum(ref * ref) > 1.0:
        ref = ref * dtype(0.5)
    np.testing.assert_allclose(out, ref, rtol=TOL[dtype])


def test_loops_in_threads_at_once():
    """Two threads in the same loop: one iterates in the body's two arenas, the other with
    fresh outputs; both get the right answer."""
    rng = np.random.default_rng(5)
    args = _inputs(rng, 30, 4, 8, np.float64)
    f = fg.jit(scanned)
    want = [np.array(x) for x in f(*args)]
    results: list = [None] * 4
    errors = []

    def work(k):
        try:
            for _ in range(5):
                results[k] = f(*args)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for got in results:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12)


def test_compile_graph_body_runs_with_fresh_outputs_too():
    (w, h, xs), body = _body(6, 2, 2, 3)
    again = compile_graph(body.graph)
    a, b = again.run([w, h, xs[0]]), again.run([w, h, xs[0]])
    assert not np.shares_memory(a[0], b[0])
    with pytest.raises(ValueError, match="looped"):
        again.iterations()
    looped = compile_graph(body.graph, looped=True)
    c, d = looped.run([w, h, xs[0]]), looped.run([w, h, xs[0]])  # `run` stays fresh
    assert not np.shares_memory(c[0], d[0])
    np.testing.assert_array_equal(c[0], a[0])


def test_stacked_outputs_are_reused_only_once_nothing_holds_them():
    from fastgrad.core.ir import Aval
    from fastgrad.runtime.control_flow import StackPool

    pool, aval = StackPool(), Aval((3, 2), np.dtype(np.float64))
    first = pool.empty(0, aval)
    assert pool.empty(0, aval) is not first  # `first` is held
    view = first[1]
    address = first.ctypes.data
    del first
    second = pool.empty(0, aval)
    assert second.ctypes.data != address  # a view of the first is held
    del view
    address = second.ctypes.data
    del second
    assert pool.empty(0, aval).ctypes.data == address  # nothing holds it: handed out again
    assert pool.empty(1, aval).ctypes.data != address
    assert pool.empty(0, Aval((2, 2), np.dtype(np.float64))).shape == (2, 2)


def _hidden_states(w, h, xs, reverse=False):
    def step(h, x):
        h = _cell(w, h, x)
        return h, h

    return fg.scan(step, h, xs, reverse=reverse)


def _unrolled_states(w, h, xs, reverse=False):
    states = [None] * xs.shape[0]
    for t in reversed(range(xs.shape[0])) if reverse else range(xs.shape[0]):
        h = states[t] = _cell(w, h, xs[t])
    return h, fnp.stack(states) if states else fnp.zeros((0, *h.shape), h.dtype)


def _states_loss(states):
    def loss(w, h, xs, reverse):
        h, hs = states(w, h, xs, reverse)
        weights = fnp.cos(fnp.arange(hs.size).reshape(hs.shape) * 0.7)
        return fnp.sum(hs * weights) + fnp.sum(h * h)

    return loss


def _forward_scan(f):
    (traced,) = f._cache.values()
    return next(s for s in traced.executable.plan if isinstance(s, LoopStep))


@settings(max_examples=8, deadline=None)
@given(steps=st.integers(0, 4), reverse=st.booleans(), seed=st.integers(0, 2**16))
def test_the_carry_stacked_for_the_gradient_is_the_stacked_output_shifted(steps, reverse, seed):
    """The forward scan of a VJP stacks h_{t-1} for the backward pass beside the h_t the
    loop stacks: one array of T + 1 rows holds both (scan_loop). Wrong rows there give
    wrong weight gradients, which the unrolled loop checks (both directions)."""
    args = _inputs(np.random.default_rng(seed), steps, 2, 3, np.float64)
    f = fg.jit(fg.grad(_states_loss(_hidden_states), argnums=(0, 1, 2)), static_argnums=3)
    want = fg.jit(
        fg.grad(_states_loss(_unrolled_states), argnums=(0, 1, 2)), fuse=False, static_argnums=3
    )
    for _ in range(2):  # the second call runs with the stacks kept from the first
        for g, r in zip(f(*args, reverse), want(*args, reverse), strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    stacks = _forward_scan(f).stacks.kept
    assert [a.shape[0] for k, a in stacks.items() if k < 0] == [steps + 1]  # one shared stack


def test_stacks_a_caller_sees_never_share_memory():
    """A scan returning both the carry it reads and the one it makes: the caller gets two
    arrays of their own, not views of one."""

    def both(w, h, xs):
        def step(h, x):
            new = _cell(w, h, x)
            return new, (new, h)

        return fg.scan(step, h, xs)[1]

    args = _inputs(np.random.default_rng(8), 4, 2, 3, np.float64)
    new, old = fg.jit(both)(*args)
    assert not np.shares_memory(new, old)
    np.testing.assert_array_equal(old[1:], new[:-1])
    np.testing.assert_array_equal(old[0], args[1])


def test_a_gradient_call_hands_its_forward_stacks_out_again():
    """Nothing holds a forward scan's stacked outputs past a call (a kernel that read
    them once kept them in its bound arguments): the next call writes the same memory."""
    args = _inputs(np.random.default_rng(9), 6, 2, 3, np.float64)
    f = fg.jit(fg.grad(_states_loss(_hidden_states), argnums=(0, 1, 2)), static_argnums=3)
    f(*args, False)
    stacks = _forward_scan(f).stacks.kept
    before = {k: a.ctypes.data for k, a in stacks.items()}
    f(*args, False)
    assert {k: a.ctypes.data for k, a in stacks.items()} == before
