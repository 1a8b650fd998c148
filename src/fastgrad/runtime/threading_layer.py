"""The threads parallel kernels run on: Numba's TBB layer, which survives `os.fork()`.

Numba tries TBB first, then OpenMP, but finds the TBB library that the `tbb` package puts
in `<prefix>/lib` only if the loader already knows it; otherwise it takes GNU OpenMP,
after which a forked child dies ("fork() called from a process already using GNU
OpenMP") and a fork-based multiprocessing pool hangs. `prefer_tbb()` loads that library
by its path, before any parallel kernel starts Numba's threads. The layer Numba picks
is then TBB; a user's `NUMBA_THREADING_LAYER` is left alone. Numba's workqueue layer,
also fork-safe, is not an option: it aborts the process when two threads run parallel
kernels at once. Where TBB is missing, a fork after OpenMP ran warns first.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from pathlib import Path

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


def active_layer() -> str | None:
    """The threading layer Numba runs parallel kernels on, or None before it started.

    >>> active_layer() in (None, "tbb", "omp", "workqueue")
    True
    """
    import numba

    try:
        return str(numba.threading_layer())
    except ValueError:  # no parallel kernel has run yet
        return None


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
