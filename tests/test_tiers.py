"""Tiered execution: a first call runs with NumPy while kernels compile in the background,
and calls switch to each kernel when it is ready.

The compile thread is replaced by a queue the test releases by hand, so that which tier
answers each call is decided by the test, never by timing. Tolerance between the tiers:
NumPy's libm and pairwise sums against fastgrad's vector math (~1 ulp) and chunked sums,
so rtol = atol = 1e-10 in float64.
"""

import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime import background, executable, numpy_blocks
from fastgrad.runtime.executable import PARALLEL_THRESHOLD
from fastgrad.testing import strategies as fst

TOL = {"rtol": 1e-10, "atol": 1e-10}


class HeldCompiles:
    """Stands in for the compile thread: keeps jobs until the test releases them."""

    def __init__(self):
        self.jobs = []  # kernels'
        self.others = []  # the plan interpreter's (adapters queued behind kernels), kept
        self.submitted = []  # all of them, run at the end (`held`)

    def submit(self, job):
        (self.jobs if isinstance(job, background.Job) else self.others).append(job)
        self.submitted.append(job)

    def release(self, n=None):
        n = len(self.jobs) if n is None else n
        for job in self.jobs[:n]:
            job.run()
        del self.jobs[:n]


@pytest.fixture
def held(monkeypatch):
    worker = HeldCompiles()
    monkeypatch.setattr(background, "_WORKER", worker)
    monkeypatch.setattr(fg.config, "compile", "background")
    yield worker
    # Jobs it kept are cached by what they build (runtime.adapters: the interpreter's loop,
    # adapters): left unrun, a later test's plan would wait on them for good (a vm test
    # after this file never lowered its plan).
    for job in worker.submitted:
        if not getattr(job, "settled", None) or not job.settled.is_set():
            job.run()


def plan(jitted):
    (traced,) = jitted._cache.values()
    return traced.executable


def kernel_steps(jitted):
    return [s for s in plan(jitted).plan if hasattr(s, "tier")]


def body_kernel_steps(jitted):
    """The kernel steps of the plans of the loops' bodies."""
    loops = [s for s in plan(jitted).plan if hasattr(s, "bodies")]
    return [k for s in loops for body in s.bodies for k in body.plan if hasattr(k, "tier")]


def loss(x, y):
    # 1.5, not W1's 1: a kernel no other test compiles first in the same process
    return fnp.sum(fnp.tanh(x * y + fnp.sin(x)) * fnp.exp(-y * y) / (1.5 + x * x))


def test_a_first_call_runs_on_numpy_then_switches(held, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))  # nothing on disk
    x, y = np.linspace(-2, 2, 30), np.linspace(0, 1, 30)
    f = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))
    expected = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)), fuse=False)(x, y)
    first = f(x, y)
    (step,) = kernel_steps(f)
    assert step.kernel is None and len(held.jobs) == 1  # no kernel ran: NumPy did
    assert "1 kernel in the background" in capsys.readouterr().err
    np.testing.assert_allclose(first[0], expected[0], **TOL)
    assert f(x, y)[0] == first[0] and step.kernel is None  # still compiling
    held.release()
    assert "in the background: 1 kernel (1 built, 0 cached)" in capsys.readouterr().err
    value, grads = f(x, y)
    assert step.kernel is not None and plan(f).compiled
    np.testing.assert_allclose(value, expected[0], **TOL)
    for g, e in zip(grads, expected[1], strict=True):
        np.testing.assert_allclose(g, e, **TOL)


