"""The step runner: preallocated intermediates, fresh outputs, and the kinds of steps.

Intermediates live in buffers reused from call to call; what a caller receives must never
be one of them (nor a view of one), or the next call would overwrite it. Oracle: NumPy
values of the same maths, and the reference interpreter.
"""

import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.arena import STAGGER, plan_offsets, staggered_empty
from fastgrad.runtime.executable import _CallStep, _KernelStep, _MatmulStep, _ViewStep

rng = np.random.default_rng(7)


def rnn(wx, wh, b, xs, h):
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] @ wx + h @ wh + b)
    return fnp.mean(h * h)


def rnn_inputs(dtype, steps=4, batch=3, hidden=5, features=2):
    return (
        rng.standard_normal((features, hidden)).astype(dtype),
        rng.standard_normal((hidden, hidden)).astype(dtype) * 0.5,
        rng.standard_normal(hidden).astype(dtype),
        rng.standard_normal((steps, batch, features)).astype(dtype),
        rng.standard_normal((batch, hidden)).astype(dtype),
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rnn_plan_is_kernels_matmuls_and_views(dtype):
    args = rnn_inputs(dtype)
    f = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)))
    value, grads = f(*args)
    ref_value, ref_grads = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)), fuse=False)(*args)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(value, ref_value, rtol=tol)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol)
    plan = f.lower(*args).executable.plan
    kinds = {type(s) for s in plan}
    assert kinds <= {_KernelStep, _MatmulStep, _ViewStep}
    assert _CallStep not in kinds


def _returned_twice(f, *args):
    first = f(*args)
    kept = [np.array(x, copy=True) for x in fg.pytree.flatten(first)[0]]
    second = f(*(a * 2 + 1 for a in args))
    return first, kept, second


def test_outputs_are_fresh_at_every_call():
    """Returned values include a kernel output, a reshape and a transpose of kernel
    outputs, a matmul and a slice of one: the second call must leave the first call's
    results as they were, and share no memory with them."""

    def f(a, b):
        t = fnp.tanh(a) * 2
        m = t @ b
        return t, fnp.reshape(t + 1, (-1,)), (t * 3).T, m, m[1:, :2], fnp.sum(m * m)

    a = rng.standard_normal((4, 3))
    b = rng.standard_normal((3, 5))
    jf = fg.jit(f)
    first, kept, second = _returned_twice(jf, a, b)
    leaves = fg.pytree.flatten(first)[0]
    for x, y in zip(leaves, kept, strict=True):
        np.testing.assert_array_equal(x, y)
    for x in leaves:
        for y in fg.pytree.flatten(second)[0]:
            assert not np.shares_memory(x, y)
    reference = fg.jit(f, fuse=False)(a * 2 + 1, b * 2 + 1)
    for x, r in zip(fg.pytree.flatten(second)[0], reference, strict=True):
        np.testing.assert_allclose(x, r, rtol=1e-12)


def test_gradients_are_fresh_at_every_call():
    args = rnn_inputs(np.float64)
    f = fg.jit(fg.grad(rnn, argnums=(0, 1, 2)))
    first, kept, second = _returned_twice(f, *args)
    for x, y in zip(first, kept, strict=True):
        np.testing.assert_array_equal(x, y)
        assert not any(np.shares_memory(x, z) for z in second)


def test_concurrent_calls_from_threads():
    """A call that finds the buffers in use runs with buffers of its own."""
    args = rnn_inputs(np.float64, steps=6)
    f = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)))
    expected = f(*args)
    results: list = []
    barrier = threading.Barrier(4)

    def work():
        barrier.wait()
        for _ in range(30):
            results.append(f(*args))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 120
    for value, grads in results:
        assert value == expected[0]
        for g, e in zip(grads, expected[1], strict=True):
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_staggered_outputs(k):
    a = staggered_empty((3, 1000), np.dtype(np.float32), k)
    assert a.shape == (3, 1000) and a.dtype == np.float32 and a.flags.c_contiguous
    assert a.ctypes.data % 4096 == (k + 1) * 320 % 4096
    small = staggered_empty((10,), np.dtype(np.float64), k)
    assert small.shape == (10,)


def test_a_reshape_that_copies_runs_at_every_call():
    """A transpose of a preallocated buffer is a view made once per arena; a reshape of
    that transpose is a copy, so it must be made at every call, after the buffer is
    filled."""

    def f(a, b, c):
        m = fnp.tanh(a) @ b
        return fnp.reshape(fnp.reshape(m.T, (-1,)), (3, -1)) @ c

    a, b, c = rng.standard_normal((4, 3)), rng.standard_normal((3, 6)), rng.standard_normal((8, 2))
    jf = fg.jit(f)
    assert any(
        isinstance(s, _ViewStep) and s.op == "reshape" for s in jf.lower(a, b, c).executable.plan
    )
    for scale in (1.0, -2.0, 0.5):
        np.testing.assert_allclose(
            jf(a * scale, b, c), fg.jit(f, fuse=False)(a * scale, b, c), rtol=1e-12, atol=1e-12
        )


