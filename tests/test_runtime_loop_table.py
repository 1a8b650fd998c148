"""A scan's iterations in the plan interpreter (runtime.loop_table, vm's LOOP opcode)
against the same scan's Python loop and the step runner: identical bits, forward and
reverse, carries and trip counts from hypothesis (0 and 1 included), value_and_grad's
backward scan, products with transposed operands, fori_loop; and against an oracle that
shares no code with the loop, the unrolled Python loop run by the reference interpreter.
Bodies the interpreter cannot run whole (a library call, a nested scan) and arguments
of other layouts keep the Python loop, and give the same answers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime import loop_table
from fastgrad.runtime.control_flow import LoopStep

TOL = {np.float32: 1e-4, np.float64: 1e-11}


@pytest.fixture(autouse=True)
def runtime(compiled_first_call: None) -> Iterator[None]:
    """Kernels and the interpreter compiled at first calls; the runtime restored after."""
    before = config.runtime
    yield
    config.update("runtime", before)


def _loops(jf: Any, args: Any) -> list[LoopStep]:
    return [s for s in jf.lower(*args).executable.plan if isinstance(s, LoopStep)]


def _flat(out: Any) -> list[np.ndarray]:
    if isinstance(out, tuple | list):
        return [x for o in out for x in _flat(o)]
    return [np.asarray(out)]


def _python_loop(jf: Any, args: tuple[Any, ...]) -> list[np.ndarray]:
    """jf's results with every scan running its Python loop."""
    loop_table.ENABLED = False
    try:
        return _flat(jf(*args))
    finally:
        loop_table.ENABLED = True


def _step_runner(f: Callable[..., Any], args: tuple[Any, ...]) -> list[np.ndarray]:
    """f's results by the step runner's first call, which its second call gives again bit
    for bit: fresh arrays (outputs, a scan's first stacks) sit wherever the allocator puts
    them, and a kernel's bits do not depend on where its arrays sit (codegen.support.
    NoAlias; before it, a float32 loss came out 2 ulp off the LOOP's in a loaded CI run: a
    sum over 20 elements added in another order when an output of its kernel started
    within 256 bytes past the kernel's input)."""
    config.update("runtime", "steps")
    jf = fg.jit(f)
    first = _flat(jf(*args))
    for a, b in zip(first, _flat(jf(*args)), strict=True):
        assert np.array_equal(a, b, equal_nan=True)
    return first


def _three_ways(f: Callable[..., Any], args: tuple[Any, ...], looped: bool | None = True) -> Any:
    """f's results by the LOOP (checked to run it, unless not `looped`; None: not checked),
    by the same plan's Python loop, and by the step runner: the same bits. Returns the
    LOOP's."""
    steps = _step_runner(f, args)
    config.update("runtime", "vm")
    jf = fg.jit(f)
    for _ in range(3):  # lowered at the first, watched at the second, a LOOP from the third
        jf(*args)
    got = _flat(jf(*args))
    scans = [s.looped for s in _loops(jf, args) if s.looped is not None]
    if looped is not None:
        assert all((s.program is not None) == looped for s in scans if s.call.length > 0)
    python = _python_loop(jf, args)
    for a, b, c in zip(got, python, steps, strict=True):
        assert a.dtype == b.dtype == c.dtype and a.shape == b.shape == c.shape
        assert np.array_equal(a, b, equal_nan=True) and np.array_equal(a, c, equal_nan=True)
    return got


