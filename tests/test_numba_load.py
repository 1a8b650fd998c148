"""Numba's import and first registry load on the compile thread (runtime.numba_load): no
SciPy linear algebra package, and Numba's own BLAS left as it was for a user's functions.

Each test runs a fresh process (the load happens once per process): ~5-15 s in all
(one kernel compiled).
"""

import os
import subprocess
import sys

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
print("ok")
"""


def test_the_compile_thread_loads_numba_without_scipy_linalg(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FASTGRAD_COMPILE"}
    env["FASTGRAD_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok", out.stdout


def test_blas_found_agrees_with_importing_scipy_blas():
    code = (
        "from fastgrad.runtime.numba_load import blas_found; blas_found(); "
        "import scipy.linalg.cython_blas; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
