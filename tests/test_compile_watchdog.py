"""The compile watchdog: a compile that outruns `config.compile_timeout` is reported once,
calls (waiting ones too) answer with NumPy meanwhile, and the kernel compiles in a
separate process, which can be stopped, in later runs.

A slow compile is a real compile held back by the test (an event it sets), on a compile
thread of the test's own, so no stuck state outlives a test.
"""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.kernel_cache import needs_build
from fastgrad.runtime import background, slow_kernels


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache, background mode and a compile thread of this test's own."""
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fg.config, "compile", "background")
    # Earlier tests' kernels finish first: a compile enters and leaves Numba's own
    # catch_warnings, which would reset the filters pytest.warns sets (not thread-safe).
    assert background.wait_idle(timeout=300)
    monkeypatch.setattr(background, "_WORKER", background._Worker())
    return tmp_path


def kernel_steps(jitted):
    (traced,) = jitted._cache.values()
    return [s for s in traced.executable.plan if hasattr(s, "tier")]


def wait_for(condition, seconds=60):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def held_compiles(monkeypatch):
    """Compiles held back until the returned event is set, and a 0.2 s timeout."""
    release = threading.Event()
    compile_kernel = background.compile_kernel

    def slow_compile(*args):
        release.wait(120)
        return compile_kernel(*args)

    monkeypatch.setattr(background, "compile_kernel", slow_compile)
    monkeypatch.setattr(fg.config, "compile_timeout", 0.2)
    return release


def test_an_overdue_compile_is_reported_and_numpy_keeps_answering(fresh, monkeypatch, capsys):
    release = held_compiles(monkeypatch)
    x = np.linspace(-1, 1, 7)
    f = fg.jit(lambda x: fnp.sum(fnp.sin(x) * 1.75))
    expected = np.sum(np.sin(x) * 1.75)
    np.testing.assert_allclose(f(x), expected, rtol=1e-14)  # NumPy, at once
    (step,) = kernel_steps(f)
    (job,) = step.tier.jobs
    wait_for(job.settled.is_set)  # the watchdog fired
    err = capsys.readouterr().err
    assert f"{job.label}, " in err and "lines of source, has run for" in err, err
    assert "(loop over (7,))" in job.label
    assert slow_kernels.recorded(job.source.source) == slow_kernels.SLOW
    with pytest.warns(RuntimeWarning, match=r"fastgrad_kernel_\w+ \(loop over \(7,\)\) has not"):
        np.testing.assert_allclose(f(x), expected, rtol=1e-14)
    np.testing.assert_allclose(f(x), expected, rtol=1e-14)  # warned once (warnings are errors)
    # A call told to wait (compile) for a kernel queued behind the overdue one returns.
    with pytest.warns(RuntimeWarning, match="has not finished within compile_timeout"):
        g = fg.jit(lambda x: fnp.sum(fnp.cos(x) * 2.25)).compile(x)
    np.testing.assert_allclose(g(x), np.sum(np.cos(x) * 2.25), rtol=1e-14)
    assert step.kernel is None and kernel_steps(g)[0].kernel is None  # both on NumPy
    monkeypatch.setattr(fg.config, "compile_timeout", 60.0)  # for the compiles to come
    release.set()  # the compile ends after all: calls switch to the kernels
    assert background.wait_idle(timeout=120)
    np.testing.assert_allclose(f(x), expected, rtol=1e-13)
    np.testing.assert_allclose(g(x), np.sum(np.cos(x) * 2.25), rtol=1e-13)
    assert step.kernel is not None and kernel_steps(g)[0].kernel is not None
    assert "has run for" not in capsys.readouterr().err  # reported once


def test_sync_mode_waits_for_a_compile_under_the_watchdog(fresh, monkeypatch, capsys):
    """FASTGRAD_COMPILE=sync waits for the kernel on the compile thread, so a compile that
    outruns the timeout leaves the call on NumPy with a warning naming the kernel instead
    of blocking it."""
    monkeypatch.setattr(fg.config, "compile", "sync")
    release = held_compiles(monkeypatch)
    x = np.linspace(-1, 1, 6)
    f = fg.jit(lambda x: fnp.sum(fnp.tan(x) * 1.25))
    expected = np.sum(np.tan(x) * 1.25)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"fastgrad_kernel_\w+ \(loop over \(6,\)\) has not"):
        np.testing.assert_allclose(f(x), expected, rtol=1e-14)  # NumPy, once overdue
    assert time.monotonic() - start < 60
    (step,) = kernel_steps(f)
    assert step.kernel is None and "has run for" in capsys.readouterr().err
    monkeypatch.setattr(fg.config, "compile_timeout", 60.0)
    release.set()  # the compile ends after all: the next call runs the kernel
    assert background.wait_idle(timeout=120)
    np.testing.assert_allclose(f(x), expected, rtol=1e-13)
    assert step.kernel is not None and step.tier is None