def test_zero_trip_loop_returns_fresh_carry():
    """A scan of length 0 hands back its initial carry: when that is an intermediate, the
    caller must still get memory no later call writes into."""

    def f(x):
        h = fnp.tanh(x) * 2
        carry, _ = fg.scan(lambda c, _: (c * 2, c), h, fnp.zeros((0,)))
        return carry

    x = rng.standard_normal(5)
    jf = fg.jit(f)
    first = jf(x)
    kept = first.copy()
    jf(x + 1)
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_allclose(first, np.tanh(x) * 2, rtol=1e-12)


def _agree_on_new_inputs(f, reference, calls):
    """Call `f` and `reference` on `calls` new inputs, checking they agree; the last ones."""
    for _ in range(calls):
        args = rnn_inputs(np.float64)
        value, grads = f(*args)
        ref_value, ref_grads = reference(*args)
        np.testing.assert_allclose(value, ref_value, rtol=1e-12)
        for g, r in zip(grads, ref_grads, strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    return args


def test_steps_settling_after_the_first_run_are_bound_then(monkeypatch):
    """In background mode the first run binds what it can (its kernels still compiling);
    a later run binds the steps that have settled since, and only those, until the arena
    is settled. Results agree with the reference all along."""
    from fastgrad.runtime import background

    monkeypatch.setattr(fg.config, "compile", "background")
    f = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)))
    reference = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)), fuse=False)
    args = rnn_inputs(np.float64)
    value, _ = f(*args)
    arena = f.lower(*args).executable.arena
    first = arena.unsettled
    assert first and not arena.settled  # the first run answered with NumPy
    bound = [arena.calls[k] for k in range(len(arena.calls)) if k not in set(first)]
    assert background.wait_idle(timeout=300)
    _agree_on_new_inputs(f, reference, 2)
    assert arena.settled and arena.unsettled == []
    if fg.config.runtime == "steps":  # "vm" lowers the calls once settled
        kept = [arena.calls[k] for k in range(len(arena.calls)) if k not in set(first)]
        assert all(a is b for a, b in zip(kept, bound, strict=True))  # not bound again


def test_prepared_steps_follow_new_inputs():
    """Once kernels are settled, steps run bound to the arena's buffers: every call with new
    inputs must still match the reference, and the arena keeps no caller's array alive."""
    f = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)))
    reference = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)), fuse=False)
    args = _agree_on_new_inputs(f, reference, 3)
    arena = f.lower(*args).executable.arena
    assert arena.settled
    xs = args[3].copy()
    before = sys.getrefcount(xs)
    f(*args[:3], xs, args[4])
    assert sys.getrefcount(xs) == before


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 20000), st.integers(0, 30), st.integers(0, 10)), max_size=25)
)
def test_buffers_live_at_once_never_overlap(raw):
    """plan_offsets: buffers whose spans of steps meet get disjoint, aligned memory."""
    spans = sorted(
        ((size, first, first + length) for size, first, length in raw), key=lambda s: s[1]
    )
    offsets, total = plan_offsets(spans)
    for (size, _, _), offset in zip(spans, offsets, strict=True):
        assert offset % 64 == 0 and offset + size <= total
    for i, (size_a, first_a, last_a) in enumerate(spans):
        for j in range(i):
            size_b, first_b, last_b = spans[j]
            if first_a <= last_b and first_b <= last_a:
                a, b = offsets[i], offsets[j]
                assert a + size_a <= b or b + size_b <= a


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 9000), st.integers(0, 30), st.integers(0, 10)), max_size=40)
)
def test_buffer_offsets_are_the_lowest_gap_first_fit(raw):
    """plan_offsets places each buffer in the lowest gap among those live at its first
    step: the same offsets as that rule written plainly (each buffer against all)."""
    spans = sorted(
        ((size, first, first + length) for size, first, length in raw), key=lambda s: s[1]
    )
    offsets, total = plan_offsets(spans)
    extents = []
    for size, _, _ in spans:
        extent = size + (STAGGER if size >= 4096 else 0)
        extents.append(extent + -extent % 64)
    for i, (_, first, _) in enumerate(spans):
        taken = sorted(
            (offsets[j], offsets[j] + extents[j]) for j in range(i) if spans[j][2] >= first
        )
        lowest = 0
        for start, end in taken:
            if start - lowest >= extents[i]:
                break
            lowest = max(lowest, end)
        assert offsets[i] == lowest, (i, spans, offsets)
    assert total == max((o + e for o, e in zip(offsets, extents, strict=True)), default=0)


