"""Numba machine code kept in fastgrad's cache directory: one file per function and signature.

`cached_njit(tag)` is `numba.njit` whose compiled code a new process loads from
`<cache dir>/machine_code/` instead of compiling again. Each file holds one compile result
under a name hashed from everything that code depends on (fastgrad's code generator and
helpers, Numba, llvmlite, Python, the CPU, the function, its signature), with a digest
checked before anything is unpickled: files are written to a temporary name and renamed,
so concurrent processes and killed ones never leave half a file, and a damaged or stale
file is recompiled, never trusted. `NUMBA_CACHE_DIR` does not move it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastgrad.core.config import cache_dir

_DIGEST = 32  # bytes of sha256 in front of each file's payload


@functools.lru_cache(maxsize=1)
def environment_tag() -> str:
    """What compiled code depends on besides its source: versions, the CPU, and the
    helpers every kernel calls (a change to them changes the machine code)."""
    import llvmlite
    import llvmlite.binding as llvm
    import numba

    codegen = Path(__file__).parent / "codegen"
    helpers = [codegen / "support.py", *sorted((codegen / "vecmath").glob("*.py"))]
    code = b"".join(path.read_bytes() for path in helpers)
    parts = [
        numba.__version__,
        llvmlite.__version__,
        llvm.get_host_cpu_name(),
        llvm.get_host_cpu_features().flatten(),
        hashlib.sha256(code).hexdigest(),
        sys.version,
    ]
    return "\n".join(parts)


def directory() -> Path:
    return cache_dir() / "machine_code"


class Counters:
    """How often machine code was loaded, saved or found damaged (tests read them)."""

    def __init__(self) -> None:
        self.loaded = 0
        self.saved = 0
        self.dropped = 0


COUNTERS = Counters()


class MachineCodeCache:
    """A Numba dispatcher cache (the interface of numba.core.caching._Cache) that stores
    each signature's compile result in a file of its own under fastgrad's cache."""

    def __init__(self, py_func: Callable[..., Any], tag: str):
        self._name = f"{py_func.__module__}.{py_func.__qualname__}[{tag}]"
        self._enabled = True

    @property
    def cache_path(self) -> str:
        return str(directory())

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def flush(self) -> None:
        pass  # files are per signature: nothing is held back

    def _path(self, sig: Any, codegen: Any) -> Path:
        key = "\n".join([environment_tag(), self._name, str(sig), repr(codegen.magic_tuple())])
        return directory() / (hashlib.sha256(key.encode()).hexdigest()[:40] + ".nbm")

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """The compile result stored for `sig`, or None (then Numba compiles)."""
        if not self._enabled:
            return None
        target_context.refresh()
        path = self._path(sig, target_context.codegen())
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        from numba.core.compiler import CompileResult

        try:
            if hashlib.sha256(blob[_DIGEST:]).digest() != blob[:_DIGEST]:
                raise ValueError("digest mismatch")
            result = CompileResult._rebuild(target_context, *pickle.loads(blob[_DIGEST:]))
        except Exception:  # damaged or from an incompatible build: compile instead
            COUNTERS.dropped += 1
            _unlink(path)
            return None
        COUNTERS.loaded += 1
        return result

    def save_overload(self, sig: Any, cres: Any) -> None:
        """Store a fresh compile result; a cache that cannot be written is skipped."""
        if not self._enabled or cres.objectmode or cres.lifted:
            return
        if cres.library.has_dynamic_globals:  # addresses of this process: not reusable
            return
        from numba.core.serialize import dumps

        payload = dumps(cres._reduce())
        try:
            write_atomically(
                self._path(sig, cres.codegen), hashlib.sha256(payload).digest() + payload
            )
        except OSError:
            return
        COUNTERS.saved += 1


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: readers see the old
    file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink(Path(tmp))
        raise


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:  # already gone: another process dropped or replaced it
        pass


def cached_njit(tag: str, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """`numba.njit(**options)` with its machine code cached in fastgrad's cache directory.

    `tag` tells apart functions of the same name built for different constants (e.g.
    "float32"). Numba's own `cache=True` cannot do this: it writes beside the source (or
    to NUMBA_CACHE_DIR), and it keys closures by a pickle that changes in every process.

    >>> square = cached_njit("doc")(lambda x: x * x)
    >>> square(3.0)
    9.0
    """
    import numba

    def decorate(fn: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(**options)(fn)
        # Numba consults `_cache` on every new signature: load_overload before it compiles,
        # save_overload after.
        dispatcher._cache = MachineCodeCache(fn, tag)
        return dispatcher

    return decorate
