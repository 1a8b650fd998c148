"""A fork while the compile thread holds Numba's compiler lock (runtime.compile_fork): the
fork waits for that compile, so the child compiles at once rather than wait for a lock no
thread of its own holds until the watchdog gives up; after a compile the watchdog found
overdue, the fork does not wait, and the child's calls go on with NumPy at once, saying why
(and its own forks do not wait for the lock either).

Each case runs in a process of its own (~5-15 s each, a few kernels compile in it).
"""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, threading, time, warnings
    import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.runtime import background

    x = np.linspace(-1, 2, 5)
    fg.jit(lambda x: fnp.sum(fnp.sin(x) * 0.5)).compile(x)  # Numba imported, thread up
    from numba.core.compiler_lock import global_compiler_lock

    inside, compile_kernel = threading.Event(), background.compile_kernel

    def slow_compile(*args):  # a compile that holds Numba's lock for {hold} s
        with global_compiler_lock:
            inside.set()
            time.sleep({hold})
            return compile_kernel(*args)

    background.compile_kernel = slow_compile
    fg.jit(lambda x: fnp.sum(fnp.exp(x) * 0.25))(x)  # NumPy answers; its job compiles
    assert inside.wait(60)
    fg.config.update("compile_timeout", {timeout})
    time.sleep({pause})
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        background.compile_kernel = compile_kernel
        fg.config.update("compile", "sync")
        g = fg.jit(lambda x: fnp.sum(fnp.cos(x) * 3.5))
        start = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            right = abs(g(x) - np.sum(np.cos(x) * 3.5)) < 1e-12
        seconds = time.monotonic() - start
        (traced,) = g._cache.values()
        said = " | ".join(str(w.message) for w in caught)
        fg.config.update("compile_timeout", 60.0)
        start = time.monotonic()
        grandchild = os.fork()  # waits for no compile, even with Numba's lock stale
        if grandchild == 0:
            os._exit(0)
        os.waitpid(grandchild, 0)
        quick = time.monotonic() - start < 30
        print(right, traced.executable.compiled, seconds < {timeout} / 2, quick, said, flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), round(time.monotonic() - start, 1))
    """
)


def python(script, tmp_path):
    """What `script` printed, run in a process of its own with compiles in the background."""
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(tmp_path), FASTGRAD_COMPILE="background")
    try:
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the script hung (killed after 300 s)")
    assert out.returncode == 0, out.stderr
    return out.stdout


def run(hold, timeout, pause, tmp_path):
    script = SCRIPT.format(hold=hold, timeout=timeout, pause=pause)
    child, parent = python(script, tmp_path).splitlines()
    return child, parent.split()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_waits_for_the_compile_holding_numbas_lock(tmp_path):
    child, (status, seconds) = run(hold=2.0, timeout=60.0, pause=0.0, tmp_path=tmp_path)
    assert status == "0"
    # right, compiled, well within time; the child's own fork is quick
    assert child.startswith("True True True True"), child
    assert float(seconds) >= 1.0  # the fork waited for the parent's compile


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_after_an_overdue_compile_leaves_the_child_on_numpy(tmp_path):
    # The compile holds the lock for 8 s; the watchdog finds it overdue after 1 s.
    child, (status, _) = run(hold=8.0, timeout=1.0, pause=1.5, tmp_path=tmp_path)
    assert status == "0"
    assert child.startswith("True False True True"), child  # right, on NumPy, at once
    assert "forked while a compile in its parent held Numba's compiler lock" in child


LOGGING_SCRIPT = textwrap.dedent(
    """
    import os, threading, time
    import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.runtime import background

    x = np.linspace(-1, 2, 5)
    fg.jit(lambda x: fnp.sum(fnp.sin(x) * 0.5)).compile(x)  # Numba imported, thread up
    from numba.core.compiler_lock import global_compiler_lock

    inside, compile_kernel = threading.Event(), background.compile_kernel

    def compile_that_logs(*args):  # as Numba's passes do on a first compile
        import logging  # here: imported before fastgrad's hook, it would be harmless

        with global_compiler_lock:
            inside.set()
            time.sleep(1.0)
            logging.getLogger("numba.core.a_pass").debug("a first debug call")
            return compile_kernel(*args)

    background.compile_kernel = compile_that_logs
    fg.config.update("compile_timeout", 20.0)
    fg.jit(lambda x: fnp.sum(fnp.exp(x) * 0.25))(x)
    assert inside.wait(60)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        print(background._WORKER.stale, flush=True)
        os._exit(0)
    seconds = time.monotonic() - start
    os.waitpid(pid, 0)
    print(round(seconds, 1))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_does_not_hold_loggings_lock_while_waiting_for_a_compile(tmp_path):
    # logging's own fork hook takes its module lock; run before ours, it made the fork
    # and a compile that logs wait on each other until compile_timeout, and the child
    # inherited Numba's lock held (stale)
    stale, seconds = python(LOGGING_SCRIPT, tmp_path).split()
    assert stale == "False" and float(seconds) < 10, (stale, seconds)


ENTRY_SCRIPT = textwrap.dedent(
    """
    import threading, time
    import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.runtime import background

    x = np.linspace(-1, 2, 5)
    g = fg.jit(lambda x: fnp.tanh(x) * 3.0 + 1.0)
    g(x)  # on NumPy; its kernel compiles in the background
    assert background.wait_idle(120)
    from numba.core.compiler_lock import global_compiler_lock

    held, done = threading.Event(), threading.Event()

    def hold():  # a compile that never ends, as far as this test runs
        with global_compiler_lock:
            held.set()
            done.wait(60)

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(10)
    start = time.monotonic()
    right = all(np.allclose(g(x), np.tanh(x) * 3 + 1) for _ in range(3))
    print(right, round(time.monotonic() - start, 1), flush=True)
    done.set()
    """
)


def test_a_call_finding_its_kernels_compiled_waits_for_no_compile(tmp_path):
    # the plan's lowering asked Numba to compile a signature it had, which takes Numba's
    # compiler lock: on the calling thread, behind whatever compile held it
    right, seconds = python(ENTRY_SCRIPT, tmp_path).split()
    assert right == "True" and float(seconds) < 20, (right, seconds)


LOAD_SCRIPT = textwrap.dedent(
    """
    import os, threading, time, warnings
    import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.runtime import background, numba_load

    loading, load = threading.Event(), numba_load._load

    def slow_load():  # Numba's import on the compile thread, taking its time
        loading.set()
        time.sleep(3.0)
        load()

    numba_load._load = slow_load
    fg.config.update("compile_timeout", 0.2)
    x = np.linspace(-1, 2, 5)
    fg.jit(lambda x: fnp.sum(fnp.sin(x) * 0.5))(x)  # NumPy answers; the thread loads
    assert loading.wait(60)
    pid = os.fork()  # waits 0.2 s for the load, then forks with its lock held
    if pid == 0:
        fg.config.update("compile", "sync")
        g = fg.jit(lambda x: fnp.sum(fnp.cos(x) * 3.5))
        start = time.monotonic()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            right = abs(g(x) - np.sum(np.cos(x) * 3.5)) < 1e-12
        print(background._WORKER.stale, right, round(time.monotonic() - start, 1), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_amid_numbas_import_leaves_the_child_on_numpy(tmp_path):
    # The child inherits the import's lock held by a thread it does not have: its own
    # load would wait for ever, each sync call for the watchdog.
    stale, right, seconds = python(LOAD_SCRIPT, tmp_path).split()
    assert (stale, right) == ("True", "True") and float(seconds) < 0.2, (stale, seconds)