FORKED = textwrap.dedent(
    """
    import os, numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.runtime import background

    x = np.linspace(-1, 1, 5)
    fg.jit(lambda x: fnp.sum(fnp.sin(x) * 0.5)).compile(x)  # the parent's compile thread
    # A job queued in the parent and not compiled there (as if behind a long compile).
    worker = background._WORKER
    worker.submit = lambda job: worker.inflight.setdefault(job)
    h = fg.jit(lambda x: fnp.sum(fnp.exp(x) * 0.25))
    h(x)  # background mode: NumPy answers, the job waits
    del worker.submit
    fg.config.update("compile", "{mode}")
    pid = os.fork()
    if pid == 0:  # the child has no compile thread: a new one must start
        g = fg.jit(lambda x: fnp.sum(fnp.cos(x) * 3.5))
        ok = abs(g(x) - np.sum(np.cos(x) * 3.5)) < 1e-12
        ok = ok and background.wait_idle(120)  # the child's compile thread runs its jobs
        ok = ok and abs(g(x) - np.sum(np.cos(x) * 3.5)) < 1e-12
        (traced,) = g._cache.values()
        h.compile(x)  # waits for the job the parent had queued
        (held,) = h._cache.values()
        ok = ok and traced.executable.compiled and held.executable.compiled
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("mode", ["sync", "background"])
def test_a_forked_child_compiles_with_a_thread_of_its_own(mode, tmp_path):
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(tmp_path), FASTGRAD_COMPILE="background")
    run = [sys.executable, "-c", FORKED.replace("{mode}", mode)]
    try:
        out = subprocess.run(run, capture_output=True, text=True, timeout=240, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the forked child hung waiting for its compile (killed after 240 s)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"], out.stderr


def recorded_kernel(f, x, state):
    """Record the kernel of f's first call as `state` without compiling it."""
    held = []
    background._WORKER.submit, submit = held.append, background._WORKER.submit
    try:
        f(x)
    finally:
        background._WORKER.submit = submit
    (job,) = [job for job in held if isinstance(job, background.Job)]  # (not adapters)
    slow_kernels.record(job.source.source, state, job.label, 61.0)
    return job.source.source


def test_a_kernel_recorded_slow_compiles_in_a_separate_process(fresh):
    x = np.linspace(0, 2, 9)

    def loss(x):  # ops no other test combines: its kernel is compiled in no process yet
        return fnp.sum(fnp.log1p(x) * fnp.arctan(x) - fnp.expm1(x))

    source = recorded_kernel(fg.jit(loss), x, slow_kernels.SLOW)
    f = fg.jit(loss).compile(x)  # waits for the child
    (step,) = kernel_steps(f)
    assert step.kernel is not None and not needs_build(source)
    assert sum(step.kernel.stats.cache_misses.values()) == 0  # loaded here, built there
    expected = np.sum(np.log1p(x) * np.arctan(x) - np.expm1(x))
    np.testing.assert_allclose(f(x), expected, rtol=1e-13)


def test_a_separate_compile_past_its_bound_is_stopped_and_recorded_hung(fresh, monkeypatch):
    x = np.linspace(0, 2, 9)
    source = recorded_kernel(fg.jit(lambda x: fnp.sum(fnp.expm1(x) * 0.5)), x, slow_kernels.SLOW)
    monkeypatch.setattr(fg.config, "compile_timeout", 0.001)  # no process starts that fast
    monkeypatch.setattr(slow_kernels, "APART_FACTOR", 1)
    with pytest.warns(RuntimeWarning, match="ran past .* in a separate process, which was stopped"):
        f = fg.jit(lambda x: fnp.sum(fnp.expm1(x) * 0.5)).compile(x)
    assert slow_kernels.recorded(source) == slow_kernels.HUNG
    np.testing.assert_allclose(f(x), np.sum(np.expm1(x) * 0.5), rtol=1e-14)  # NumPy
    # A later run does not try again: its loop runs with NumPy, and says so.
    with pytest.warns(RuntimeWarning, match="hung in an earlier run"):
        g = fg.jit(lambda x: fnp.sum(fnp.expm1(x) * 0.5)).compile(x)
    np.testing.assert_allclose(g(x), np.sum(np.expm1(x) * 0.5), rtol=1e-14)
    assert kernel_steps(g)[0].kernel is None
    # The stopped child left the cache usable: another kernel compiles and runs.
    monkeypatch.setattr(fg.config, "compile_timeout", 60.0)
    h = fg.jit(lambda x: fnp.sum(fnp.expm1(x) * fnp.exp(x))).compile(x)
    assert kernel_steps(h)[0].kernel is not None
    np.testing.assert_allclose(h(x), np.sum(np.expm1(x) * np.exp(x)), rtol=1e-13)


TWO_PROCESSES = textwrap.dedent(
    """
    import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.compiler.kernel_cache import STATS

    x = np.linspace(-1, 1, 40)
    f = fg.jit(fg.grad(lambda x: fnp.sum(fnp.arctan(x) * fnp.exp(-x * 0.75))))
    f.compile(x)  # waits for its kernel: built here, or loaded if the other saved it first
    (traced,) = f._cache.values()
    assert traced.executable.compiled
    expected = (1 / (1 + x * x) - 0.75 * np.arctan(x)) * np.exp(-x * 0.75)
    np.testing.assert_allclose(f(x), expected, rtol=1e-12)
    print(STATS.numba_compiles(), STATS.cache_loads())
    """
)


def test_two_processes_compiling_one_kernel_at_once_both_run_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FASTGRAD_COMPILE"}
    env["FASTGRAD_CACHE_DIR"] = str(tmp_path)
    run = [sys.executable, "-c", TWO_PROCESSES]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    children = [subprocess.Popen(run, env=env, **pipes) for _ in range(2)]
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        assert "CacheWarning" not in err
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]  # a third process loads what they saved