def _close(got: list[np.ndarray], want: Any, dtype: Any) -> None:
    for a, b in zip(got, _flat(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


def _rnn(carries: int, reverse: bool) -> Callable[..., Any]:
    """A scan with `carries` hidden states, each mixing all of them through w and w.T."""

    def f(w, hs, xs):
        def step(c, x):
            new = tuple(fnp.tanh(h @ w + (c[k - 1] @ w.T) * 0.5 + x) for k, h in enumerate(c))
            return new, fnp.sum(new[0] * new[-1], axis=1)

        return fg.scan(step, tuple(hs[: len(hs)]), xs, reverse=reverse)

    def unrolled(w, hs, xs):
        c, ys = tuple(hs), []
        steps = range(xs.shape[0])
        for t in reversed(steps) if reverse else steps:
            c = tuple(fnp.tanh(h @ w + (c[k - 1] @ w.T) * 0.5 + xs[t]) for k, h in enumerate(c))
            ys.append(fnp.sum(c[0] * c[-1], axis=1))
        ys = ys[::-1] if reverse else ys
        return c, fnp.stack(ys) if ys else fnp.zeros((0, hs[0].shape[0]), xs.dtype)

    return f, unrolled


@settings(max_examples=8, deadline=None)
@given(
    steps=st.sampled_from([0, 1, 2, 5]),
    carries=st.integers(1, 2),
    batch=st.integers(2, 3),
    reverse=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_scan_in_the_interpreter_matches_its_python_loop_and_the_unrolled_one(
    steps, carries, batch, reverse, dtype, seed
):
    rng = np.random.default_rng(seed)
    hidden = 4
    w = (rng.standard_normal((hidden, hidden)) * 0.5).astype(dtype)
    hs = tuple(rng.standard_normal((batch, hidden)).astype(dtype) for _ in range(carries))
    xs = rng.standard_normal((steps, batch, hidden)).astype(dtype)
    f, unrolled = _rnn(carries, reverse)
    got = _three_ways(f, (w, hs, xs))
    _close(got, fg.jit(unrolled, fuse=False)(w, hs, xs), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_value_and_grad_runs_both_scans_in_the_interpreter(dtype):
    """The forward scan stacking residuals and the backward scan (with the weights'
    gradients summed after it: loop_hoisting) both run as LOOPs."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((6, 6)) * 0.4).astype(dtype)
    wx = (rng.standard_normal((3, 6)) * 0.4).astype(dtype)
    h0 = rng.standard_normal((4, 6)).astype(dtype)
    xs = rng.standard_normal((7, 4, 3)).astype(dtype)

    def loss(w, wx, h0, xs, scan=True):
        def step(h, x):
            h = fnp.tanh(x @ wx + h @ w)
            return h, h

        if scan:
            _, hs = fg.scan(step, h0, xs)
        else:
            h, stacked = h0, []
            for t in range(xs.shape[0]):
                h, _ = step(h, xs[t])
                stacked.append(h)
            hs = fnp.stack(stacked)
        return fnp.mean(hs * hs)

    grad = fg.value_and_grad(loss, argnums=(0, 1, 2))
    got = _three_ways(grad, (w, wx, h0, xs))
    unrolled = fg.value_and_grad(lambda *a: loss(*a, scan=False), argnums=(0, 1, 2))
    _close(got, fg.jit(unrolled, fuse=False)(w, wx, h0, xs), dtype)


def test_fori_loop_with_static_bounds():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((5, 5)) * 0.3
    x0 = rng.standard_normal((3, 5))

    def f(a, x):
        return fg.fori_loop(2, 9, lambda i, x: fnp.sin(x @ a.T) + x * 0.5, x)

    got = _three_ways(f, (a, x0))
    want = x0
    for _ in range(2, 9):
        want = np.sin(want @ a.T) + want * 0.5
    _close(got, want, np.float64)


def _nested_data(seed: int, hidden: int, inner: int) -> tuple[np.ndarray, ...]:
    """For scans nested two deep: a weight (hidden, hidden), a batch of two hidden states,
    and the inputs of 3 outer steps of `inner` inner steps."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((hidden, hidden)) * 0.4
    h0 = rng.standard_normal((2, hidden))
    xs = rng.standard_normal((3, inner, 2, hidden))
    return w, h0, xs


def test_nested_scans_run_the_inner_one_in_the_interpreter():
    """The outer body holds a scan: once the inner one's LOOP is built it is rows of the
    outer body's table (runtime.loop_row), so that body is one segment and the outer
    loop a LOOP too (before: a host step, the outer loop Python's)."""
    w, h0, xs = _nested_data(seed=3, hidden=4, inner=5)

    def f(w, h, xs):
        def inner(h, x):
            return fnp.tanh(h @ w + x), None

        def outer(h, x):
            h, _ = fg.scan(inner, h, x)
            return h * 0.9, fnp.sum(h)

        return fg.scan(outer, h, xs)

    got = _three_ways(f, (w, h0, xs), looped=None)
    jf = fg.jit(f)
    for _ in range(6):
        jf(w, h0, xs)
    (outer,) = _loops(jf, (w, h0, xs))
    assert outer.looped.program is not None  # the body is one segment
    (inner,) = [s for s in outer.bodies[0].plan if isinstance(s, LoopStep)]
    assert inner.looped.program is not None
    h, sums = h0, []
    for x in xs:
        for t in range(x.shape[0]):
            h = np.tanh(h @ w + x[t])
        sums.append(h.sum())
        h = h * 0.9
    _close(got, (h, np.array(sums)), np.float64)


def _steps(n: int, reverse: bool) -> range:
    return range(n - 1, -1, -1) if reverse else range(n)


def _unrolled(body: Callable[..., Any], h: Any, xs: Any, reverse: bool, y_shape: Any) -> Any:
    """A scan of `body` over the rows of `xs` as a Python loop: the final carry and the
    stacked outputs (of shape `y_shape` each, for a scan of no steps)."""
    ys = []
    for t in _steps(xs.shape[0], reverse):
        h, y = body(h, xs[t])
        ys.append(y)
    ys = ys[::-1] if reverse else ys
    return h, fnp.stack(ys) if ys else fnp.zeros((0, *y_shape), h.dtype)


def _nested(reverse: tuple[bool, bool], scan: bool = True) -> Callable[..., Any]:
    """A scan over chunks of steps, each chunk a scan (`reverse`: whether the inner and
    the outer scan run backwards); with `scan` off, the same loops unrolled in Python."""
    inner_reverse, outer_reverse = reverse

    def inner(h, x, w):
        h = fnp.tanh(h @ w + x)
        return h, fnp.sum(h * h, axis=1)

    def outer(h, chunk, w):
        if scan:
            h, ys = fg.scan(lambda h, x: inner(h, x, w), h, chunk, reverse=inner_reverse)
        else:
            h, ys = _unrolled(lambda h, x: inner(h, x, w), h, chunk, inner_reverse, h.shape[:1])
        return h * 0.9, fnp.sum(ys * ys) + fnp.sum(h)

    def loss(w, h, xs):
        if scan:
            h, sums = fg.scan(lambda h, c: outer(h, c, w), h, xs, reverse=outer_reverse)
        else:
            h, sums = _unrolled(lambda h, c: outer(h, c, w), h, xs, outer_reverse, ())
        return fnp.sum(h * h) + fnp.sum(sums * 0.5)

    return loss


@settings(max_examples=5, deadline=None)
@given(
    chunks=st.sampled_from([0, 1, 3]),
    steps=st.sampled_from([0, 1, 2, 4]),
    reverse=st.tuples(st.booleans(), st.booleans()),
    seed=st.integers(0, 2**16),
)
def test_nested_scans_match_the_unrolled_loops_to_second_order(chunks, steps, reverse, seed):
    """Values, gradients and gradients of gradients through a scan of scans (trip counts
    0 and 1 included, either reversed or not): the LOOP, the Python loop and the
    step runner agree bit for bit, and the unrolled loops on the reference interpreter
    within rounding (~2 s with kernels on disk, ~45 s from an empty cache, loaded machine)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((3, 3)) * 0.4
    h0 = rng.standard_normal((2, 3))
    xs = rng.standard_normal((chunks, steps, 2, 3))
    v = rng.standard_normal((3, 3))
    args = (w, h0, xs)

    def along_v(f: Callable[..., Any]) -> Callable[..., Any]:
        grad = fg.grad(f)
        return lambda w, h, xs: fnp.sum(grad(w, h, xs) * v)

    f, unrolled = _nested(reverse), _nested(reverse, scan=False)
    for _ in range(2):  # value_and_grad of f, then of its gradient along v
        got = _three_ways(fg.value_and_grad(f), args, looped=None)
        _close(got, fg.jit(fg.value_and_grad(unrolled), fuse=False)(*args), np.float64)
        f, unrolled = along_v(f), along_v(unrolled)


def test_a_body_with_a_library_call_keeps_the_python_loop():
    rng = np.random.default_rng(4)
    h0 = rng.standard_normal((3, 6))
    xs = rng.standard_normal((4, 3, 6))

    def f(h, xs):
        return fg.scan(lambda h, x: (fnp.sort(h + x, axis=1) * 0.5, fnp.cumsum(h, axis=1)), h, xs)

    got = _three_ways(f, (h0, xs), looped=False)
    h, ys = h0, []
    for x in xs:
        ys.append(np.cumsum(h, axis=1))
        h = np.sort(h + x, axis=1) * 0.5
    _close(got, (h, np.stack(ys)), np.float64)


def test_arguments_of_another_layout_run_the_python_loop():
    """The LOOP is built for C-contiguous weights; a transposed view, then C-contiguous
    arrays again, both give the right answer."""
    rng = np.random.default_rng(5)
    f, unrolled = _rnn(1, False)
    w = rng.standard_normal((4, 4)) * 0.5
    hs = (rng.standard_normal((3, 4)),)
    xs = rng.standard_normal((6, 3, 4))
    jf = fg.jit(f)
    for _ in range(3):
        jf(w, hs, xs)
    reference = fg.jit(unrolled, fuse=False)
    for weights in (np.asfortranarray(w), w, w.T.copy().T):
        _close(_flat(jf(weights, hs, xs)), reference(weights, hs, xs), np.float64)
    assert all(s.looped.program is not None for s in _loops(jf, (w, hs, xs)))


def test_the_loop_compiles_in_the_background():
    """In background mode the scan runs its Python loop (NumPy tier, kernels, then its
    body's segments) until the interpreter for the LOOP's arrays is built, then the LOOP
    takes over with the same bits."""
    from fastgrad.runtime.background import wait_idle

    rng = np.random.default_rng(6)
    f, unrolled = _rnn(1, True)
    args = (
        rng.standard_normal((5, 5)) * 0.5,
        (rng.standard_normal((2, 5)),),
        rng.standard_normal((4, 2, 5)),
    )
    config.update("runtime", "vm")
    config.update("compile", "background")
    jf = fg.jit(f)
    want = _flat(fg.jit(unrolled, fuse=False)(*args))
    for _ in range(8):  # NumPy's tier first: its bits may differ from the kernels'
        _close(_flat(jf(*args)), want, np.float64)
        assert wait_idle(timeout=600)
    (scan,) = _loops(jf, args)
    assert scan.looped.program is not None
    got = _flat(jf(*args))
    python = _python_loop(jf, args)
    for a, b in zip(got, python, strict=True):
        assert np.array_equal(a, b)


def _counter(w, h, xs):
    """Carries of three kinds: a matrix, a 0-d float and an integer count; no stacked
    output of the count."""

    def step(c, x):
        h, total, n = c
        h = fnp.tanh(h @ w + x)
        return (h, total + fnp.sum(h), n + 1), h[0]

    return fg.scan(step, (h, fnp.zeros((), h.dtype), fnp.zeros((), np.int64)), xs)


def _no_xs(w, h, xs):
    """A scan over no stacked input (`length`), stacking nothing."""
    c, _ = fg.scan(lambda c, _: (fnp.sin(c @ w), None), h, None, length=4)
    return c


def _jvp(w, h, xs):
    """Forward mode: a scan over primals and tangents."""
    return fg.jvp(lambda w: _counter(w, h, xs)[0][0], (w,), (fnp.ones_like(w),))


@pytest.mark.parametrize("f", [_counter, _no_xs, _jvp], ids=["counter", "no-xs", "jvp"])
def test_carries_of_every_kind_and_forward_mode(f):
    rng = np.random.default_rng(7)
    args = (
        rng.standard_normal((4, 4)) * 0.5,
        rng.standard_normal((3, 4)),
        rng.standard_normal((5, 3, 4)),
    )
    got = _three_ways(f, args)
    _close(got, fg.jit(f, fuse=False)(*args), np.float64)


def _delay_line(a0, b0, w, xs):
    """Carries (a, b) -> (b, new): `a` is last step's `b`, handed on unchanged."""

    def body(c, x):
        a, b = c
        new = fnp.tanh(b @ w) * x
        return (b, new), a @ w + fnp.sum(a, axis=0)

    return fg.scan(body, (a0, b0), xs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_carry_handed_on_unchanged_is_not_overwritten(dtype):
    """A carry output that is a carry input lives in the buffers the next iteration
    writes: read after that write, it held the new value (errors of 0.1-13 before)."""
    rng = np.random.default_rng(3)
    a0, b0, w = (rng.standard_normal((5, 5)).astype(dtype) * 0.5 for _ in range(3))
    xs = rng.standard_normal((7, 5, 5)).astype(dtype)
    got = _three_ways(_delay_line, (a0, b0, w, xs))
    a, b, ys = a0, b0, []
    for x in xs:
        ys.append(a @ w + a.sum(axis=0))
        a, b = b, np.tanh(b @ w) * x
    _close(got, ((a, b), np.stack(ys)), dtype)


_READS = {  # what a delay line's body reads of the carry it hands on
    "a @ w": (lambda a, w, x: a @ w, lambda a, w, x: a @ w),
    "sum(a)": (lambda a, w, x: fnp.sum(a), lambda a, w, x: np.sum(a)),
    "a * 2": (lambda a, w, x: a * 2.0, lambda a, w, x: a * 2.0),
    "a.T @ x": (lambda a, w, x: a.T @ x, lambda a, w, x: a.T @ x),
}


@pytest.mark.parametrize("swapped", [False, True], ids=["delay", "swapped"])
@pytest.mark.parametrize("reads", sorted(_READS))
def test_carries_handed_on_run_as_a_loop(reads, swapped):
    """(a, b) -> (b, new) and (a, b) -> (b, a) run as a LOOP (each iteration copies the
    carry it hands on out of the buffers the next one writes), with the Python loop's and
    the step runner's bits, and NumPy's values; trip counts 0, 1, 2, 5, 1-D and 2-D
    carries, reverse, float32 and float64 over the cases."""
    traced, plain = _READS[reads]

    def f(a0, b0, w, xs, reverse):
        def body(c, x):
            a, b = c
            return (b, a if swapped else fnp.tanh(b * 0.5 + x)), traced(a, w, x)

        return fg.scan(body, (a0, b0), xs, reverse=reverse)

    for i, steps in enumerate([0, 1, 2, 5]):
        shape, reverse = [(4,), (3, 4)][i % 2], i in (1, 3)
        dtype = [np.float32, np.float64][(i + swapped) % 2]
        rng = np.random.default_rng(i)
        a0, b0 = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
        w = rng.standard_normal((4, 4)).astype(dtype) * 0.5
        xs = rng.standard_normal((steps, *shape)).astype(dtype)
        args = (a0, b0, w, xs)
        got = _three_ways(lambda a0, b0, w, xs, r=reverse: f(a0, b0, w, xs, r), args)
        a, b, ys = a0, b0, []
        for x in xs[::-1] if reverse else xs:
            ys.append(plain(a, w, x))
            a, b = b, a if swapped else np.tanh(b * 0.5 + x)
        ys = np.stack(ys[::-1] if reverse else ys) if steps else got[2]
        _close(got, ((a, b), ys), dtype)


@pytest.mark.parametrize("reverse", [False, True])
def test_a_carry_handed_on_as_a_view(reverse):
    """(a, b) -> (b.reshape(12), new): the carry handed on is a view of a carry input."""

    def f(a0, b0, xs):
        def body(c, x):
            a, b = c
            return (b.reshape(12), fnp.tanh(a.reshape(3, 4) * 0.5 + x)), fnp.sum(a * b.reshape(12))

        return fg.scan(body, (a0, b0), xs, reverse=reverse)

    rng = np.random.default_rng(6)
    a, b = rng.standard_normal(12), rng.standard_normal((3, 4))
    xs = rng.standard_normal((5, 3, 4))
    got = _three_ways(f, (a, b, xs))
    ys = []
    for x in xs[::-1] if reverse else xs:
        ys.append(np.sum(a * b.reshape(12)))
        a, b = b.reshape(12), np.tanh(a.reshape(3, 4) * 0.5 + x)
    _close(got, ((a, b), np.stack(ys[::-1] if reverse else ys)), np.float64)


def test_the_gradient_of_a_delay_line():
    """value_and_grad's forward and backward scans of a delay line both run as a LOOP,
    with the bits of the Python loop and the step runner, and the unrolled loop's grad."""

    def loss(a0, b0, w, xs, unrolled=False):
        def body(c, x):
            a, b = c
            return (b, fnp.tanh(b @ w) * x), a @ w

        if unrolled:
            c, ys = (a0, b0), []
            for t in range(xs.shape[0]):
                c, y = body(c, xs[t])
                ys.append(y)
            (a, b), ys = c, fnp.stack(ys)
        else:
            (a, b), ys = fg.scan(body, (a0, b0), xs)
        return fnp.sum(ys * ys) + fnp.sum(a * b)

    rng = np.random.default_rng(8)
    args = tuple(rng.standard_normal(s) * 0.5 for s in [(3, 4), (3, 4), (4, 4), (6, 3, 4)])
    got = _three_ways(fg.grad(loss, argnums=(0, 1, 2)), args)
    want = fg.grad(lambda *a: loss(*a, unrolled=True), argnums=(0, 1, 2))(*args)
    _close(got, want, np.float64)


def test_a_const_handed_on_unread_has_its_layout_checked():
    """(c, x) -> (k, c * x): the body never reads `k`, so the LOOP row built for a C-order
    `k` must still check `k`'s layout when a later call passes it in Fortran order."""

    def f(c0, k, xs):
        return fg.scan(lambda c, x: (k, c * x), c0, xs)

    rng = np.random.default_rng(4)
    c0, k = rng.standard_normal((2, 4, 4))
    xs = rng.standard_normal((5, 4, 4))
    jf = fg.jit(f)
    for k_now in [k] * 4 + [np.asfortranarray(k.T)] * 2:
        c, ys = jf(c0, k_now, xs)
        want = [c0 * xs[0]] + [k_now * x for x in xs[1:]]
        assert np.array_equal(c, k_now) and np.array_equal(ys, np.stack(want))


def test_a_read_only_argument_does_not_compile_the_interpreter_again():
    """A read-only const is another Numba type: the LOOP calls the entry compiled for its
    row's kind, not the dispatcher (which compiled the interpreter inside the call)."""
    from fastgrad.runtime.vm import run_steps

    def f(c0, w, xs):
        return fg.scan(lambda c, x: (fnp.tanh(c @ w + x), c), c0, xs)

    rng = np.random.default_rng(5)
    c0, w, xs = (
        rng.standard_normal((4, 8)),
        rng.standard_normal((8, 8)),
        rng.standard_normal((9, 4, 8)),
    )
    jf = fg.jit(f)
    for _ in range(4):  # the LOOP row is built and its interpreter kind compiled
        got = _flat(jf(c0, w, xs))
    assert all(s.looped.program is not None for s in _loops(jf, (c0, w, xs)) if s.looped)
    kinds = len(run_steps.overloads)
    w = w.copy()
    w.flags.writeable = False
    again = _flat(jf(c0, w, xs))
    assert len(run_steps.overloads) == kinds
    assert all(np.array_equal(a, b) for a, b in zip(got, again, strict=True))
