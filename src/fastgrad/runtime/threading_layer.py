"""The threads parallel kernels run on: Numba's TBB layer, which survives `os.fork()`.

Numba tries TBB first, then OpenMP, but finds the TBB library that the `tbb` package puts
in `<prefix>/lib` only if the loader already knows it; otherwise it takes GNU OpenMP,
after which a forked child dies ("fork() called from a process already using GNU
OpenMP") and a fork-based multiprocessing pool hangs. `prefer_tbb()` loads that library
by its path, before any parallel kernel starts Numba's threads. The layer Numba picks
is then TBB; a user's `NUMBA_THREADING_LAYER` is left alone. Numba's workqueue layer,
also fork-safe, is not an option: it aborts the process when two threads run parallel
kernels at once. Where TBB is missing, a fork after OpenMP ran warns first.

A warm process loads stored parallel kernels before Numba's import (runtime.native_code):
`native_symbols()` starts that same TBB layer from Numba's `tbbpool` extension module,
loaded without the numba package, as Numba's `_launch_threads` would (its
`launch_threads` with NUMBA_NUM_THREADS, then the starting thread's `set_num_threads`),
and hands the addresses of the functions parallel kernels call. The layer's state is
the shared object's (a task group, a count, thread-local counts): a Numba imported later
finds TBB again, loads the same module (CPython keeps one copy of it), and its
`launch_threads` sees the layer started and returns: one layer, one set of threads.
Only where Numba would pick TBB itself (TBB loaded above, no other layer or priority
chosen, no Numba configuration file); elsewhere parallel kernels wait for Numba.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

LIBRARY = "libtbb.so.12"


def tbb_library() -> Path | None:
    """Where the `tbb` package installed the TBB library, or None. The environment's
    `lib` first: that is where the package puts it, and asking importlib.metadata costs
    ~35 ms, a sixth of `import fastgrad` (measured on the 2-core development machine)."""
    beside = Path(sys.prefix) / "lib" / LIBRARY
    if beside.is_file():
        return beside.resolve()
    from importlib import metadata

    try:
        files = metadata.files("tbb") or []
        dist = metadata.distribution("tbb")
    except metadata.PackageNotFoundError:
        return None
    found = (Path(str(dist.locate_file(f))) for f in files if f.name == LIBRARY)
    return next((p.resolve() for p in found if p.is_file()), None)


def prefer_tbb() -> bool:
    """Make TBB loadable for Numba's threading layer (Linux, when the user chose no
    layer); True if it is. Must run before Numba starts its threads: it does at import."""
    if not sys.platform.startswith("linux") or os.environ.get("NUMBA_THREADING_LAYER"):
        return False
    path = tbb_library()
    if path is None:
        return False
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True


# The functions of Numba's threading layer that its parallel kernels call, by the names
# its `_launch_threads` and `_load_threading_functions` give LLVM, and their attribute
# names on the layer's extension module.
SYMBOLS = {
    "numba_parallel_for": "parallel_for",
    **{
        name: name
        for name in (
            "do_scheduling_signed",
            "do_scheduling_unsigned",
            "allocate_sched",
            "deallocate_sched",
            "get_num_threads",
            "set_num_threads",
            "get_thread_id",
            "set_parallel_chunksize",
            "get_parallel_chunksize",
            "get_sched_size",
        )
    },
}
_LAYERS = ("tbb", "omp", "workqueue")  # what Numba's priority orders
#: The least TBB interface version Numba's TBB layer runs on (as Numba checks it).
TBB_INTERFACE = 12060
_STARTED: list[Any] = []  # the layer's module, once started here (kept: its end stops TBB)
_START_LOCK = threading.Lock()


@functools.cache
def numbas_choice_is_tbb() -> bool:
    """Whether Numba, imported now, would run parallel kernels on TBB: TBB loaded by
    `prefer_tbb` (so no layer chosen), no other layer put first by
    NUMBA_THREADING_LAYER_PRIORITY, no `.numba_config.yaml` (which may choose one) where
    Numba reads it, and a TBB recent enough for Numba."""
    priority = os.environ.get("NUMBA_THREADING_LAYER_PRIORITY", "tbb omp workqueue").split()
    if not TBB_LOADED or priority[:1] != ["tbb"] or sorted(priority) != sorted(_LAYERS):
        return False
    if os.path.isfile(".numba_config.yaml"):
        return False
    try:
        version = ctypes.CDLL(LIBRARY).TBB_runtime_interface_version
    except (OSError, AttributeError):
        return False
    version.restype = ctypes.c_int
    return bool(version() >= TBB_INTERFACE)


def native_symbols() -> dict[str, int] | None:
    """The addresses of `SYMBOLS`, Numba's threading layer started (TBB, as Numba starts
    it) where it was not yet; None where it cannot be started so (`numbas_choice_is_tbb`),
    or Numba's import is under way (the kernel then takes Numba's path). Without Numba
    imported, the layer starts from its extension module, runtime.numba_load's lock held
    (the compile thread's import of Numba waits) and its functions called with the GIL
    held: a thread importing Numba otherwise is far from a parallel kernel of its own
    (~0.2 s of import) and cannot start the layer as well.
    With Numba imported, Numba's own `_launch_threads` starts it (whatever layer it
    picks: the names are then known to LLVM, and this answers {})."""
    from fastgrad.runtime import numba_load

    if _STARTED:
        return _addresses(_STARTED[0])
    if "numba" in sys.modules:
        if numba_load.imported("numba") is None:
            return None  # under way
        from numba.np.ufunc import parallel

        try:
            parallel._launch_threads()
        except (ImportError, ValueError):  # no layer loads: Numba's path says so
            return None
        return {}
    if not numbas_choice_is_tbb() or not numba_load.LOCK.acquire(blocking=False):
        return None
    try:
        with _START_LOCK:
            if not _STARTED and "numba" not in sys.modules:
                layer = numba_load.extension("numba.np.ufunc.tbbpool")
                needed = [*SYMBOLS.values(), "launch_threads", "set_num_threads"]
                if not all(hasattr(layer, name) for name in needed):
                    return None  # a Numba whose layer lists fewer: never started here
                _STARTED.append(_start(layer))
    except (ImportError, ValueError, OSError):
        return None
    finally:
        numba_load.LOCK.release()
    return _addresses(_STARTED[0]) if _STARTED else None


def _start(layer: Any) -> Any:
    """Start TBB's layer from its module `layer` as Numba's `_launch_threads` does: its
    threads for NUMBA_NUM_THREADS (ValueError where that is below 1, as Numba raises),
    that count as this thread's. Called as Python functions (PYFUNCTYPE: the GIL held)."""
    from fastgrad.runtime.thread_budget import numba_threads

    count = numba_threads()
    if count < 1:
        raise ValueError("Number of threads specified must be > 0.")
    ctypes.PYFUNCTYPE(None, ctypes.c_int)(layer.launch_threads)(count)
    ctypes.PYFUNCTYPE(None, ctypes.c_int)(layer.set_num_threads)(count)
    return layer


