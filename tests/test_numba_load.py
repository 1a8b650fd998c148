"""Numba's import on the compile thread (runtime.numba_load): no SciPy linear algebra
package, no registries (nor SciPy at all) where kernels load from disk, vector math built
for the float type in use only, Numba's own BLAS left as it was for
a user's functions, and an import that pauses for first calls but never for a thread
waiting on it or a fork.

Each test runs fresh processes (the load happens once per process): ~25-40 s in all on
the loaded 2-core machine (one kernel compiled).
"""

import os
import subprocess
import sys
import threading

import pytest

SCRIPT = """
import sys
import numpy as np
import fastgrad as fg, fastgrad.numpy as fnp

x = np.linspace(-1.0, 1.0, 101)
f = fg.jit(lambda x: fnp.sum(fnp.tanh(x) * x + 0.5))
fg.warmup(f, x)  # Numba imported, registries loaded, the kernel compiled or loaded
assert np.isclose(f(x), np.sum(np.tanh(x) * x + 0.5), rtol=1e-12)
from fastgrad.runtime import numba_load

assert numba_load._done
assert "scipy.linalg" not in sys.modules, "the registry load imported scipy.linalg"
from fastgrad.compiler import kernel_cache

if not kernel_cache.STATS.numba_compiles():  # loaded from disk: no typing or lowering
    assert "numba.np.arraymath" not in sys.modules, "a load from disk loaded the registries"
    # nor Numba's array module, whose functions' environments the kernel refers to
    assert "numba.np.arrayobj" not in sys.modules, "a load from disk imported arrayobj"
    from numba.core.runtime import rtsys

    assert rtsys._init  # Numba's runtime, its functions loaded from fastgrad's cache
    # nor SciPy: Numba's import checks its version by importing it, but not on this thread
    assert "scipy" not in sys.modules, "a warm process imported scipy"
    assert "numpy.ma" not in sys.modules, "Numba's type of an array imported numpy.ma"
# vector math of the float type in use only; the other's when first asked for
from fastgrad.compiler.codegen import vecmath

assert set(vecmath._BUILT) == {"float64"}, set(vecmath._BUILT)
from fastgrad.compiler.codegen.vecmath import power_f32, tanh_f32

assert vecmath.FUNCTIONS["tanh", "float32"] is tanh_f32
assert vecmath.FUNCTIONS["power", "float32"] is power_f32
assert len(vecmath.FUNCTIONS) == 28 and len(vecmath.BOUNDED_TRIG) == 6
print(repr(float(f(x))), repr(float(fg.jit(f.fun, fuse=False)(x))))

import numba
from numba.np import arraymath, linalg

# Numba's check is back, and found BLAS: np.dot in a user's function calls SciPy's BLAS.
assert linalg.ensure_blas is not numba_load.blas_found
assert arraymath.ensure_blas is linalg.ensure_blas
assert arraymath._HAVE_BLAS


@numba.njit
def dot(a, b):
    return np.dot(a, b)


a, b = np.arange(12.0).reshape(3, 4), np.arange(4.0)
assert np.array_equal(dot(a, b), a @ b)
assert "scipy.linalg.cython_blas" in sys.modules  # imported by Numba's helper, when called
# numpy.ma imported later: Numba's typing rejects masked arrays as before
masked = np.ma.masked_array([1.0, 2.0], mask=[0, 1])
try:
    numba.typeof(masked)
except numba.core.errors.NumbaTypeError as error:
    assert "MaskedArray" in str(error)
else:
    raise AssertionError("a masked array typed")
print("ok")
"""


def test_the_compile_thread_loads_numba_without_scipy_linalg(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FASTGRAD_COMPILE"}
    env["FASTGRAD_CACHE_DIR"] = str(tmp_path)
    env["FASTGRAD_NATIVE"] = "0"  # (else a warm process runs its stored kernel without Numba)
    values = []
    for _ in range(2):  # compiled into an empty cache, then loaded from it
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr
        *printed, last = out.stdout.split()
        assert last == "ok", out.stdout
        values.append(printed)
    # the kernel loaded (its environments rebuilt without their modules) gives the bits of
    # the one compiled; both agree with the reference interpreter
    (compiled, reference), (loaded, reference_again) = values
    assert compiled == loaded and reference == reference_again
    assert abs(float(compiled) - float(reference)) <= 1e-12 * abs(float(reference))


def test_blas_found_agrees_with_importing_scipy_blas():
    code = (
        "from fastgrad.runtime.numba_load import blas_found; blas_found(); "
        "import scipy.linalg.cython_blas; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


PAUSED = """
import sys, threading, time
from fastgrad.runtime import numba_load

paused = threading.Event()
release = threading.Event()

def pause(timeout):  # a first call that never ends, as far as the load knows
    paused.set()
    return not release.wait(timeout)

loader = threading.Thread(target=numba_load.load, args=(pause,), daemon=True)
loader.start()
assert paused.wait(60)
time.sleep(0.5)
assert numba_load.imported("numba") is None, "the load went on while paused"
assert not numba_load._done
if sys.argv[1] == "import":  # this thread needs a module the paused load holds
    import numba  # waits for the load, which must go on
    assert numba_load.imported("numba") is numba
    release.set()  # the rest of the load (fastgrad's kernel support) pauses again till now
elif sys.argv[1] == "fork":  # a fork waits for the load, which must go on
    assert numba_load.before_fork(timeout=120)
    numba_load.after_fork()
    assert numba_load._done
else:  # the first call ends
    release.set()
loader.join(240)
assert numba_load._done and not loader.is_alive()
print("ok")
"""


def test_a_paused_load_goes_on_for_a_thread_importing_numba_and_for_a_fork():
    for case in ("import", "fork", "release"):
        run = [sys.executable, "-c", PAUSED, case]
        out = subprocess.run(run, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (case, out.stderr)
        assert out.stdout.strip() == "ok", (case, out.stdout)


def test_scipy_is_hidden_only_from_the_thread_importing_numba():
    """Numba's import on the compile thread finds no SciPy (its version check then imports
    nothing); another thread importing SciPy meanwhile finds it."""
    from fastgrad.runtime import numba_load

    finder = numba_load._NoSciPy()
    with pytest.raises(ModuleNotFoundError):
        finder.find_spec("scipy", None)
    assert finder.find_spec("scipy.special", None) is None
    assert finder.find_spec("numpy", None) is None
    found = []
    other = threading.Thread(target=lambda: found.append(finder.find_spec("scipy", None)))
    other.start()
    other.join()
    assert found == [None]  # left to the finders after it


def test_the_plan_interpreters_jobs_load_numba_paused_on_the_compile_thread(monkeypatch):
    """An interpreter job may be the first to need Numba (a plan of products only): on the
    compile thread its load pauses for first calls like a kernel job's; on a caller's
    thread (an inline job) it never pauses, which would wait for its own first call."""
    from fastgrad.runtime import adapters, background, numba_load

    pauses = []
    monkeypatch.setattr(numba_load, "load", lambda pause=None: pauses.append(pause))
    job = adapters.CompileJob("a test's job", "no source", lambda: (None, 0))
    background.submit(job)
    background.wait_for(job)
    assert job.done.is_set() and job.error is None
    background.load_numba()
    assert len(pauses) == 2 and pauses[0] is not None and pauses[1] is None