def test_the_notices_count_each_distinct_kernel_once(held, monkeypatch, tmp_path, capsys):
    # An unrolled loop: every step's kernel has the same source (the steps of a long
    # Python loop once made the notice claim dozens of kernels where a few were built).
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))
    w = np.linspace(-0.5, 0.5, 16).reshape(4, 4)

    def unrolled(x):
        for _ in range(6):
            x = fnp.tanh(x @ w) * 1.25 + x
        return fnp.sum(x)

    f = fg.jit(unrolled)
    x = np.linspace(-1, 1, 12).reshape(3, 4)
    f(x)
    sources = f.lower(x).kernels
    distinct = len(set(sources))
    assert len(held.jobs) == distinct < len(kernel_steps(f))  # one job per kernel
    assert f"{distinct} kernel{'s' * (distinct > 1)} in the background" in capsys.readouterr().err
    held.release()
    done = f"in the background: {distinct} kernel{'s' * (distinct > 1)} ({distinct} built, 0 "
    assert done in capsys.readouterr().err


def test_large_loops_get_the_serial_kernel_first(held, monkeypatch):
    """The serial variant first, unless the final one is on disk (as it is after the
    first part here): then only the final one."""
    n = PARALLEL_THRESHOLD
    x = np.linspace(-1, 1, n)
    with monkeypatch.context() as patched:
        patched.setattr(background, "needs_build", lambda source: True)  # none on disk
        f = fg.jit(lambda x: fnp.sum(fnp.exp(x) * x))
        expected = float(np.sum(np.exp(x) * x))
        np.testing.assert_allclose(f(x), expected, rtol=1e-12)
    (step,) = kernel_steps(f)
    if not step.parallel:
        pytest.skip("one thread: no parallel variant")
    assert [j.label.split()[0] for j in held.jobs] == ["serial", "parallel"]
    held.release(1)
    np.testing.assert_allclose(f(x), expected, rtol=1e-12)
    assert step.kernel is not None and not plan(f).compiled
    held.release()
    np.testing.assert_allclose(f(x), expected, rtol=1e-12)
    assert plan(f).compiled
    del held.jobs[:]  # (the plan interpreter's, which that run asked for)
    g = fg.jit(lambda x: fnp.sum(fnp.exp(x) * x))
    np.testing.assert_allclose(g(x), expected, rtol=1e-12)
    assert [j.label.split()[0] for j in held.jobs] == ["parallel"]


def test_a_failed_compile_warns_once_and_stays_on_numpy(held, monkeypatch):
    def broken(*args):
        raise RuntimeError("no machine code today")

    monkeypatch.setattr(background, "compile_kernel", broken)
    x = np.linspace(0, 1, 7)
    f = fg.jit(lambda x: fnp.sum(fnp.cos(x) * 3.0))
    f(x)
    held.release()
    with pytest.warns(RuntimeWarning, match=r"kernel fastgrad_kernel_\w+ \(loop over \(7,\)\)"):
        value = f(x)
    np.testing.assert_allclose(value, np.sum(np.cos(x) * 3.0), rtol=1e-14)
    np.testing.assert_allclose(f(x), value)  # no second warning (warnings are errors here)
    assert kernel_steps(f)[0].kernel is None


class Marker:
    """A job that only records that it ran."""

    apart = False
    label = "a marker job"

    def __init__(self):
        self.done, self.settled = threading.Event(), threading.Event()
        self.source = SimpleNamespace(source="")  # what the watchdog would name

    def run(self):
        self.done.set()
        self.settled.set()

    def drop(self):
        self.settled.set()


def test_the_compile_thread_waits_for_first_calls_to_return():
    """Importing Numba and loading kernels holds the GIL: while a first call runs on NumPy
    the thread starts no job, unless a call waits for one."""
    worker = background._Worker()
    with worker.lock:
        worker.first_calls += 1  # as first_run does
    try:
        held = Marker()
        worker.submit(held)
        assert not held.done.wait(0.3)  # held back while the first call runs
        worker.waiting()  # a call waits for a job: the hold is lifted
        assert held.done.wait(30)
    finally:
        worker.hold(-1)
    later = Marker()
    worker.hold(1)
    worker.submit(later)
    assert not later.done.wait(0.3)
    worker.hold(-1)  # the first call returned
    assert later.done.wait(30) and worker.wait_idle(30)
    worker.stop()


