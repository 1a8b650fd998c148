"""Numba's import and first registry load, done once by the compile thread before its
first job, without importing SciPy's linear algebra package.

Numba's first compile (or first load of cached machine code) imports its lowering
registries; one of them (numba.np.arraymath) checks at import that SciPy's BLAS is there
by importing `scipy.linalg.cython_blas`, which imports all of `scipy.linalg` (and, through
SciPy's array API layer, NumPy's lazily loaded submodules such as f2py): 0.36-0.54 s of
a warm process's 1.1-1.4 s before its first kernel ran, on the 2-core development
machine. No kernel of fastgrad calls Numba's BLAS (runtime.blas calls NumPy's OpenBLAS).
`load()` runs that registry load with the check answered by looking for the extension
module's file instead (and Numba's own check of its integer width, which reads only
`scipy.__config__`); Numba's BLAS helpers import `scipy.linalg.cython_blas` themselves
when a user's function first calls one (numba/_lapack.c), so `np.dot` in a user's own
Numba function behaves as before. The original check is put back once the load is done.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
from pathlib import Path

_LOCK = threading.Lock()
_done = False


def blas_found() -> None:
    """Numba's `ensure_blas` without the import: ImportError unless SciPy ships the
    `scipy.linalg.cython_blas` extension module; Numba's check of the BLAS integer width
    (RuntimeError if SciPy's differs from the one Numba was built for) as before."""
    spec = importlib.util.find_spec("scipy")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("scipy 0.16+ is required for linear algebra")
    folder = Path(next(iter(spec.submodule_search_locations))) / "linalg"
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    if not any((folder / f"cython_blas{suffix}").is_file() for suffix in suffixes):
        raise ImportError("scipy 0.16+ is required for linear algebra")
    from numba.np import linalg

    linalg._check_lapack_int_width()


def load() -> None:
    """Import Numba and load its registries (once per process; later calls return at
    once). Numba's compiler lock is held meanwhile, as a compile holds it around its own
    first load, so that no other thread's compile sees the check replaced."""
    global _done
    if _done:
        return
    with _LOCK:
        if _done:
            return
        import numba  # noqa: F401  (its import is most of the cost; TBB chosen before)

        if "numba.np.arraymath" not in sys.modules:  # else loaded already: nothing to spare
            from numba.core.compiler_lock import global_compiler_lock
            from numba.core.registry import cpu_target
            from numba.np import linalg

            original = linalg.ensure_blas
            linalg.ensure_blas = blas_found
            try:
                with global_compiler_lock:
                    cpu_target.target_context.refresh()
            finally:
                linalg.ensure_blas = original
                arraymath = sys.modules.get("numba.np.arraymath")
                if getattr(arraymath, "ensure_blas", None) is blas_found:
                    arraymath.ensure_blas = original
        _done = True
