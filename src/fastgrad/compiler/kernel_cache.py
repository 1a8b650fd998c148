"""Compile generated kernels with Numba; cache them in memory and on disk.

Each kernel's source is written to a module file named by a hash of the source and of
everything its machine code depends on (fastgrad's code generator, Numba's and llvmlite's
versions, the CPU), then imported under that name, so Numba's `cache=True` can store the
machine code beside it and a new process loads it instead of compiling. A module file
whose text is not exactly the expected source is rewritten, never trusted; files are
written to a temporary name and renamed, so concurrent processes cannot see half a file.
`needs_build` tells, before a first run, whether a kernel will be compiled rather than
loaded; `first_call` reports each kernel it built to fastgrad.core.compile_log.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastgrad.compiler.machine_code import environment_tag
from fastgrad.core import compile_log
from fastgrad.core.config import cache_dir


def kernel_key(source: str) -> str:
    digest = hashlib.sha256((environment_tag() + "\n" + source).encode())
    return digest.hexdigest()[:32]


class Stats:
    """Counters that tests and `explain` read."""

    def __init__(self) -> None:
        self.modules_loaded = 0  # kernel modules imported in this process
        self.modules_written = 0  # module files (re)written to the disk cache
        self.machine_code_dropped = 0  # unreadable Numba cache entries thrown away

    def numba_compiles(self) -> int:
        """Kernels Numba compiled in this process (not loaded from its disk cache)."""
        return sum(
            sum(d.stats.cache_misses.values()) for d in _MEMORY.values() if hasattr(d, "stats")
        )

    def numba_cache_hits(self) -> int:
        return sum(
            sum(d.stats.cache_hits.values()) for d in _MEMORY.values() if hasattr(d, "stats")
        )


STATS = Stats()
_MEMORY: dict[str, Any] = {}


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_kernel(source: str, name: str = "kernel") -> Any:
    """The compiled-on-first-call Numba dispatcher for `source` (a module defining `name`)."""
    key = kernel_key(source)
    hit = _MEMORY.get(key)
    if hit is not None:
        return hit
    directory = cache_dir() / "kernels"
    directory.mkdir(parents=True, exist_ok=True)
    module_name = f"fastgrad_kernel_{key}"
    path = directory / f"{module_name}.py"
    try:
        current = path.read_text()
    except (OSError, UnicodeDecodeError):
        current = None
    if current != source:
        # Missing, truncated, corrupt or stale: rebuild it, and drop machine code that Numba
        # may have cached for the old text.
        _write_atomically(path, source)
        _drop_numba_cache(directory, module_name)
        STATS.modules_written += 1
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Numba's cache re-imports the module by name when it loads machine code.
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    dispatcher = getattr(module, name)
    _MEMORY[key] = dispatcher
    STATS.modules_loaded += 1
    return dispatcher


def needs_build(source: str) -> bool:
    """Whether the first run of the kernel in `source` will compile it: it is neither
    compiled in this process nor stored on disk with its machine code."""
    key = kernel_key(source)
    loaded = _MEMORY.get(key)
    if loaded is not None:
        return not loaded.signatures
    directory = cache_dir() / "kernels"
    module_name = f"fastgrad_kernel_{key}"
    try:
        if (directory / f"{module_name}.py").read_text() != source:
            return True
    except (OSError, UnicodeDecodeError):
        return True
    return not any((directory / "__pycache__").glob(f"{module_name}.*.nbi"))


def _builds(dispatcher: Any) -> int:
    stats = getattr(dispatcher, "stats", None)
    return sum(stats.cache_misses.values()) if stats is not None else 0


def first_call(dispatcher: Any, source: str, *args: Any) -> Any:
    """Call a freshly loaded kernel; if Numba's cached machine code for it is unreadable,
    drop that code and compile instead."""
    before = _builds(dispatcher)
    try:
        result = _call_or_drop_cache(dispatcher, source, *args)
    finally:
        if _builds(dispatcher) > before:
            compile_log.kernel_built()
    return result


def _call_or_drop_cache(dispatcher: Any, source: str, *args: Any) -> Any:
    return _or_drop_cache(dispatcher, source, lambda: dispatcher(*args))


def compile_kernel(source: str, name: str, types: tuple[Any, ...]) -> tuple[Any, bool]:
    """The kernel in `source` compiled (or loaded from disk) for argument `types` without
    running it: (dispatcher, whether Numba built machine code rather than loading it)."""
    dispatcher = load_kernel(source, name)
    before = _builds(dispatcher)
    _or_drop_cache(dispatcher, source, lambda: dispatcher.compile(types))
    return dispatcher, _builds(dispatcher) > before


def _or_drop_cache(dispatcher: Any, source: str, action: Callable[[], Any]) -> Any:
    """`action()`; if it failed inside Numba's cache (unreadable machine code), drop that
    code and do it again, compiling."""
    try:
        return action()
    except Exception as error:
        tb = error.__traceback__
        in_cache = False
        while tb is not None:
            if tb.tb_frame.f_code.co_filename.endswith(os.path.join("numba", "core", "caching.py")):
                in_cache = True
            tb = tb.tb_next
        if not in_cache:
            raise
    _drop_numba_cache(cache_dir() / "kernels", f"fastgrad_kernel_{kernel_key(source)}")
    STATS.machine_code_dropped += 1
    return action()


def _drop_numba_cache(directory: Path, module_name: str) -> None:
    pycache = directory / "__pycache__"
    if not pycache.is_dir():
        return
    for entry in pycache.iterdir():
        if entry.name.startswith(module_name + "."):
            try:
                entry.unlink()
            except OSError:  # another process replaced it first
                pass