def test_compile_timeout_setting():
    with pytest.raises(ValueError, match="compile_timeout takes seconds > 0"):
        fg.config.update("compile_timeout", 0)
    with pytest.raises(ValueError, match="compile_timeout"):
        fg.config.update("compile_timeout", "soon")
    # locks and timers raise OverflowError beyond TIMEOUT_MAX (a fork hook would fail)
    for endless in (float("inf"), threading.TIMEOUT_MAX * 2):
        with pytest.raises(ValueError, match="compile_timeout takes seconds > 0 and <="):
            fg.config.update("compile_timeout", endless)
    assert fg.config.compile_timeout == 60.0  # the default (the suite leaves it)


def test_sync_mode_waits_for_an_adapter_under_the_watchdog(fresh, monkeypatch, capsys):
    """The plan interpreter's adapters compile on the compile thread in sync mode too: one
    that outruns the timeout leaves the plan's steps running one by one, not the call
    blocked; it is not recorded as a slow kernel (adapters never compile apart), and the
    message does not promise that."""
    from fastgrad.runtime import adapters

    x = np.linspace(-1, 2, 8)

    def loss(x):
        return fnp.sum(fnp.arcsinh(x) * 0.875)

    fg.jit(loss).compile(x)  # its kernel, ready in memory
    monkeypatch.setattr(adapters, "_JOBS", {})  # the adapters build again
    release, threads = threading.Event(), []
    compile_adapter = adapters.compile_adapter

    def slow_adapter(*args):
        threads.append(threading.current_thread().name)
        release.wait(120)
        return compile_adapter(*args)

    monkeypatch.setattr(adapters, "compile_adapter", slow_adapter)
    monkeypatch.setattr(fg.config, "compile", "sync")
    monkeypatch.setattr(fg.config, "compile_timeout", 1.0)
    f = fg.jit(loss)
    start = time.monotonic()
    for _ in range(3):  # the run that settles the kernels, then those that would lower
        np.testing.assert_allclose(f(x), np.sum(np.arcsinh(x) * 0.875), rtol=1e-13)
    assert time.monotonic() - start < 60
    assert threads == ["fastgrad-compile"]
    (job,) = [j for key, j in adapters._JOBS.items() if isinstance(key, str)]
    assert job.settled.is_set() and not job.done.is_set()
    err = capsys.readouterr().err
    assert "has run for" in err and "plans run step by step" in err
    assert "separate process" not in err
    assert slow_kernels.recorded(job.source.source) is None
    release.set()
    assert background.wait_idle(timeout=120)


def test_an_overdue_load_of_stored_code_says_what_follows(capsys):
    """A load of stored machine code (runtime.native_plan.Load) that outruns the timeout
    is not a compile of an adapter: the warning neither says plans run step by step nor
    that a kernel compiles apart next time, and the load is not recorded as slow."""
    from types import SimpleNamespace

    from fastgrad.runtime import native_plan

    source = "def kernel(a0):\n    a0[0] = 1.0\n"
    job = native_plan.Load(SimpleNamespace(source=source), (0, [], [(1, "float64")]))
    background._Worker()._overdue(job, time.perf_counter() - 99.0)
    err = capsys.readouterr().err
    assert "has run for" in err and "no compile" in err, err
    assert "step by step" not in err and "separate process" not in err, err
    assert job.settled.is_set() and slow_kernels.recorded(source) is None
