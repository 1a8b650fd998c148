"""What the numbers were measured on: versions, threads, CPU and memory.

Peer versions come from package metadata, so nothing here imports a peer.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from importlib import metadata

from fastgrad.cli import cpu_model

PACKAGES = (
    "fastgrad",
    "numpy",
    "numba",
    "llvmlite",
    "autograd",
    "jax",
    "jaxlib",
    "torch",
    "scipy",
    "matplotlib",
)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def memory_bytes() -> dict:
    """MemTotal and MemAvailable from /proc/meminfo (empty where there is none)."""
    found = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    found[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return found


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: other work on the machine skews timings."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def numba_threads() -> int:
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


def collect() -> dict:
    mem = memory_bytes()
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": numba_threads(),
        "memory_total_gb": round(mem["MemTotal"] / 1e9, 1) if "MemTotal" in mem else None,
        "load_start": load_average(),
        "versions": {name: _version(name) for name in PACKAGES},
    }
