"""The plan interpreter (config.runtime = "vm") against the step runner: random programs and
their gradients give the same bits either way, float32 and float64, elementwise ones and
stacks of matmuls (products with transposed operands, batched, accumulated, read through
views); arguments the interpreter cannot see as they are run the steps one by one; in
background mode the adapters compile behind, and the interpreter takes over after."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.kernel_cache import call_writable
from fastgrad.core.config import config
from fastgrad.runtime.plan_table import Segment
from fastgrad.testing import strategies as fst


@pytest.fixture(scope="module")
def sync() -> Iterator[None]:
    before = config.compile, config.runtime
    config.update("compile", "sync")
    yield
    config.update("compile", before[0])
    config.update("runtime", before[1])


def _jitted(f: Any, runtime: str) -> Any:
    """`fg.jit(f)` whose plans (built at a first call with new shapes) use `runtime`."""
    jf = fg.jit(f)

    def call(*args: Any) -> Any:
        before = config.runtime
        config.update("runtime", runtime)
        try:
            return jf(*args)
        finally:
            config.update("runtime", before)

    call.lower = jf.lower  # type: ignore[attr-defined]
    return call


def _segments(jf: Any, args: Any) -> int:
    arena = jf.lower(*args).executable.arena
    return sum(isinstance(call, Segment) for call in arena.calls)


def _same_bits(a: Any, b: Any) -> None:
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True), (x, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_random_programs_give_the_step_runners_bits(sync: None, dtype: Any, data: Any) -> None:
    program = data.draw(fst.programs(max_steps=4))
    xs = data.draw(st.tuples(*(fst.arrays(s, dtype, "real") for s in program.shapes)))

    def value_and_grads(*args: Any) -> Any:
        n = len(args)
        value, grads = fg.value_and_grad(lambda *a: fnp.sum(program(*a)), argnums=tuple(range(n)))(
            *args
        )
        return (program(*args), value, *grads)

    steps, vm = _jitted(value_and_grads, "steps"), _jitted(value_and_grads, "vm")
    expected = steps(*xs)
    # The first call settles the plan, the second runs the table, the third the small
    # call (runtime.small_call) where the plan is one segment.
    for _ in range(3):
        _same_bits(expected, vm(*xs))
    assert _segments(vm, xs) >= 1
    other = [x * 0.5 for x in xs]
    _same_bits(steps(*other), vm(*other))


def test_kernels_run_as_segments_and_fall_back_on_strided_arguments(sync: None) -> None:
    def f(x: Any, y: Any) -> Any:
        a = fnp.tanh(x) * y + 1.0
        return fnp.sum(a * a, axis=0), fnp.exp(-a)

    x, y = np.linspace(-1, 1, 12).reshape(4, 3), np.linspace(0, 1, 3)
    steps, vm = _jitted(f, "steps"), _jitted(f, "vm")
    _same_bits(steps(x, y), vm(x, y))
    assert _segments(vm, (x, y)) >= 1
    strided = np.linspace(-1, 1, 24).reshape(4, 6)[:, ::2]  # not contiguous: host steps
    _same_bits(steps(strided, y), vm(strided, y))
    _same_bits(steps(x, y), vm(x, y))  # and back


def test_segments_between_host_steps(sync: None) -> None:
    """Kernels around matmuls and views: segments read what host steps wrote, and a
    kernel reading a transposed buffer (not contiguous) stays a host step."""

    def f(a: Any, w: Any) -> Any:
        h = fnp.tanh(a @ w)
        return fnp.sum(fnp.exp(h.T) * fnp.sin(w), axis=1), (h * h) @ w.T

    a, w = np.linspace(-1, 1, 9).reshape(3, 3), np.linspace(0, 1, 9).reshape(3, 3)
    for dtype in (np.float32, np.float64):
        steps, vm = _jitted(f, "steps"), _jitted(f, "vm")
        args = (a.astype(dtype), w.astype(dtype))
        for _ in range(3):
            _same_bits(steps(*args), vm(*args))
        assert _segments(vm, args) >= 1


def test_a_read_only_argument_needs_no_new_interpreter(sync: None) -> None:
    """An argument that differs from the lowering run only in being read-only passes the
    segments' layout checks: the segments call the interpreter's entry for the kind it was
    built for, so Numba compiles no new kind in the call, and the bits stay the same."""
    from fastgrad.runtime.vm import run_steps

    def f(a: Any, w: Any) -> Any:
        h = fnp.tanh(a @ w)
        return fnp.sum(fnp.exp(h.T) * fnp.sin(w), axis=1), fnp.sort(h, axis=0) * w

    a, w = np.linspace(-1, 1, 9).reshape(3, 3), np.linspace(0, 1, 9).reshape(3, 3)
    steps, vm = _jitted(f, "steps"), _jitted(f, "vm")
    for _ in range(3):
        vm(a, w)
    assert _segments(vm, (a, w)) >= 2
    kinds = len(run_steps.signatures)
    frozen = a.copy()
    frozen.flags.writeable = False
    _same_bits(steps(frozen, w), vm(frozen, w))
    assert len(run_steps.signatures) == kinds


def test_the_step_runner_takes_a_read_only_argument_without_a_compile(sync: None) -> None:
    """A read-only argument is another Numba type: the step runner calls the kernel's
    overload for writeable arrays of that layout rather than compiling one more on the
    calling thread (0.5-1.5 s), with the same bits."""

    def f(x: Any) -> Any:
        return (fnp.sum(fnp.tanh(x) * fnp.exp(-x * x) / (1.5 + x)),)

    x = np.linspace(-1, 2, 1000)
    steps = _jitted(f, "steps")
    want = steps(x)
    plan = steps.lower(x).executable.plan
    kernels = [s.kernel for s in plan if getattr(s, "kernel", None) is not None]
    assert kernels
    before = [len(k.overloads) for k in kernels]
    frozen = x.copy()
    frozen.flags.writeable = False
    _same_bits(steps(frozen), want)
    assert [len(k.overloads) for k in kernels] == before


def test_writeable_calls_never_look_up_an_overload() -> None:
    """NumPy scalars (a kernel's constants) have flags that are never writeable: a call
    with them and writeable arrays goes straight to the kernel, not through Numba's
    typing of every argument (6x slower a step in the step runner)."""

    class Overloads(dict):
        def get(self, key: Any, default: Any = None) -> Any:
            raise AssertionError("looked up an overload for writeable arguments")

    class Kernel:
        overloads = Overloads({0: None})

        def __call__(self, *args: Any) -> Any:
            return args

    args = (np.ones(3), np.float64(0.37), np.float32(2.0))
    assert call_writable(Kernel(), args) == args


def test_runtime_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="runtime"):
        config.update("runtime", "fast")


def _interpreted(jf: Any, args: Any) -> bool:
    """Whether the whole plan runs as calls into the interpreter (no host step)."""
    return bool(jf.lower(*args).executable.arena.bare)


@st.composite
def _matmul_programs(draw: Any) -> tuple[Any, list[tuple[int, ...]]]:
    """A random stack of matmul layers (weights used as they are or transposed, over a
    batch or not) with activations, read through slices at the end: its gradient has
    products with transposed operands, and views of buffers and arguments."""
    widths = draw(st.lists(st.integers(2, 4), min_size=2, max_size=4))
    batch = draw(st.sampled_from([(), (2,), (2, 1)]))
    transposed = draw(st.lists(st.booleans(), min_size=len(widths), max_size=len(widths)))
    acts = draw(st.lists(st.sampled_from(["tanh", "sin", "none"]), min_size=len(widths)))
    rows = draw(st.integers(2, 4))
    shapes = [(*batch, rows, widths[0])]
    for (a, b), flip in zip(itertools.pairwise(widths), transposed, strict=False):
        shapes.append((b, a) if flip else (a, b))

    def program(x: Any, *ws: Any) -> Any:
        h = x
        for w, flip, act in zip(ws, transposed, acts, strict=False):
            h = h @ (w.T if flip else w)
            h = getattr(fnp, act)(h) if act != "none" else h
        return fnp.sum(h[..., 1:, :] * h[..., :-1, :]) + fnp.sum(h.T[0])

    return program, shapes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_matmul_programs_give_the_step_runners_bits(sync: None, dtype: Any, data: Any) -> None:
    program, shapes = data.draw(_matmul_programs())
    xs = tuple(data.draw(fst.arrays(s, dtype, "real")) for s in shapes)
    vg = fg.value_and_grad(program, argnums=tuple(range(len(xs))))
    steps, vm = _jitted(vg, "steps"), _jitted(vg, "vm")
    expected = steps(*xs)
    for _ in range(3):
        value, grads = vm(*xs)
        _same_bits([expected[0], *expected[1]], [value, *grads])
    assert _segments(vm, xs) >= 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_matrix_times_its_own_transpose_gives_numpys_syrk_bits(sync: None, dtype: Any) -> None:
    """NumPy sends `a @ a.T` (one address, transposed strides) to BLAS's syrk and mirrors
    the upper triangle, whose bits differ from gemm's: the interpreter finds the aliasing at
    run time, also when the caller passes an array and its transpose."""

    def gram(x: Any) -> Any:
        h = fnp.tanh(x)
        return h @ h.T, h.T @ h

    def product(a: Any, b: Any) -> Any:
        return a @ b

    x = np.random.default_rng(3).standard_normal((16, 33)).astype(dtype)
    for f, args in ((gram, (x,)), (product, (x, x.T)), (product, (x.T, x))):
        steps, vm = _jitted(f, "steps"), _jitted(f, "vm")
        expected = steps(*args)
        for _ in range(2):
            got = vm(*args)
            _same_bits(expected if isinstance(expected, tuple) else (expected,),
                       got if isinstance(got, tuple) else (got,))  # fmt: skip
        assert _segments(vm, args) >= 1
    assert np.array_equal(steps(x.T, x), x.T @ x)


def test_unrolled_loop_runs_in_one_interpreter_call(sync: None) -> None:
    """An unrolled recurrence: the weights' gradients are sums of products accumulated by
    gemm (beta = 1), the steps read slices of the argument; nothing is left to Python."""

    def loss(wx: Any, wh: Any, xs: Any, h: Any) -> Any:
        total = 0.0
        for t in range(xs.shape[0]):
            h = fnp.tanh(xs[t] @ wx + h @ wh)
            total = total + fnp.sum(h * h)
        return total

    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        args = tuple(
            rng.standard_normal(s).astype(dtype) for s in [(3, 4), (4, 4), (5, 2, 3), (2, 4)]
        )
        vg = fg.value_and_grad(loss, argnums=(0, 1))
        steps, vm = _jitted(vg, "steps"), _jitted(vg, "vm")
        expected = steps(*args)
        for _ in range(2):
            value, grads = vm(*args)
            _same_bits([expected[0], *expected[1]], [value, *grads])
        assert _interpreted(vm, args)
        # An argument in another layout: the segment checks it and runs the steps.
        strided = (args[0], np.asfortranarray(args[1]), *args[2:])
        value, grads = vm(*strided)
        expected = steps(*strided)
        _same_bits([expected[0], *expected[1]], [value, *grads])


def test_adapters_compile_in_the_background() -> None:
    """In background mode no call waits for an adapter: the plan runs its steps until
    they are all built, then the interpreter takes over with the same bits."""
    from fastgrad.runtime.background import wait_idle

    def f(a: Any, w: Any) -> Any:
        return fnp.sum(fnp.arctan(a @ w) * 0.37, axis=1), fnp.cosh(w) @ w.T

    a, w = np.linspace(-1, 1, 6).reshape(2, 3), np.linspace(0, 1, 9).reshape(3, 3)
    before = config.compile, config.runtime
    config.update("compile", "background")
    try:
        steps, vm = _jitted(f, "steps"), _jitted(f, "vm")
        expected = steps(a, w)
        for _ in range(6):  # NumPy tier, kernels, then adapters, then the interpreter
            _same_bits(expected, vm(a, w))
            assert wait_idle(timeout=600)
        assert _segments(vm, (a, w)) >= 1
        _same_bits(expected, vm(a, w))
    finally:
        config.update("compile", before[0])
        config.update("runtime", before[1])


def test_a_first_call_queues_its_adapters_behind_its_kernels() -> None:
    """A plan's first call hands the compile thread its kernels and, behind them, the
    adapters the interpreter will call them through and the interpreter's loop: by the
    time the kernels are ready so are they, before any call lowers the plan."""
    from fastgrad.compiler.codegen.adapter import adapter_source
    from fastgrad.runtime import adapters
    from fastgrad.runtime.background import wait_idle
    from fastgrad.runtime.plan_steps import _KernelStep

    def f(x: Any, k: Any) -> Any:  # int32 scalars and a 3-d float32: an adapter of its own
        return fnp.sum(fnp.tanh(x * 1.7) * k, axis=(1, 2))

    x, k = np.linspace(-1, 1, 30, dtype=np.float32).reshape(2, 3, 5), np.int32(3)
    before = config.compile, config.runtime
    config.update("compile", "background")
    config.update("runtime", "vm")
    try:
        jf = fg.jit(f)
        executable = jf.lower(x, k).executable
        steps = [s for s in executable.plan if isinstance(s, _KernelStep)]
        sources = {adapter_source(*step.adapter_signature()) for step in steps}
        assert sources
        with adapters._LOCK:  # as if no plan had asked for them yet
            for key in [*sources, adapters._LOOP]:
                adapters._JOBS.pop(key, None)
            adapters._AHEAD.clear()
        expected = f(x, k)
        np.testing.assert_allclose(jf(x, k), expected, rtol=1e-6)  # NumPy tier
        assert wait_idle(timeout=600)
        for key in [*sources, adapters._LOOP]:
            assert adapters._JOBS[key].done.is_set() and adapters._JOBS[key].error is None
        for _ in range(4):
            np.testing.assert_allclose(jf(x, k), expected, rtol=1e-6)
            assert wait_idle(timeout=600)
        assert _segments(jf, (x, k)) >= 1
    finally:
        config.update("compile", before[0])
        config.update("runtime", before[1])


def test_index_checks_run_before_the_interpreter(sync: None) -> None:
    """A kernel gathering by labels (an argument) runs in the interpreter, its bounds
    checked first: a label out of range raises NumPy's IndexError, as with the steps."""

    def loss(w: Any, x: Any, labels: Any) -> Any:
        z = x @ w
        return fnp.mean(fnp.logsumexp(z, axis=1) - z[np.arange(4), labels])

    x, w = np.linspace(-1, 1, 12).reshape(4, 3), np.linspace(0, 1, 6).reshape(3, 2)
    labels = np.array([0, 1, 1, 0])
    steps, vm = _jitted(fg.value_and_grad(loss), "steps"), _jitted(fg.value_and_grad(loss), "vm")
    for _ in range(2):
        _same_bits(steps(w, x, labels), vm(w, x, labels))
    assert _interpreted(vm, (w, x, labels))
    with pytest.raises(IndexError, match="index 2 is out of bounds for axis 1 with size 2"):
        vm(w, x, np.array([0, 2, 1, 0]))


def test_views_python_reads_are_made_after_the_run(sync: None) -> None:
    """A view the interpreter computes is made as an array too where Python reads it: an
    output that is a view of a fresh product, a slice of an argument that a library call
    (sort) reads."""

    def f(x: Any, w: Any) -> Any:
        y = fnp.tanh(x[1:] * 2.0)
        return (x @ w).T, fnp.sort(x[1:], axis=0) + y, fnp.sum(y @ w)

    x, w = np.linspace(-1, 1, 12).reshape(4, 3), np.linspace(0, 1, 6).reshape(3, 2)
    steps, vm = _jitted(f, "steps"), _jitted(f, "vm")
    for _ in range(3):
        _same_bits(steps(x, w), vm(x, w))
    arena = vm.lower(x, w).executable.arena
    assert any(getattr(call, "exports", None) for call in arena.calls)