def test_parallel_variants_compile_after_every_serial_one(held, monkeypatch):
    """Two large loops: both serial variants compile before either parallel one, so that
    every loop runs compiled as soon as can be."""
    monkeypatch.setattr(background, "needs_build", lambda source: True)  # none on disk
    x = np.linspace(-1, 1, PARALLEL_THRESHOLD)
    f = fg.jit(lambda x: (fnp.sum(fnp.exp(x) * x), fnp.sum(fnp.sin(x), keepdims=True) * x))
    f(x)
    if not all(step.parallel for step in kernel_steps(f)):
        pytest.skip("one thread: no parallel variant")
    assert [(j.label.split()[0], j.later) for j in held.jobs] == [
        ("serial", False),
        ("parallel", True),
    ] * (len(held.jobs) // 2)
    worker, ran = background._Worker(), []
    jobs = [Marker() for _ in range(4)]
    for k, job in enumerate(jobs):
        job.later, job.run = k % 2 == 1, lambda k=k, run=job.run: (ran.append(k), run())
    worker.hold(1)  # (a first call under way: nothing runs before all are queued)
    for job in jobs:
        worker.submit(job)
    worker.hold(-1)
    assert worker.wait_idle(30) and ran == [0, 2, 1, 3]
    worker.stop()


def test_loops_reducing_short_rows_get_no_parallel_variant(held, monkeypatch):
    """A large loop reducing rows shorter than codegen's SHORT_ROW (bench M4's logsumexp
    over (N, 8)) compiles its serial kernel only, whatever the thread count: a prange
    variant of it gained nothing on two cores and cost more to compile
    (executable.short_rows). A loop over long rows keeps both variants."""
    monkeypatch.setattr(executable, "numba_threads", lambda: 2)
    monkeypatch.setattr(background, "needs_build", lambda source: True)  # none on disk
    x = np.linspace(-1, 1, PARALLEL_THRESHOLD).reshape(-1, 8)
    expected = float(np.sum(np.log(np.sum(np.exp(x), axis=1))))
    f = fg.jit(lambda x: fnp.sum(fnp.logsumexp(x, axis=1)))
    np.testing.assert_allclose(f(x), expected, rtol=1e-12)
    assert kernel_steps(f) and not any(step.parallel for step in kernel_steps(f))
    assert {j.label.split()[0] for j in held.jobs} == {"serial"}
    del held.jobs[:]  # (compiled and run with 1 and 2 threads: test_determinism.py)
    g = fg.jit(lambda x: fnp.sum(fnp.logsumexp(x, axis=1)))
    np.testing.assert_allclose(g(x.reshape(-1, 64)), float(np.sum(np.log(np.sum(
        np.exp(x.reshape(-1, 64)), axis=1)))), rtol=1e-12)  # fmt: skip
    assert any(step.parallel for step in kernel_steps(g))
    assert "parallel" in {j.label.split()[0] for j in held.jobs}
    del held.jobs[:]


def test_a_large_loop_whose_kernel_is_on_disk_waits_for_it(monkeypatch, tmp_path, patient_watchdog):
    """Loading a kernel from disk costs less than a large loop on NumPy (the bounds are
    lowered here so that a small loop counts as large)."""
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fg.config, "compile", "background")
    x = np.linspace(0, 1, 50)
    fg.jit(lambda x: fnp.sum(fnp.cos(x) * 1.75)).compile(x)  # its kernel on disk
    monkeypatch.setattr(background, "LOAD_WORK", 1)
    monkeypatch.setattr(background, "IMPORT_WORK", 1)
    g = fg.jit(lambda x: fnp.sum(fnp.cos(x) * 1.75))
    np.testing.assert_allclose(g(x), np.sum(np.cos(x) * 1.75), rtol=1e-13)
    assert plan(g).compiled  # the first call ran the kernel
    # A kernel to build (no other test compiles it in this process): NumPy meanwhile.
    h = fg.jit(lambda x: fnp.sum(fnp.sinh(fnp.sin(x)) * 1.75))
    np.testing.assert_allclose(h(x), np.sum(np.sinh(np.sin(x)) * 1.75), rtol=1e-13)
    assert not plan(h).compiled
    assert background.wait_idle(timeout=120)


