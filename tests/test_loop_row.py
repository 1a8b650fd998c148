"""A scan whose LOOP is built runs as rows of the enclosing plan's table
(runtime.loop_row): the plan lowers to one segment (so a call is one call into the
interpreter, the small call's), a scan nested in a scan's body runs from the outer LOOP,
and the results are the other runners' bits: the scan's Python loop, the thin call's
LOOP in a table of its own, the step runner; an unrolled Python loop within rounding.
Trip counts 0, 1, 2 and 5, reversed, both dtypes, value and value_and_grad (the work
around a loop as rows too: consts copied transposed, shared stacks, sums after the loop,
stacks transposed after it). ~4 s with kernels on disk."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime import loop_table
from fastgrad.runtime.control_flow import LoopStep
from test_runtime_loop_table import (  # noqa: F401  (its fixture: sync compiles)
    _flat,
    _step_runner,
    runtime,
)
from test_scan_call import _along, _four_ways, _model, _scans

TOL = {np.float32: 2e-4, np.float64: 1e-11}


def _rnn(reverse: bool, scan: bool, returns: str) -> Callable[..., Any]:
    """An unbatched RNN over `xs` (`w @ h`, `u @ x_t` hoisted before the loop): "loss"
    returns a sum of the stacked states, "stacks" the final state and the stacks
    themselves (arrays the caller sees), "twice" a loss reading the stack twice, "new"
    a loss of the states after each step (the others stack those before it)."""

    def step(h, x, w, u):
        new = fnp.tanh(w @ h + u @ x)
        return new, new if returns == "new" else h

    def loss(w, u, h, xs):
        if scan:
            h, hs = fg.scan(lambda h, x: step(h, x, w, u), h, xs, reverse=reverse)
        else:
            order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
            stacked = []
            for t in order:
                h, y = step(h, xs[t], w, u)
                stacked.append(y)
            stacked = stacked[::-1] if reverse else stacked
            hs = fnp.stack(stacked) if stacked else fnp.zeros((0, *h.shape), h.dtype)
        if returns == "stacks":
            return h, hs * 2.0
        if returns == "twice":
            return fnp.sum(hs * hs) + fnp.sum(fnp.exp(hs))
        return fnp.sum(hs * hs) + fnp.sum(h)

    return loss


def _nested(scan: bool) -> Callable[..., Any]:
    """A batched RNN over chunks, each chunk's steps a scan (bench S5's shape)."""

    def loss(w, h, xs):
        def chunk(h, x):
            if scan:
                h, hs = fg.scan(lambda h, x: (fnp.tanh(h @ w + x), h), h, x)
                return h * 0.9, fnp.sum(hs * hs)
            total = 0.0
            for t in range(x.shape[0]):
                total = total + fnp.sum(h * h)
                h = fnp.tanh(h @ w + x[t])
            return h * 0.9, total

        if scan:
            h, sums = fg.scan(chunk, h, xs)
            return fnp.sum(h * h) + fnp.sum(sums)
        total = 0.0
        for t in range(xs.shape[0]):
            h, s = chunk(h, xs[t])
            total = total + s
        return fnp.sum(h * h) + total

    return loss


def _runners(f: Callable[..., Any], args: tuple[Any, ...]) -> tuple[list[np.ndarray], Any]:
    """f's results from the plan lowered with its LOOPs as rows, checked bit for bit
    against its scans' Python loops, their LOOPs in tables of their own (rows off) and
    the step runner; and the jitted f."""
    steps = _step_runner(f, args)
    config.update("runtime", "vm")
    jf = fg.jit(f)
    for _ in range(4):  # lowered, watched, a LOOP built, then rows of the plan
        jf(*args)
    rows = _flat(jf(*args))
    asked = []  # loop tables off reach the scans' Python loops, rows or not
    with pytest.MonkeyPatch.context() as patch:
        run = LoopStep._run
        patch.setattr(LoopStep, "_run", lambda *a: asked.append(1) or run(*a))
        patch.setattr(loop_table, "ENABLED", False)
        python = _flat(jf(*args))
    assert asked or args[-1].shape[0] == 0
    with pytest.MonkeyPatch.context() as patch:  # a plan lowered anew, LOOPs not as rows
        patch.setattr("fastgrad.runtime.control_flow.HOLDS", 0)
        patch.setattr("fastgrad.runtime.plan_table.loop_rows", lambda segment, step: None)
        alone = fg.jit(f)
        for _ in range(4):
            alone(*args)
        own_tables = _flat(alone(*args))
    for a, *others in zip(rows, python, own_tables, steps, strict=True):
        for b in others:
            assert a.dtype == b.dtype and a.shape == b.shape
            assert np.array_equal(a, b, equal_nan=True)
    return rows, jf


def _one_segment(jf: Any, args: tuple[Any, ...]) -> bool:
    arena = jf.lower(*args).executable.arena
    return arena.bare and len(arena.calls) == 1


def _args(steps: int, dtype: Any, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (
        (rng.standard_normal((4, 4)) * 0.4).astype(dtype),
        (rng.standard_normal((4, 3)) * 0.4).astype(dtype),
        rng.standard_normal(4).astype(dtype),
        rng.standard_normal((steps, 3)).astype(dtype),
    )


@pytest.mark.parametrize(
    "steps, reverse, dtype, returns",
    [
        (1, False, np.float32, "loss"),
        (5, False, np.float64, "loss"),
        (5, True, np.float32, "loss"),
        (2, False, np.float64, "stacks"),
        (5, True, np.float32, "twice"),
    ],
)
def test_a_scan_runs_from_the_enclosing_table(steps, reverse, dtype, returns):
    args = _args(steps, dtype)
    got, jf = _runners(_rnn(reverse, True, returns), args)
    assert _one_segment(jf, args)
    want = _flat(fg.jit(_rnn(reverse, False, returns), fuse=False)(*args))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


def test_no_steps_and_returned_stacks_stay_the_callers():
    """A scan of no steps never builds a LOOP: its plan lowers all the same (without
    it). Stacks the caller receives are fresh at each call: a later call leaves them."""
    args = _args(0, np.float64)
    got, jf = _runners(_rnn(False, True, "stacks"), args)
    assert jf.lower(*args).executable.arena.settled
    np.testing.assert_array_equal(got[0], args[2])
    args = _args(3, np.float64)
    jf = fg.jit(_rnn(False, True, "stacks"))
    for _ in range(5):
        first = jf(*args)
    assert _one_segment(jf, args)
    kept = [np.array(x, copy=True) for x in first]
    jf(args[0], args[1], args[2] + 1.0, args[3])
    for a, b in zip(first, kept, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_value_and_grad_runs_both_scans_from_the_table(dtype):
    """The forward scan of the VJP and the backward one (its const `w` copied transposed
    before the loop, its weight gradients summed after it: COPY, NOBLAS or GEMM, ADD
    rows) are rows of the plan: one segment."""
    args = _args(5, dtype, seed=3)
    f = fg.value_and_grad(_rnn(False, True, "new"), argnums=(0, 1))
    got, jf = _runners(f, args)
    assert _one_segment(jf, args)
    (_, backward) = _scans(jf.lower(*args).executable.plan)
    assert backward.hoisted.sums and backward.hoisted.transposed
    want = _flat(fg.value_and_grad(_rnn(False, False, "new"), argnums=(0, 1))(*args))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


def _batched(scan: bool, nested: bool = False, reverse: bool = False) -> Callable[..., Any]:
    """bench S1's RNN (`tanh(x_t @ u + h @ w + b)`, the mean square of the states after
    each step), small; with `nested`, S5's: a scan over chunks of 2 steps, each a scan."""

    def cell(h, x, w, u, b):
        return fnp.tanh(x @ u + h @ w + b)

    def loss(w, u, b, h, xs):
        def step(h, x):
            new = cell(h, x, w, u, b)
            return new, new

        def chunk(h, x):
            h, hs = fg.scan(step, h, x)
            return h, fnp.sum(hs * hs)

        if nested:
            _, sums = fg.scan(chunk, h, xs.reshape(-1, 2, *xs.shape[1:]))
            return fnp.sum(sums)
        if scan:
            _, hs = fg.scan(step, h, xs, reverse=reverse)
            return fnp.sum(hs * hs)
        total = 0.0
        for t in range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0]):
            h, _ = step(h, xs[t])
            total = total + fnp.sum(h * h)
        return total

    return loss