def _addresses(layer: Any) -> dict[str, int]:
    return {name: int(getattr(layer, attribute)) for name, attribute in SYMBOLS.items()}


def loads_parallel_kernels() -> bool:
    """Whether stored parallel kernels load before Numba's import (`native_symbols`):
    Numba's choice is TBB, or Numba is imported (its layer, whichever, then starts)."""
    from fastgrad.runtime import numba_load

    return numbas_choice_is_tbb() or numba_load.imported("numba") is not None


def started_natively() -> bool:
    """Whether `native_symbols` started the layer (not Numba)."""
    return bool(_STARTED)


def active_layer() -> str | None:
    """The threading layer Numba runs parallel kernels on, or None before it started
    (TBB where `native_symbols` started it and Numba, imported or not, started none: it
    does not know of that one). Numba's own answer first where it has one: a user who
    chose another layer in Numba's config after TBB started here has both loaded, and
    the fork warning must see theirs.

    >>> active_layer() in (None, "tbb", "omp", "workqueue")
    True
    """
    if _STARTED and "numba" not in sys.modules:
        return "tbb"  # (asking would import Numba: ~0.15 s)
    import numba

    try:
        return str(numba.threading_layer())
    except ValueError:  # Numba started no layer
        return "tbb" if _STARTED else None


def _before_fork() -> None:
    # Without Numba imported no parallel kernel ran (and asking would import it: ~0.15 s)
    if "numba" in sys.modules and active_layer() == "omp":
        warnings.warn(
            "fastgrad: this process ran parallel kernels on GNU OpenMP, which does not "
            "survive a fork: the child may die or hang. Install the tbb package (then Numba "
            "runs them on TBB), or start processes with the 'forkserver' or 'spawn' method.",
            RuntimeWarning,
            stacklevel=2,
        )


TBB_LOADED = prefer_tbb()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)