def test_rnn_buffers_share_memory_by_liveness():
    args = rnn_inputs(np.float32, steps=8)
    f = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)))
    f(*args)
    arena = f.lower(*args).executable.arena
    _, total = plan_offsets([(b.nbytes, b.first, b.last) for b in arena.buffers])
    assert total < sum(b.nbytes for b in arena.buffers) / 2


def test_first_preparation_binds_each_step_once():
    """The first run gives each step one call: its prepared one where `prepare` gives it,
    else the step run on the arena's values (a step without `prepare`, or not settled
    yet). A step bound by `prepare` is never also wrapped to run step by step (the T=200
    RNN's 1,000 matmuls were, then replaced). Oracle: counts of what was asked."""
    from fastgrad.runtime.arena import Arena

    asked: list[str] = []

    class Step:
        def __init__(self, name, prepared):
            self.name, self.prepared = name, prepared

        @property
        def run(self):  # looked up once per step-by-step call made
            asked.append(self.name)
            return lambda env: env.append(self.name)

        def prepare(self, env, static):
            return None if self.prepared is None else (lambda: env.append(self.prepared))

    class Plain:
        def run(self, env):
            env.append("plain")

    steps = [Step("a", "A"), Step("b", None), Plain(), Step("c", "C")]
    arena = Arena([None], [], [], steps, [0], set())
    arena.run([1])
    assert asked == ["b"] and arena.unsettled == [1] and not arena.settled
    assert arena.env is not None and arena.env[1:] == ["A", "b", "plain", "C"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adapter_signatures_name_the_arguments_dtypes(dtype):
    """What the plan interpreter's adapter is built for (`adapter_signature`, its dtype
    names remembered per dtype) names the dtypes and ranks of the arguments a kernel step
    is called with. Oracle: the arrays `arguments` hands the kernel after a run."""
    from fastgrad.runtime.plan_steps import dtype_name

    for d in ["float32", ">f8", "<f8", "int64", ">i4", "bool", "complex64"]:
        assert dtype_name(np.dtype(d)) == np.dtype(d).name
    f = fg.jit(lambda x, y: fnp.sum(fnp.tanh(x * 0.5 + y) * 3.0))
    args = (rng.standard_normal((4, 6)).astype(dtype), rng.standard_normal(6).astype(dtype))
    f(*args)
    executable = f.lower(*args).executable
    env = list(executable.arena.env or [])
    env[: len(args)] = args
    steps = [s for s in executable.plan if isinstance(s, _KernelStep)]
    assert steps
    for step in steps:
        rank, scalars, operands = step.adapter_signature()
        arguments = step.arguments(env)
        head, arrays = arguments[: len(step.sizes) + 1], arguments[len(step.sizes) + 1 :]
        assert rank == len(step.sizes) and head[:rank] == list(step.sizes)
        values = [np.asarray(s) for s in arrays[: len(scalars)]]
        assert scalars == [v.dtype.name for v in values]
        named = [(a.ndim, a.dtype.name) for a in arrays[len(scalars) :]]
        assert operands == named


def test_alike_kernel_steps_share_what_their_avals_decide():
    """The kernel steps of an unrolled loop (a step per iteration) work out what their
    operands' avals decide (shapes the kernel writes and sees, adapter signature) once:
    the steps whose kernel and avals agree share it. Oracle: the avals themselves."""
    f = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)))
    args = rnn_inputs(np.float64, steps=6)
    f(*args)
    steps = [s for s in f.lower(*args).executable.plan if isinstance(s, _KernelStep)]
    groups: dict = {}
    for step in steps:
        avals = [(v.aval.shape, v.aval.dtype) for v in step.source.inputs + step.source.outputs]
        groups.setdefault((step.source.source, str(avals)), []).append(step)
        for (shape, dtype), v in zip(step.allocations, step.source.outputs, strict=True):
            assert dtype == v.aval.dtype and int(np.prod(shape)) == int(np.prod(v.aval.shape))
    alike = [g for g in groups.values() if len(g) > 1]
    assert alike  # the iterations' steps
    for group in alike:
        assert all(s.allocations is group[0].allocations for s in group)
        assert all(s.adapter_signature() == group[0].adapter_signature() for s in group)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_step_layouts_are_its_arguments(dtype):
    """What a first call keys the compile thread's jobs by (`layouts`) is the layout of
    the arguments the kernel is handed, its outputs' taken from the step's form without
    looking at the buffers (preallocated or fresh, all C-contiguous and aligned).
    Oracle: background.layout of `arguments`' arrays."""
    from fastgrad.runtime.background import layout

    f = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)))
    args = rnn_inputs(dtype)
    f(*args)
    executable = f.lower(*args).executable
    env = list(executable.arena.env or [])
    env[: len(args)] = args
    for step in [s for s in executable.plan if isinstance(s, _KernelStep)]:
        expected = tuple(map(layout, step.arguments(list(env))))
        unseen = list(env)
        for slot in step._buffers:
            if slot is not None:
                unseen[slot] = None
        assert step.layouts(unseen) == expected
