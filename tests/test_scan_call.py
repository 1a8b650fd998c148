"""A scan whose LOOP is built runs through its thin call (runtime.scan_call.ThinScan)
rather than the general path's layers: the same bits as that path (the same LOOP reached
through scan_loop), as the scan's Python loop and as the step runner, and the unrolled
loop on the reference interpreter within rounding; for hypothesis-drawn bodies (products
of stacked inputs hoisted before the loop, weight gradients summed after it, stacked
carries, nested scans), trip counts 0, 1, 2 and 5, forward or reversed, both dtypes,
value_and_grad and the gradient of a gradient. Arguments it was not built for take the
general path. ~4 s with kernels on disk."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime import loop_table, scan_call
from fastgrad.runtime.control_flow import LoopStep
from test_runtime_loop_table import (  # noqa: F401  (its fixture: sync compiles)
    _flat,
    _nested_data,
    _python_loop,
    _step_runner,
    runtime,
)

TOL = {np.float32: 2e-4, np.float64: 1e-11}


def _scans(plan: list[Any]) -> list[LoopStep]:
    """The scans of `plan` and of the loop bodies in it."""
    found = []
    for step in plan:
        if isinstance(step, LoopStep):
            found.append(step)
            for body in step.bodies:
                found += _scans(body.plan)
    return found


def _four_ways(f: Callable[..., Any], args: tuple[Any, ...], every: bool = True) -> Any:
    """f's results by the thin call, by the general path (its LOOP), by the Python loop
    and by the step runner, checked equal bit for bit; returns the first, and the scans
    that ran (those of a step or more). With `every`,
    every scan of a step or more must run as a LOOP (else those that do)."""
    steps = _step_runner(f, args)
    config.update("runtime", "vm")
    jf = fg.jit(f)
    for _ in range(3):  # lowered, watched, then the LOOP built
        jf(*args)
    thin = _flat(jf(*args))
    scans = [s for s in _scans(jf.lower(*args).executable.plan) if s.call.length > 0]
    for s in scans:
        assert s.looped is not None
        assert s.looped.program is not None or not every
        # the call above took the thin path
        assert (s.thin is not None) == (s.looped.program is not None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scan_call.ThinScan, "__call__", lambda self, arrays: None)
        general = _flat(jf(*args))
    python = _python_loop(jf, args)
    for a, *others in zip(thin, general, python, steps, strict=True):
        for b in others:
            assert a.dtype == b.dtype and a.shape == b.shape
            assert np.array_equal(a, b, equal_nan=True)
    return thin, scans


def _model(kind: str, reverse: bool, scan: bool) -> Callable[..., Any]:
    """A loss over `xs` whose loop is a scan (or, without `scan`, unrolled in Python):
    "matvec" an unbatched RNN (`w @ h`, `u @ x_t` hoisted), "batched" a batched one
    (`x_t @ u` hoisted; its weight and bias gradients summed after the loop), "stacked"
    one stacking its hidden states (the VJP's shifted pair)."""

    def cell(h, x, w, u):
        if kind == "matvec":
            return fnp.tanh(w @ h + u @ x)
        return fnp.tanh(x @ u + h @ w + 0.1)

    def loss(w, u, h, xs):
        order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
        if scan:
            h, hs = fg.scan(lambda h, x: (cell(h, x, w, u), h), h, xs, reverse=reverse)
        else:
            stacked = []
            for t in order:
                stacked.append(h)
                h = cell(h, xs[t], w, u)
            stacked = stacked[::-1] if reverse else stacked
            hs = fnp.stack(stacked) if stacked else fnp.zeros((0, *h.shape), h.dtype)
        total = fnp.sum(h * h)
        return total + fnp.sum(hs * hs) * 0.5 if kind == "stacked" else total

    return loss


def _along(f: Callable[..., Any], v: np.ndarray) -> Callable[..., Any]:
    """The gradient of `f` (in its first argument) along `v`."""
    grad = fg.grad(f)
    return lambda *args: fnp.sum(grad(*args) * v)


@settings(max_examples=8, deadline=None)
@given(
    kind=st.sampled_from(["matvec", "batched", "stacked"]),
    steps=st.sampled_from([0, 1, 2, 5]),
    reverse=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    order=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_the_thin_call_gives_the_general_paths_bits(kind, steps, reverse, dtype, order, seed):
    rng = np.random.default_rng(seed)
    hidden, inputs = 4, 3
    w = (rng.standard_normal((hidden, hidden)) * 0.4).astype(dtype)
    u = rng.standard_normal((inputs, hidden) if kind != "matvec" else (hidden, inputs)) * 0.4
    u = u.astype(dtype)
    h0 = rng.standard_normal(hidden if kind == "matvec" else (2, hidden)).astype(dtype)
    xs = rng.standard_normal((steps, inputs) if kind == "matvec" else (steps, 2, inputs))
    args = (w, u, h0, xs.astype(dtype))
    f, unrolled = _model(kind, reverse, True), _model(kind, reverse, False)
    if order == 2:  # the gradient of a gradient, along v
        v = rng.standard_normal((hidden, hidden)).astype(dtype)
        f, unrolled = _along(f, v), _along(unrolled, v)
    got, _ = _four_ways(fg.value_and_grad(f, argnums=(0, 1)), args, order == 1)
    want = _flat(fg.jit(fg.value_and_grad(unrolled, argnums=(0, 1)), fuse=False)(*args))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


def test_nested_scans_take_the_thin_call_inside_the_outer_loop():
    """The outer loop stays Python's (its body holds a scan); the inner scans, of the
    forward and of the backward outer scan, take their thin calls."""
    w, h0, xs = _nested_data(seed=2, hidden=3, inner=4)

    def loss(w, h, xs):
        def chunk(h, x):
            h, hs = fg.scan(lambda h, x: (fnp.tanh(h @ w + x), h), h, x)
            return h * 0.9, fnp.sum(hs * hs)

        h, sums = fg.scan(chunk, h, xs)
        return fnp.sum(h * h) + fnp.sum(sums)

    jf = fg.value_and_grad(loss)
    steps = _step_runner(jf, (w, h0, xs))
    config.update("runtime", "vm")
    jitted = fg.jit(jf)
    for _ in range(4):
        got = _flat(jitted(w, h0, xs))
    inner = [s for s in _scans(jitted.lower(w, h0, xs).executable.plan) if s.thin is not None]
    assert len(inner) >= 2
    python = _python_loop(jitted, (w, h0, xs))
    for a, b, c in zip(got, steps, python, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def test_arguments_of_another_layout_take_the_general_path():
    """Built for C-contiguous weights: a transposed copy's view, then contiguous weights
    again, both give the step runner's answer."""
    rng = np.random.default_rng(5)
    f = _model("batched", False, True)
    w = rng.standard_normal((4, 4)) * 0.4
    u = rng.standard_normal((3, 4)) * 0.4
    h0 = rng.standard_normal((2, 4))
    xs = rng.standard_normal((5, 2, 3))
    jf = fg.jit(fg.value_and_grad(f, argnums=(0, 1)))
    for _ in range(4):
        jf(w, u, h0, xs)
    config.update("runtime", "steps")
    want = _flat(fg.jit(fg.value_and_grad(f, argnums=(0, 1)))(w, u, h0, xs))
    config.update("runtime", "vm")
    w_view = np.asfortranarray(w)  # the same values, another layout
    for weights in (w_view, w):
        got = _flat(jf(weights, u, h0, xs))
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stacks_written_in_place_leave_the_callers_arrays_alone(dtype):
    """The LOOP points the body's buffers at rows of the stacks (no copies) and puts them
    back after the loop: a stacked output the caller kept is not written by later calls,
    whichever path runs them (LOOP, Python loop, step by step)."""
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((3, 3)) * 0.4).astype(dtype)

    def f(w, h, xs):
        return fg.scan(lambda h, x: (fnp.tanh(h @ w + x), (h * 2.0, fnp.exp(h))), h, xs)

    jf = fg.jit(f)
    h0, xs = rng.standard_normal((2, 3)).astype(dtype), rng.standard_normal((4, 2, 3)).astype(dtype)
    for _ in range(4):
        jf(w, h0, xs)
    (step,) = [s for s in _scans(jf.lower(w, h0, xs).executable.plan)]
    assert step.looped.program.in_place == 2
    first = _flat(jf(w, h0, xs))
    kept = [np.array(x, copy=True) for x in first]
    loop_table.ENABLED = False
    try:
        jf(w, h0 - 1.0, xs)
    finally:
        loop_table.ENABLED = True
    config.update("runtime", "steps")
    jf(w, h0 + 0.5, xs)
    config.update("runtime", "vm")
    jf(w, h0 + 1.0, xs)
    for a, b in zip(first, kept, strict=True):
        assert np.array_equal(a, b)


def test_value_and_grad_writes_the_stacks_of_both_scans_in_place():
    """S1's cell: the forward scan's hidden states and the backward scan's gradients
    (summed after the loop) are written in place, with the other paths' bits."""
    rng = np.random.default_rng(7)
    f = _model("stacked", False, True)
    args = (
        rng.standard_normal((4, 4)) * 0.4,
        rng.standard_normal((3, 4)) * 0.4,
        rng.standard_normal((2, 4)),
        rng.standard_normal((5, 2, 3)),
    )
    _, scans = _four_ways(fg.value_and_grad(f, argnums=(0, 1)), args)
    assert len(scans) == 2
    assert all(s.looped.program.in_place >= 1 for s in scans)
