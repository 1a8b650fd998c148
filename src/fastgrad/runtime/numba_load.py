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

The compile thread runs this load before its first job, after a first call has
returned (runtime.background); importing holds the GIL most of the time, and beside a
first call running on NumPy (many short GIL-free calls) each NumPy call waited for it (a
warm first call ran 3-5x slower), so the load also pauses between two modules while
`pause` says a first call is under way (one of another function, say), unless another
thread waits for a module it is importing (`importlib._bootstrap._blocking_on`), or a
fork waits for it. Started at `jit()` instead (measured, not kept): in the bench, whose
first call follows `jit()` at once, time to steady state did not change beyond the noise,
and the import beside the first call's tracing made first calls 30-100% longer.
A fork waits for a load under way (`before_fork`): a child inheriting a half-imported
Numba, its module locks held by a thread it does not have, would hang at its first import.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Held while a thread imports and loads Numba (and by a fork, `before_fork`): a forked
# child finds it held by a thread it does not have if the fork's wait timed out, and its
# own load would wait for ever (runtime.compile_fork.holds_stale_lock).
LOCK = threading.Lock()
_done = False
_forking = threading.Event()  # set while a fork waits for the load under way
# `pause(timeout)`: wait, at most `timeout` seconds, while a first call runs; whether it
# still does (then the load waits on).
Pause = Callable[[float], bool]
POLL = 0.01  # seconds between two looks at threads waiting for an import


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

    check = getattr(linalg, "_check_lapack_int_width", None)  # (Numba 0.68's)
    if check is not None:
        check()


