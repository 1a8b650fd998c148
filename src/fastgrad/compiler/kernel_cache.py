"""Compile generated kernels with Numba; cache them in memory and on disk.

Each kernel's source runs as a module named by a hash of the source and of everything its
machine code depends on (fastgrad's code generator, Numba's and llvmlite's versions, the
CPU). Its machine code is kept in `<cache dir>/kernels/`, one file per kernel and argument
types, checked against a digest before it is loaded (compiler.machine_code): a new process
loads it instead of compiling, and a damaged, moved or unwritable entry costs a compile,
never a crash or a wrong result. `needs_build` tells, before a first run, whether a kernel
will be compiled rather than loaded; `first_call` reports each kernel it built to
fastgrad.core.compile_log. Threads asking for the same kernel get one dispatcher.
"""

from __future__ import annotations

import functools
import hashlib
import linecache
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from fastgrad.compiler.machine_code import MachineCodeCache, environment_tag
from fastgrad.core import compile_log
from fastgrad.core.config import CACHE_VARIABLES, cache_dir

FOLDER = "kernels"


@functools.lru_cache(maxsize=1 << 12)  # (an unrolled loop's steps ask for a few sources)
def kernel_key(source: str) -> str:
    digest = hashlib.sha256((environment_tag() + "\n" + source).encode())
    return digest.hexdigest()[:32]


class Stats:
    """Counters that tests and `explain` read."""

    def __init__(self) -> None:
        self.modules_loaded = 0  # kernel modules run in this process
        self.native_loads = 0  # kernels loaded before Numba's import (runtime.native_code)

    def numba_compiles(self) -> int:
        """Kernels Numba compiled in this process (not loaded from its disk cache)."""
        return sum(
            sum(d.stats.cache_misses.values()) for d in _MEMORY.values() if hasattr(d, "stats")
        )

    def cache_loads(self) -> int:
        """Kernels loaded from fastgrad's disk cache: by Numba, or before its import."""
        hits = (sum(d.stats.cache_hits.values()) for d in _MEMORY.values() if hasattr(d, "stats"))
        return sum(hits) + self.native_loads


STATS = Stats()
_MEMORY: dict[str, Any] = {}
_LOADING = threading.Lock()  # one module per kernel, whichever threads ask at once


def load_kernel(source: str, name: str = "kernel") -> Any:
    """The compiled-on-first-call Numba dispatcher for `source` (a module defining `name`),
    whose machine code is loaded from, or saved to, fastgrad's cache directory."""
    key = kernel_key(source)
    hit = _MEMORY.get(key)
    if hit is not None:
        return hit
    with _LOADING:
        hit = _MEMORY.get(key)
        if hit is not None:
            return hit
        module_name = f"fastgrad_kernel_{key}"
        filename = f"<{module_name}>"
        # Tracebacks and Numba's error messages show the generated source.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module = ModuleType(module_name)
        # Machine code loaded from the cache finds the kernel's globals by module name.
        sys.modules[module_name] = module
        exec(compile(source, filename, "exec"), module.__dict__)
        dispatcher = getattr(module, name)
        dispatcher._cache = MachineCodeCache(
            dispatcher.py_func, key, folder=FOLDER, prefix=module_name + "."
        )
        _MEMORY[key] = dispatcher
        STATS.modules_loaded += 1
    return dispatcher


# (kernels folder, key) of kernels found on disk: an unrolled loop's plan asks about each
# of its few kernels once per step (599 globs took 0.9 s of a warm T=200 RNN first call).
_ON_DISK: set[tuple[str, str]] = set()
# Kernels folders listed once (a glob per kernel scans the folder: ~0.5 ms each at 457
# files, for each of a warm first call's kernels).
_LISTED: set[str] = set()


def needs_build(source: str) -> bool:
    """Whether the first run of the kernel in `source` will compile it: it is neither
    compiled in this process nor stored on disk."""
    key = kernel_key(source)
    loaded = _MEMORY.get(key)
    if loaded is not None:
        return not loaded.signatures
    environ = os.environ
    where = _kernels_folder(*[environ.get(name) for name in CACHE_VARIABLES])
    if (where, key) in _ON_DISK:
        return False
    folder = Path(where)
    if where not in _LISTED:  # every kernel stored so far, by one listing
        _LISTED.add(where)
        try:
            names = os.listdir(folder)
        except OSError:
            names = []
        prefix = "fastgrad_kernel_"
        _ON_DISK.update(
            (where, name[len(prefix) :].partition(".")[0])
            for name in names
            if name.startswith(prefix) and name.endswith(".nbm")
        )
        if (where, key) in _ON_DISK:
            return False
    try:  # stored since the listing, maybe
        found = any(folder.glob(f"fastgrad_kernel_{key}.*.nbm"))
    except OSError:
        return True
    if found:
        _ON_DISK.add((where, key))
    return not found


@functools.lru_cache(maxsize=8)
def _kernels_folder(*environment: str | None) -> str:
    """The kernels folder (`cache_dir() / FOLDER`) as a string, kept under the variables
    `cache_dir` reads: a Path made per question cost ~10 us, asked for each of the T=200
    RNN's 599 kernel steps in its warm first call."""
    return str(cache_dir() / FOLDER)


def _builds(dispatcher: Any) -> int:
    stats = getattr(dispatcher, "stats", None)
    return sum(stats.cache_misses.values()) if stats is not None else 0


def first_call(dispatcher: Any, *args: Any) -> Any:
    """Call a freshly loaded kernel, telling fastgrad.core.compile_log if it was built
    (rather than loaded from disk)."""
    before = _builds(dispatcher)
    try:
        return dispatcher(*args)
    finally:
        if _builds(dispatcher) > before:
            compile_log.kernel_built()


def compile_kernel(source: str, name: str, types: tuple[Any, ...]) -> tuple[Any, bool]:
    """The kernel in `source` compiled (or loaded from disk) for argument `types` without
    running it: (dispatcher, whether Numba built machine code rather than loading it)."""
    dispatcher = load_kernel(source, name)
    before = _builds(dispatcher)
    dispatcher.compile(types)
    return dispatcher, _builds(dispatcher) > before


def call_writable(kernel: Any, args: Sequence[Any]) -> Any:
    """Call `kernel` (a dispatcher, or any callable) with `args`; a read-only array among
    them through the overload compiled for writeable arrays of the same layout, when it
    has one. Numba types a read-only array apart and would compile the kernel again for it
    on the calling thread (0.5-1.5 s); kernels never write their inputs, and the machine
    code is the same."""
    overloads = getattr(kernel, "overloads", None)
    # NumPy scalars have flags too, never writeable: only arrays decide.
    if not overloads or not any(isinstance(a, np.ndarray) and not a.flags.writeable for a in args):
        return kernel(*args)
    from numba import typeof, types

    kinds = []
    for arg in args:
        kind = typeof(arg)
        if isinstance(kind, types.Array) and not kind.mutable:
            kind = kind.copy(readonly=False)
        kinds.append(kind)
    entry = getattr(overloads.get(tuple(kinds)), "entry_point", None)
    return kernel(*args) if entry is None else entry(*args)