def test_numpy_writes_a_ufuncs_result_into_its_arena_buffer(held, monkeypatch, tmp_path):
    """A loop run on NumPy whose result has a buffer of the arena (a product reads it)
    computes it there (no copy after), in place of memory copied there; a reduction's
    result is still copied; the answers are the reference interpreter's."""
    from fastgrad.runtime import plan_steps

    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))  # nothing on disk
    copied = []
    copyto = np.copyto
    monkeypatch.setattr(
        plan_steps.np,
        "copyto",
        lambda dst, src, **k: copied.append(dst.shape) or copyto(dst, src, **k),
    )

    def f(x, w):
        h = fnp.tanh(x * 2.0 + 1.0) @ w
        return h @ fnp.sum(h * h, axis=0, keepdims=True).T

    x, w = np.linspace(-1, 1, 24).reshape(4, 6), np.linspace(0, 1, 30).reshape(6, 5)
    first = fg.jit(f)(x, w)
    np.testing.assert_allclose(first, fg.jit(f, fuse=False)(x, w), **TOL)
    assert copied == [(1, 5)]  # the column sums', not tanh's (4, 6)


def test_which_warm_first_calls_wait_at_the_measured_bounds(monkeypatch):
    """At the bounds measured (background.IMPORT_WORK), with every kernel on disk and Numba
    not imported yet: W1's loop (39 ops over 10^7 float64, run over blocks) waits for its
    kernel; W1 in float32, W2 (33 ops over 4096 x 1000) and W3 (23) run on NumPy."""
    monkeypatch.setattr(background, "needs_build", lambda source: False)
    monkeypatch.setattr(background.numba_load, "imported", lambda name: None)

    def waits(ops, shape, dtype, blocked=True):
        op = (np.sin, {}, [], np.dtype(dtype), -1)
        loop = SimpleNamespace(ops=[op] * ops, size=ops, blocked=object() if blocked else None)
        tier = background.KernelTier(loop, [SimpleNamespace(source="")], shape)
        return tier._loading_beats_numpy()

    assert waits(39, (10**7,), np.float64)
    assert not waits(39, (10**7,), np.float32)
    assert not waits(39, (10**6,), np.float64)
    assert not waits(33, (4096, 1000), np.float64, blocked=False)
    assert not waits(23, (4096, 1000), np.float64)


def test_a_long_scan_whose_body_kernel_is_on_disk_waits_for_it(
    monkeypatch, tmp_path, patient_watchdog
):
    """A scan's body kernel is small, but runs once per step: a scan with enough steps
    waits on its first call for a kernel on disk, a shorter one runs NumPy meanwhile (the
    bounds are set here so that 40 steps count as many and 4 as few)."""
    from fastgrad.runtime import control_flow

    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fg.config, "compile", "background")

    def loss(c, xs):
        return fg.scan(lambda c, x: (c + fnp.cos(x) * 1.25, c), c, xs)[1]

    xs = np.linspace(-1, 1, 80).reshape(40, 2)
    fg.jit(loss).compile(xs[0], xs)  # the body's kernel on disk
    bound = 10 * control_flow.STEP_WORK
    monkeypatch.setattr(background, "LOAD_WORK", bound)
    monkeypatch.setattr(background, "IMPORT_WORK", bound)
    expected = np.cumsum(np.cos(xs) * 1.25, axis=0)[:-1] + xs[0]
    for steps, waits in [(4, False), (40, True)]:
        f = fg.jit(loss)
        np.testing.assert_allclose(f(xs[0], xs[:steps])[1:], expected[: steps - 1], rtol=1e-12)
        assert [s.tier is None for s in body_kernel_steps(f)] == [waits]
    assert background.wait_idle(timeout=120)