@pytest.mark.parametrize(
    "steps, dtype, nested, reverse",
    [(1, np.float32, False, False), (6, np.float64, False, True), (4, np.float32, True, False)],
)
def test_batched_value_and_grad_is_one_segment(steps, dtype, nested, reverse):
    """bench S1's (and S5's) value_and_grad: the forward scan stacks the states before and
    after each step in one array (its first row the initial state: a COPY row), the
    backward one sums the weight gradients (GEMM, ADD) and the bias gradient (SUM over
    the steps and the batch, ADD) after its loop: all rows of one segment (with S5's
    outer scans, rows of their bodies: their LOOPs run from the plan's)."""
    rng = np.random.default_rng(5)
    args = (
        (rng.standard_normal((4, 4)) * 0.4).astype(dtype),
        (rng.standard_normal((3, 4)) * 0.4).astype(dtype),
        rng.standard_normal(4).astype(dtype),
        rng.standard_normal((2, 4)).astype(dtype),
        rng.standard_normal((steps, 2, 3)).astype(dtype),
    )
    f = fg.value_and_grad(_batched(True, nested, reverse), argnums=(0, 1, 2))
    got, jf = _runners(f, args)
    assert _one_segment(jf, args)
    scans = _scans(jf.lower(*args).executable.plan)
    assert all(s.looped.program is not None for s in scans)
    assert any(s.thin.pairs for s in scans)
    parts = [
        part.kind for s in scans if s.hoisted for total in s.hoisted.sums for part in total.parts
    ]
    assert "sum" in parts and "matmul" in parts
    want = _flat(fg.value_and_grad(_batched(False, False, reverse), argnums=(0, 1, 2))(*args))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