def extension(name: str) -> Any:
    """Numba's extension module `name` ("numba._helperlib", say), loaded from its file on
    its own, without the numba package's import (ImportError where there is none). Taken
    out of sys.modules again unless it was there: Numba's import then loads it as ever,
    and CPython hands it the module it initialised once (its single-phase init's copy:
    the same attributes, one copy of the C state)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("numba")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("numba is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    stem = root.joinpath(*name.split(".")[1:])
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    paths = [path for s in suffixes if (path := Path(f"{stem}{s}")).is_file()]
    if not paths:
        raise ImportError(f"{name} not found under {root}")
    module_spec = importlib.util.spec_from_file_location(name, paths[0])
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    sys.modules.pop(name, None)
    return module


def imported(name: str) -> Any:
    """The module `name` if it is imported, not only under way (the compile thread's
    load may be paused in the middle of Numba's import), else None.

    >>> imported("sys") is sys, imported("no_such_module")
    (True, None)
    """
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return None if getattr(spec, "_initializing", False) else module


def load(pause: Pause | None = None) -> None:
    """Import Numba and what kernels and the plan interpreter import (once per process;
    later calls return at once), pausing between modules while `pause` says so, and have
    the first registry load (that of the first compile, under Numba's compiler lock, so
    that no other thread's compile sees the check replaced) skip `scipy.linalg`."""
    global _done
    if _done:
        return
    with LOCK:
        if _done:
            return
        finder = _Pausing(pause) if pause is not None else None
        if finder is not None:
            sys.meta_path.insert(0, finder)
        try:
            _load()
        finally:
            if finder is not None:
                finder.active = False  # (its loaders stay with their modules)
                sys.meta_path.remove(finder)
        _done = True


def _load() -> None:
    if "numba" not in sys.modules:
        _import_numba()
    import numba  # (TBB was chosen before: runtime.executable)
    from numba.core.registry import cpu_target

    context = cpu_target.target_context
    if "numba.np.arraymath" not in sys.modules:  # the registries' first load is to come
        context.refresh = functools.partial(_first_refresh, context)
    import numpy as np

    _masked_arrays_when_imported()
    numba.typeof(np.empty(1))  # (Numba's first type of an array, here rather than at a call)
    import fastgrad.compiler.codegen.support  # noqa: F401  (what every kernel imports)
    from fastgrad.core.config import config

    if config.runtime == "vm":
        import fastgrad.runtime.vm  # noqa: F401  (the plan interpreter)


def _masked_arrays_when_imported() -> None:
    """Numba's type of an array first checks that it is no masked array, through `np.ma`,
    which imports numpy.ma (~10 ms of CPU, 10-40 ms of wall time under load) at the first
    call of each kind of array. No masked array can exist before numpy.ma is imported:
    Numba's typing module gets a NumPy whose `ma` is numpy.ma once it is, and until then
    one whose MaskedArray nothing is an instance of."""
    from numba.core.typing import typeof

    numpy = sys.modules["numpy"]
    if getattr(typeof, "np", None) is numpy and imported("numpy.ma") is None:
        typeof.np = _NumpyUntilMa(numpy)  # type: ignore[attr-defined]


class _NoMaskedArrays:
    class MaskedArray:  # never instantiated
        pass


class _NumpyUntilMa:
    """NumPy, but for `ma` while numpy.ma is not imported (`_masked_arrays_when_imported`)."""

    def __init__(self, numpy: Any):
        self._numpy = numpy

    def __getattr__(self, name: str) -> Any:
        if name == "ma":
            return imported("numpy.ma") or _NoMaskedArrays
        return getattr(self._numpy, name)


def _import_numba() -> None:
    """Import Numba, most of the load's cost, without SciPy where SciPy is not imported
    yet: Numba's import checks that SciPy, if installed, is 1.0 or later by importing it
    (`numba._ensure_critical_deps`, 6-30 ms of a warm process's wait), which fastgrad's own
    requirement (scipy >= 1.11) already ensures. For this thread and this import only,
    `import scipy` finds nothing, which that check reads as "not installed"; nothing else
    in Numba's import imports SciPy, and any other thread imports it as ever."""
    finder = _NoSciPy()
    sys.meta_path.insert(0, finder)
    try:
        import numba  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


class _NoSciPy(importlib.abc.MetaPathFinder):
    """`import scipy` in the thread that made it finds nothing (`_import_numba`)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == "scipy" and threading.get_ident() == self.thread:
            raise ModuleNotFoundError("not during Numba's import (runtime.numba_load)", name=name)
        return None


def _first_refresh(context: Any) -> None:
    """Numba's target context's first `refresh` (a compile's: machine code loaded from
    disk needs none, compiler.machine_code), with Numba's BLAS check answered by
    `blas_found`; later ones are Numba's own."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.np import linalg

    from fastgrad.compiler.machine_code import initialize_runtime

    with global_compiler_lock:
        context.__dict__.pop("refresh", None)
        initialize_runtime(context)  # from fastgrad's cache, before the refresh would compile it
        if "numba.np.arraymath" in sys.modules:  # loaded meanwhile by another context
            type(context).refresh(context)
            return
        original = getattr(linalg, "ensure_blas", None)
        if original is None:  # a Numba without this check: its own load, as it is
            type(context).refresh(context)
            return
        linalg.ensure_blas = blas_found
        try:
            type(context).refresh(context)
        finally:
            linalg.ensure_blas = original
            arraymath = sys.modules.get("numba.np.arraymath")
            if getattr(arraymath, "ensure_blas", None) is blas_found:
                arraymath.ensure_blas = original


class _Pausing(importlib.abc.MetaPathFinder):
    """Finds what the finders after it find, for the loading thread, with a loader that
    first waits while `pause` says so, no other thread waits for a module lock (one it
    may hold), and no fork waits for the load. It waits in `exec_module`, where Python
    holds only the locks of the modules being imported; `find_spec` runs under Python's
    global import lock, which every import in every thread takes."""

    LOADERS = (
        importlib.machinery.SourceFileLoader,
        importlib.machinery.SourcelessFileLoader,
        importlib.machinery.ExtensionFileLoader,
    )  # a new loader per module found: one can be given a waiting `exec_module`

    def __init__(self, pause: Pause):
        self.pause = pause
        self.thread = threading.get_ident()
        self.active = True

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if not self.active or threading.get_ident() != self.thread:
            return None
        finders = sys.meta_path[sys.meta_path.index(self) + 1 :]
        for finder in finders:
            find = getattr(finder, "find_spec", None)
            spec = None if find is None else find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if type(loader) in self.LOADERS:
            run = loader.exec_module

            def exec_module(module: Any) -> None:
                self.wait()
                run(module)

            loader.exec_module = exec_module
        return spec

    def wait(self) -> None:
        while self.active and not _forking.is_set() and not self._waited_on():
            if not self.pause(POLL):
                return

    def _waited_on(self) -> bool:
        """Whether another thread waits for a module lock (CPython's import machinery
        notes each thread waiting for one; where it does not, assume one does)."""
        from importlib import _bootstrap  # type: ignore[attr-defined]

        waiting = getattr(_bootstrap, "_blocking_on", None)
        if waiting is None:
            return True
        return any(thread != self.thread for thread in list(waiting))


def before_fork(timeout: float) -> bool:
    """In the forking thread: wait (at most `timeout` s) for a load under way, unpaused;
    True if the fork now holds the load's lock (`after_fork` gives it back)."""
    _forking.set()
    try:
        return LOCK.acquire(timeout=timeout)
    finally:
        _forking.clear()


def after_fork() -> None:
    """In the parent and in the child, after `before_fork` took the lock."""
    LOCK.release()