def test_compile_and_warmup_wait_for_the_kernels(monkeypatch, patient_watchdog):
    monkeypatch.setattr(fg.config, "compile", "background")
    x = np.linspace(0, 1, 9)
    f = fg.jit(lambda x: fnp.sum(fnp.sin(x) ** 2)).compile(x)
    assert plan(f).compiled
    g = fg.warmup(lambda x: fnp.sum(fnp.log1p(x) * 2.0), x)
    assert plan(g).compiled
    np.testing.assert_allclose(g(x), np.sum(np.log1p(x) * 2.0), rtol=1e-14)


def test_a_loop_body_runs_on_numpy_until_settled(held):
    """A scan's body has its own plan with its own tiers: `compiled` looks into it, and
    `compile` (settle) waits for its kernels too."""

    def loss(w, xs):
        _, ys = fg.scan(lambda h, x: (fnp.tanh(h * w + x), fnp.sin(h) * x), 0.0 * w, xs)
        return fnp.sum(ys)

    w, xs = np.linspace(0.5, 1.0, 3), np.linspace(-1, 1, 12).reshape(4, 3)
    f = fg.jit(fg.value_and_grad(loss))
    expected = fg.jit(fg.value_and_grad(loss), fuse=False)(w, xs)
    first = f(w, xs)
    assert body_kernel_steps(f) and held.jobs
    assert not plan(f).compiled  # the bodies' kernels wait in the queue
    np.testing.assert_allclose(first[0], expected[0], **TOL)
    np.testing.assert_allclose(first[1], expected[1], **TOL)
    held.release()
    np.testing.assert_allclose(f(w, xs)[1], expected[1], **TOL)
    assert plan(f).compiled


def test_compile_waits_for_the_kernels_of_loop_bodies(monkeypatch):
    monkeypatch.setattr(fg.config, "compile", "background")
    xs = np.linspace(-1, 1, 10).reshape(5, 2)
    f = fg.jit(lambda c, xs: fg.scan(lambda c, x: (c + fnp.cos(x) * 2.5, c), c, xs)[1])
    f.compile(xs[0], xs)
    assert [s.tier for s in body_kernel_steps(f)] == [None] and plan(f).compiled
    expected = np.cumsum(np.cos(xs) * 2.5, axis=0)[:-1] + xs[0]
    np.testing.assert_allclose(f(xs[0], xs)[1:], expected, rtol=1e-12)


def test_sync_compiles_before_the_first_call_returns(monkeypatch):
    monkeypatch.setattr(fg.config, "compile", "sync")
    f = fg.jit(lambda x: fnp.sum(fnp.tanh(x) + 1.0))
    f(np.ones(5))
    assert plan(f).compiled and kernel_steps(f)[0].kernel is not None
    with pytest.raises(ValueError, match="background"):
        fg.config.update("compile", "later")


def program_and_inputs():
    return fst.programs().flatmap(
        lambda p: st.tuples(
            st.just(p), st.tuples(*(fst.arrays(s, np.float64, "real") for s in p.shapes))
        )
    )


@settings(max_examples=8)
@given(case=program_and_inputs())
def test_the_numpy_tier_agrees_with_the_kernels(case):
    program, xs = case
    argnums = tuple(range(len(xs)))

    def value_and_grads(*a):
        return fg.value_and_grad(lambda *b: fnp.sum(program(*b)), argnums=argnums)(*a)

    worker, mode, block = background._WORKER, fg.config.compile, numpy_blocks.BLOCK
    background._WORKER = HeldCompiles()
    try:
        fg.config.compile = "background"
        tiered = fg.jit(value_and_grads)(*xs)  # never released: all NumPy
        numpy_blocks.BLOCK = 2  # and again, blocks of a row or two (runtime.numpy_blocks)
        blocked = fg.jit(value_and_grads)(*xs)
    finally:
        background._WORKER = worker  # sync mode waits for the compile thread too
        numpy_blocks.BLOCK = block
    try:
        fg.config.compile = "sync"
        jitted = fg.jit(value_and_grads)
        compiled = jitted(*xs)
    finally:
        fg.config.compile = mode
    assert plan(jitted).compiled  # kernels ran, not NumPy after an overdue compile
    for numpy_tier in (tiered, blocked):
        np.testing.assert_allclose(numpy_tier[0], compiled[0], **TOL)
        for a, b in zip(numpy_tier[1], compiled[1], strict=True):
            np.testing.assert_allclose(a, b, **TOL)