def test_views_of_a_final_carry_are_rows_too():
    """A final carry the plan reads through a view (the VJP of `h @ wo` reads `h.T`: the
    example rnn_digits' train step): the view is of the segment's fresh output, not of
    the array a host run left in its slot (which kept the view a host step)."""
    rng = np.random.default_rng(6)
    w, u = rng.standard_normal((4, 4)) * 0.4, rng.standard_normal((3, 4)) * 0.4
    b, wo, h = rng.standard_normal(4), rng.standard_normal((4, 2)), np.zeros((5, 4))
    xs = rng.standard_normal((3, 5, 3))

    def loss(w, u, b, wo, h, xs):
        h, _ = fg.scan(lambda h, x: (fnp.tanh(x @ u + h @ w + b), None), h, xs)
        return fnp.sum((h @ wo) ** 2)

    args = (w, u, b, wo, h, xs)
    got, jf = _runners(fg.value_and_grad(loss, argnums=(0, 1, 2, 3)), args)
    assert _one_segment(jf, args)
    want = fg.value_and_grad(loss, argnums=(0, 1, 2, 3))(*args)
    for a, b in zip(got, _flat(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_scan_nested_in_a_scan_runs_from_the_outer_loop(dtype):
    """The inner scan is rows of the outer body's table, so that body is one segment and
    the outer scan a LOOP: the whole plan one call into the interpreter."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((3, 3)) * 0.4).astype(dtype)
    h0 = rng.standard_normal((2, 3)).astype(dtype)
    xs = rng.standard_normal((3, 4, 2, 3)).astype(dtype)
    got, jf = _runners(_nested(True), (w, h0, xs))
    assert _one_segment(jf, (w, h0, xs))
    outer, inner = _scans(jf.lower(w, h0, xs).executable.plan)
    assert outer.looped.program is not None and inner.in_body
    want = _flat(fg.jit(_nested(False), fuse=False)(w, h0, xs))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("kind", ["batched", "stacked"])
def test_a_gradient_of_a_gradient_runs_every_scan_as_a_loop(kind):
    """Its VJP stacks a stacked input transposed (`x_t.T`), each iteration's output a view
    of another layout, which kept that scan a Python loop: stacked untransposed, then
    transposed after the loop (loop_hoisting's `relaid`), it is a LOOP like the others,
    and every scan, the transposed stacks (COPY rows) too, rows of one segment."""
    rng = np.random.default_rng(4)
    dtype = np.float64
    args = (
        rng.standard_normal((4, 4)) * 0.4,
        rng.standard_normal((3, 4)) * 0.4,
        rng.standard_normal((2, 4)),
        rng.standard_normal((5, 2, 3)),
    )
    v = rng.standard_normal((4, 4))
    f = fg.value_and_grad(_along(_model(kind, False, True), v), argnums=(0, 1))
    _, scans = _four_ways(f, args)  # every scan a LOOP
    got, jf = _runners(f, args)
    assert _one_segment(jf, args)
    assert len(scans) >= 5 and any(s.hoisted is not None and s.hoisted.relaid for s in scans)
    unrolled = fg.value_and_grad(_along(_model(kind, False, False), v), argnums=(0, 1))
    want = _flat(fg.jit(unrolled, fuse=False)(*args))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


def test_two_threads_share_a_plan_whose_loops_are_rows():
    """A LOOP's tables (and those of the loops nested in it) are run by one thread at a
    time: a call meeting another one's segment or thin call runs its steps one by one
    (or on fresh arenas), with the same results, flat and nested."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((3, 3)) * 0.4
    cases = []
    for f, shape in ((_nested(True), (20, 10, 2, 3)), (_rnn(False, True, "stacks"), None)):
        if shape is None:
            calls = [_args(300, np.float64, seed) for seed in (1, 2)]
        else:
            h0 = rng.standard_normal((2, 3))
            calls = [(w, h0 + k, rng.standard_normal(shape)) for k in range(2)]
        jf = fg.jit(f)
        for _ in range(6):
            jf(*calls[0])
        assert _one_segment(jf, calls[0])
        cases.append((jf, calls, [_flat(jf(*a)) for a in calls]))
    failures = []

    def hammer(k: int) -> None:
        for _ in range(60):
            for jf, calls, want in cases:
                got = _flat(jf(*calls[k]))
                if not all(np.array_equal(a, b) for a, b in zip(got, want[k], strict=True)):
                    failures.append(k)

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_the_plan_waits_for_a_loop_whose_kernels_compile():
    """Runs while the body's kernels (or the interpreter) compile do not count against
    the holds: in background mode a cold nested scan used them all up before its LOOP
    could be built, and its plan lowered without the rows for good."""
    args = _args(5, np.float64, seed=9)
    jf = fg.jit(_rnn(False, True, "loss"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop_table.ScanLoop, "waiting", lambda self: True)
        for _ in range(30):
            jf(*args)
        (step,) = _scans(jf.lower(*args).executable.plan)
        assert step.holds == 20
    for _ in range(6):
        jf(*args)
    assert _one_segment(jf, args)


@pytest.mark.parametrize("kind", ["steps", "vm"])
def test_a_callback_calling_the_same_function_from_its_loop(kind):
    """A scan body's callback that calls the same jitted function on the same thread: the
    inner call finds the loop busy and runs with fresh outputs. With the loops' shared
    lock re-entrant (nested loops' rows need that), the inner call had run on the arenas
    the outer call was in the middle of: its stacked outputs off by up to 3.5."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((3, 3)) * 0.4
    h0, xs = rng.standard_normal((2, 3)), rng.standard_normal((6, 2, 3))
    inner: list[list[np.ndarray]] = []
    calling = [False]

    def hook(h: np.ndarray) -> np.ndarray:
        if calling[0]:
            calling[0] = False
            inner.append(_flat(jf(w, h0, xs)))
        return np.asarray(h)

    def f(w: Any, h: Any, xs: Any) -> Any:
        def body(h: Any, x: Any) -> tuple[Any, Any]:
            h = fg.pure_callback(hook, fg.ShapeDtypeStruct(h.shape, h.dtype), fnp.tanh(h @ w + x))
            return h, h * 2.0

        return fg.scan(body, h, xs)

    want, h = [], h0
    for x in xs:
        h = np.tanh(h @ w + x)
        want.append(h * 2.0)
    want = [h, np.stack(want)]
    config.update("runtime", kind)
    jf = fg.jit(f)
    for _ in range(4):  # its arenas built and used
        jf(w, h0, xs)
    calling[0] = True
    got = _flat(jf(w, h0, xs))
    assert len(inner) == 1
    for result in (got, inner[0]):
        for a, b in zip(result, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
