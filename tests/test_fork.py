"""A process that ran a parallel kernel can fork: a child, a fork-based multiprocessing
pool, and threads running parallel kernels at once all work.

Before, Numba ran parallel kernels on GNU OpenMP: the forked child died ("fork() called
from a process already using GNU OpenMP, this is unsafe") and the pool hung for ever.
fastgrad now has Numba use TBB (runtime.threading_layer). Each program runs in a
subprocess with a timeout, so that a hang fails the test instead of blocking the suite.
"""

import os
import subprocess
import sys
import textwrap

import pytest

SETUP = textwrap.dedent(
    """
    import os, sys, numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.runtime.executable import PARALLEL_THRESHOLD
    from fastgrad.runtime.threading_layer import active_layer

    f = fg.jit(fg.value_and_grad(lambda x: fnp.sum(fnp.exp(x * 0.5) * x)))
    x = np.linspace(-1.0, 1.0, 2 * PARALLEL_THRESHOLD)
    expected = f(x)
    layer = active_layer()
    assert layer is not None, "no parallel kernel ran"

    def same(result, reference):
        return all(np.array_equal(a, b) for a, b in zip(result, reference))
    """
)

FORK = """
pid = os.fork()
if pid == 0:
    os._exit(0 if same(f(x), expected) else 3)
_, status = os.waitpid(pid, 0)
print(layer, os.waitstatus_to_exitcode(status))
"""

POOL = """
import multiprocessing

def work(i):
    return f(x + i)

with multiprocessing.get_context("fork").Pool(2) as pool:
    results = pool.map(work, range(4))
print(layer, sum(not same(r, f(x + i)) for i, r in enumerate(results)))
"""

THREADS = """
from concurrent.futures import ThreadPoolExecutor

with ThreadPoolExecutor(3) as pool:
    results = list(pool.map(lambda i: f(x + i), range(12)))
print(layer, sum(not same(r, f(x + i)) for i, r in enumerate(results)))
"""


def run(program: str, layer: str | None = None) -> tuple[str, int]:
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    env.pop("NUMBA_THREADING_LAYER", None)
    if layer is not None:  # the user's choice, which fastgrad leaves alone
        env["NUMBA_THREADING_LAYER"] = layer
    try:
        out = subprocess.run(
            [sys.executable, "-c", SETUP + program],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the program hung (killed after 240 s)")
    assert out.returncode == 0, out.stderr[-3000:]
    layer, failures = out.stdout.split()[-2:]
    return layer, int(failures)


@pytest.mark.parametrize("program", [FORK, POOL, THREADS], ids=["fork", "fork pool", "threads"])
def test_after_a_parallel_kernel(program):
    layer, failures = run(program)
    assert failures == 0
    assert layer == "tbb"


WARNED = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
os.waitpid(pid, 0)
print(layer, sum("GNU OpenMP" in str(w.message) for w in caught))
"""


def test_a_fork_after_openmp_warns():
    """Where parallel kernels ran on GNU OpenMP (the user chose it), a fork warns first,
    and says what to do."""
    assert run(WARNED, layer="omp") == ("omp", 1)


def test_a_fork_imports_no_numba():
    """A fork of a process that has not imported Numba leaves it so (the before-fork
    check of the threading layer asked Numba: ~0.15 s, what the native path avoids)."""
    program = textwrap.dedent(
        """
        import os, sys, numpy as np, fastgrad as fg, fastgrad.numpy as fnp
        import fastgrad.runtime.threading_layer
        assert "numba" not in sys.modules
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print("numba", "numba" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "numba False", out.stdout + out.stderr