def test_numpy_tier_fills_the_preallocated_buffers(held):
    """While a kernel compiles, NumPy computes its loop: the results must land in the
    buffers that views made once per call plan (a transpose here) look at."""

    def f(a, b):
        t = fnp.tanh(a) * 2 + 1
        return fnp.sum((t.T @ b) ** 2)

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((5, 4)), rng.standard_normal((5, 3))
    jf = fg.jit(fg.value_and_grad(f, argnums=(0, 1)))
    reference = fg.jit(fg.value_and_grad(f, argnums=(0, 1)), fuse=False)
    for scale in (1.0, -0.5):
        value, grads = jf(a * scale, b)
        assert held.jobs and not plan(jf).compiled  # still NumPy
        ref_value, ref_grads = reference(a * scale, b)
        np.testing.assert_allclose(value, ref_value, **TOL)
        for g, r in zip(grads, ref_grads, strict=True):
            np.testing.assert_allclose(g, r, **TOL)


def test_the_jobs_key_is_the_layouts_of_the_kernels_arguments(held, monkeypatch):
    """A kernel step keys its job by `layouts(env)`, worked out without allocating its
    fresh outputs: the layouts of the arguments the kernel would get, for every step
    (operands 0-d, raveled, transposed, read-only, float32 scalars, fresh outputs)."""
    submit, checked = background.KernelTier._submit, []

    def checking(tier, step, env, waiting):
        arguments = step.arguments(list(env))  # (it fills fresh outputs' slots: a copy)
        assert step.layouts(env) == tuple(map(background.layout, arguments))
        checked.append(step)
        return submit(tier, step, env, waiting)

    monkeypatch.setattr(background.KernelTier, "_submit", checking)
    w = np.linspace(-0.5, 0.5, 16).reshape(4, 4)

    def f(x, y, s):
        for _ in range(3):
            x = fnp.tanh(x @ w) * np.float32(1.25) + x * s
        return fnp.sum(x * y.T) + s * s, fnp.exp(x) * 2

    for dtype in (np.float64, np.float32):
        x = np.linspace(-1, 1, 12, dtype=dtype).reshape(3, 4)
        y = np.linspace(0, 1, 12, dtype=dtype).reshape(4, 3)
        y.flags.writeable = False
        jf = fg.jit(fg.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))
        jf(x, y, dtype(0.5))
    assert len(checked) > len(held.jobs)  # steps sharing jobs among those checked


LAZY_SCRIPT = """
import sys
import numpy as np
import fastgrad as fg, fastgrad.numpy as fnp
from fastgrad.runtime import background, numpy_blocks
from fastgrad.runtime.executable import numba_threads

imported = [m for m in ("numba", "scipy") if m in sys.modules]
assert not imported, f"import fastgrad imported {imported}"

class Held:  # the compile thread, which imports Numba, never starts
    def submit(self, job):
        pass

background._WORKER = Held()
assert fg.config.compile == "background"

def loss(x, y, key):
    noise = fg.random.normal(key, x.shape, x.dtype)
    return fnp.sum(fnp.tanh(x * y + fnp.sin(x)) * fnp.exp(-y * y) + 0.0 * noise)

x, y = np.linspace(-1, 1, 7), np.linspace(0, 2, 7)
value, (gx, gy) = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))(x, y, fg.random.key(0))
assert np.isclose(value, np.sum(np.tanh(x * y + np.sin(x)) * np.exp(-y * y)), rtol=1e-12)
# llvmlite's LLVM binding too, where the operating system describes the CPU
lazy = ("numba", "scipy", "llvmlite.binding") if sys.platform == "linux" else ("numba", "scipy")
imported = [m for m in lazy if m in sys.modules]
assert not imported, f"a first call on NumPy imported {imported}"
threads = numba_threads()
import numba
assert threads == numba.config.NUMBA_NUM_THREADS, (threads, numba.config.NUMBA_NUM_THREADS)
"""


