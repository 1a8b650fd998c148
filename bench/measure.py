"""Timing, memory and bandwidth measurement primitives, used inside a child process.

Memory comes from the kernel's resident-set figures (VmRSS and VmHWM in /proc/self/status),
so it counts every allocator, not only Python's. The peak can be reset on Linux, which
lets the steady-state calls be measured on their own.
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

MEMORY_METHOD = (
    "peak RSS (VmHWM in /proc/self/status; getrusage ru_maxrss where there is no /proc) "
    "in a child process per system; current RSS from VmRSS; peak reset for the steady "
    "state by writing 5 to /proc/self/clear_refs"
)
MB = 1 << 20

# Time one batch of calls for at least this long, so that perf_counter resolution and
# loop overhead do not dominate microsecond-sized calls.
MIN_BATCH_S = 2e-3
MAX_INNER = 100_000


def _status(field: str) -> int | None:
    """A memory field of /proc/self/status in bytes (None where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def current_rss() -> int | None:
    """Resident set size now, in bytes (None where /proc is not available)."""
    return _status("VmRSS")


def peak_rss() -> int:
    """Peak resident set size since start (or since the last reset), in bytes.

    VmHWM, not ru_maxrss: Linux carries ru_maxrss over an exec, so a child's
    ru_maxrss starts at its parent's size.
    """
    peak = _status("VmHWM")
    if peak is not None:
        return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def reset_peak_rss() -> bool:
    """Reset the peak RSS to the current RSS (Linux >= 4.0); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def time_batch(call: Callable[[], None], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        call()
    return time.perf_counter() - start


def steady_state(call: Callable[[], None], repeat: int, budget_s: float) -> dict:
    """Median per-call time over `repeat` batches (fewer if the time budget runs out).

    `call` must run one complete call, including waiting for an asynchronous result and
    dropping it, so that freeing the outputs is part of what is timed.
    """
    gc.collect()
    estimate = time_batch(call, 1)  # also a warm-up call after the first one
    inner = 1 if estimate >= MIN_BATCH_S else min(MAX_INNER, int(MIN_BATCH_S / estimate) + 1)
    times = []
    start = time.perf_counter()
    for i in range(repeat):
        times.append(time_batch(call, inner) / inner)
        # At least three batches, whatever the budget, so that a median means something.
        if i >= 2 and time.perf_counter() - start > budget_s:
            break
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "times_s": times,
        "repeats": len(times),
        "inner": inner,
    }


def triad(n: int, repeat: int) -> dict:
    """Memory bandwidth of a parallel Numba triad a = b + s*c, counting three arrays.

    The output is preallocated and already touched, so no page faults are timed.
    """
    import numba
    from numba import prange

    @numba.njit(parallel=True)
    def kernel(a, b, c, s):
        for i in prange(a.shape[0]):
            a[i] = b[i] + s * c[i]

    b = np.full(n, 1.0)
    c = np.full(n, 2.0)
    a = np.full(n, 0.0)  # np.full writes every page; np.zeros might not
    kernel(a, b, c, 3.0)  # compiles
    times = [time_batch(lambda: kernel(a, b, c, 3.0), 1) for _ in range(repeat)]
    moved = 3 * n * a.itemsize
    return {
        "n": n,
        "dtype": "float64",
        "bytes": moved,
        "repeats": repeat,
        "best_gbps": moved / min(times) / 1e9,
        "median_gbps": moved / statistics.median(times) / 1e9,
        "threads": numba.config.NUMBA_NUM_THREADS,
    }