@pytest.mark.parametrize("threads", [None, "1"])
def test_import_and_a_first_call_leave_numba_and_scipy_to_the_compile_thread(tmp_path, threads):
    # Importing either costs more than all of fastgrad: a first call that runs on NumPy
    # needs neither (the compile thread imports Numba; SciPy's functions import SciPy).
    unset = ("NUMBA_NUM_THREADS", "FASTGRAD_COMPILE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["FASTGRAD_CACHE_DIR"] = str(tmp_path)
    if threads:
        env["NUMBA_NUM_THREADS"] = threads
    run = [sys.executable, "-c", LAZY_SCRIPT]
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


EXIT_SCRIPT = """
import atexit
import numpy as np
import fastgrad as fg, fastgrad.numpy as fnp
from fastgrad.runtime import background, numpy_blocks

jobs = []
submit = background._WORKER.submit
background._WORKER.submit = lambda job: (jobs.append(job), submit(job))
# Registered before the compile thread's own exit handler, so it runs after it.
states = lambda: sorted({job.state for job in jobs if isinstance(job, background.Job)})
atexit.register(lambda: print("states:", states()))
fg.config.update("log_compiles", True)
x = np.linspace(0, 1, 11)
# Three kernels: the process exits while the first one compiles.
for fn in (fnp.tanh, fnp.cos, fnp.log1p):
    fg.jit(lambda x: fnp.sum(fn(x) * x + 2.5))(x)
"""


def test_kernels_dropped_at_exit_are_not_reported_as_failures(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FASTGRAD_COMPILE"}
    env["FASTGRAD_CACHE_DIR"] = str(tmp_path)
    run = [sys.executable, "-c", EXIT_SCRIPT]
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "dropped" in out.stdout, out.stdout  # the exit came while kernels waited
    assert "failed" not in out.stdout + out.stderr.lower(), (out.stdout, out.stderr)


KILLED_SCRIPT = """
import os, sys
import numpy as np
import fastgrad as fg, fastgrad.numpy as fnp
from fastgrad.compiler.kernel_cache import STATS

x = np.linspace(-1, 1, 50)
for name in ("tanh", "sin", "log1p", "cosh"):
    fn, ref = getattr(fnp, name), getattr(np, name)
    f = fg.jit(lambda x: fnp.sum(fn(x) * x + 0.5))
    if os.environ.get("FG_TEST_CHECK"):
        f.compile(x)  # waits for its kernels: they load (or compile again) and run
        assert np.allclose(f(x), np.sum(ref(x) * x + 0.5), rtol=1e-12), name
    else:
        f(x)  # on NumPy: the kernels compile in the background until the process is killed
print(STATS.cache_loads(), flush=True)
sys.stdin.read()
"""


def test_a_process_killed_while_compiling_leaves_a_usable_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FASTGRAD_COMPILE"}
    env["FASTGRAD_CACHE_DIR"] = str(tmp_path)
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT], env=env, **pipes)
    try:
        kernels = tmp_path / "kernels"
        deadline = time.monotonic() + 240
        # Killed once the first kernel is saved: the next one is being built (or written).
        while not (kernels.is_dir() and any(kernels.glob("*.nbm"))):
            assert proc.poll() is None and time.monotonic() < deadline, "no kernel was saved"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.communicate()
    env["FG_TEST_CHECK"] = "1"
    run = [sys.executable, "-c", KILLED_SCRIPT]
    out = subprocess.run(run, env=env, capture_output=True, text=True, input="", timeout=300)
    assert out.returncode == 0, out.stderr
    assert "CacheWarning" not in out.stderr
    assert int(out.stdout) >= 1  # what the killed process saved was loaded, not rebuilt
