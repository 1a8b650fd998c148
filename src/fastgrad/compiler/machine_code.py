"""Numba machine code kept in fastgrad's cache directory: one file per function and signature.

`MachineCodeCache` is the cache of every Numba function fastgrad compiles: the generated
kernels (compiler.kernel_cache) and the vector-math helpers (`cached_njit(tag)`). Each file
holds one compile result under a name hashed from everything that code depends on
(fastgrad's code generator and helpers, Numba, llvmlite, Python, the CPU, the function,
its signature), behind a sha256 of that name and the payload, checked before anything is
unpickled: a damaged file, or one moved from another entry, is recompiled, never trusted.
Files are written to a temporary name and renamed, so concurrent processes and killed
ones never leave half a file. A cache that cannot be read or written (not a directory,
read-only, full) costs a compile in memory and one `CacheWarning` that says how to fix it.
Numba's own cache (`NUMBA_CACHE_DIR`, `~/.cache/numba`) is never used. Numba's runtime
functions (reference counts, compiled by Numba in every process) are kept the same way
(`initialize_runtime`). A load does less than Numba's own: the modules of Numba's
functions a kernel inlines are not imported for their environments (`_environment`), and
the module for linking stored with the machine code is parsed only if a compile links
the library in (`_library`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import os
import pickle
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastgrad.core import jit_hook
from fastgrad.core.config import cache_dir

_DIGEST = 32  # bytes of sha256 in front of each file's payload
# In every file's key: a library stored with its symbols' names (`_library`) is another
# file than one stored as Numba stores it, so versions sharing a cache never drop each
# other's files.
_FORMAT = "library with its symbols"


@functools.lru_cache(maxsize=1)
def environment_tag() -> str:
    """What compiled code depends on besides its source: Python, Numba and llvmlite (their
    version files), the CPU, and the helpers kernels call and inline (a change to them
    changes the machine code). Read without importing Numba or llvmlite's LLVM binding
    (tens of ms), which a first call in background mode leaves to the compile thread;
    each file's key also holds Numba's own view of the CPU (`MachineCodeCache._entry`)."""
    package = Path(__file__).parents[1]
    codegen = package / "compiler" / "codegen"
    helpers = [
        codegen / "support.py",
        *sorted((codegen / "vecmath").glob("*.py")),
        package / "ops" / "threefry.py",  # random numbers' kernel functions
    ]
    code = b"".join([_version("numba"), _version("llvmlite")])
    code += b"".join(path.read_bytes() for path in helpers)
    return "\n".join([_cpu(), hashlib.sha256(code).hexdigest(), sys.version])


def _version(package: str) -> bytes:
    """The installed version of `package`, from its `_version.py` (found without importing
    the package or importlib.metadata), else from its metadata."""
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        try:
            return (Path(spec.submodule_search_locations[0]) / "_version.py").read_bytes()
        except OSError:
            pass
    from importlib.metadata import version

    return version(package).encode()


def source_tag(label: str, *paths: str | Path) -> str:
    """`label` and a digest of the files at `paths`: the tag (`cached_njit`,
    MachineCodeCache) of a function compiled from those modules' code, so that a changed
    module is never loaded from an older cache."""
    code = b"".join(Path(path).read_bytes() for path in paths)
    return f"{label} " + hashlib.sha256(code).hexdigest()[:16]


# /proc/cpuinfo's lines that tell CPUs apart (x86 and ARM), not the ones that vary per
# boot or per core (MHz, bogomips, ids).
_CPU_FIELDS = {
    "vendor_id", "cpu family", "model", "model name", "stepping", "flags",
    "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "Features",
}  # fmt: skip


def _cpu() -> str:
    """The CPU, as the operating system describes it, or else as LLVM does."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = {line.strip() for line in f if line.split(":")[0].strip() in _CPU_FIELDS}
    except OSError:
        lines = set()
    if lines:
        return "\n".join(sorted(lines))
    import llvmlite.binding as llvm

    return llvm.get_host_cpu_name() + " " + llvm.get_host_cpu_features().flatten()


def directory() -> Path:
    return cache_dir() / "machine_code"


class Counters:
    """How often machine code was loaded, saved or found damaged (tests read them)."""

    def __init__(self) -> None:
        self.loaded = 0
        self.saved = 0
        self.dropped = 0


COUNTERS = Counters()


class CacheWarning(RuntimeWarning):
    """fastgrad's cache directory cannot be used: kernels compile in memory instead.

    Warned once per cache directory, with the path, the error and how to fix it. To make
    it an error (in a test, say):

    >>> import warnings, fastgrad as fg
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", fg.CacheWarning)
    """


_warned: set[str] = set()  # cache directories already warned about in this process
_warned_lock = threading.Lock()


def cache_unusable(path: Path, error: OSError) -> None:
    """Warn, once per cache directory, that `path` could not be read or written: kernels
    are then compiled in memory, and the warning says how to fix the cache."""
    root = cache_dir()
    with _warned_lock:
        if str(root) in _warned:
            return
        _warned.add(str(root))
    warnings.warn(
        f"fastgrad: the cache directory {root} cannot be used ({type(error).__name__}: "
        f"{error.strerror or error} at {path}); kernels are compiled in memory and not "
        "saved for the next process. To fix it, make that path a writable directory with "
        "free space (remove a file that stands in its way), or point FASTGRAD_CACHE_DIR at "
        "one.",
        CacheWarning,
        stacklevel=2,
    )


class MachineCodeCache:
    """A Numba dispatcher cache (the interface of numba.core.caching._Cache) that stores
    each signature's compile result in a file of its own under fastgrad's cache:
    `<cache dir>/<folder>/<prefix><hash>.nbm`."""

    def __init__(
        self, py_func: Callable[..., Any], tag: str, folder: str = "machine_code", prefix: str = ""
    ):
        self._name = f"{py_func.__module__}.{py_func.__qualname__}[{tag}]"
        self._folder = folder
        self._prefix = prefix
        self._enabled = True

    @property
    def cache_path(self) -> str:
        return str(cache_dir() / self._folder)

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def flush(self) -> None:
        pass  # files are per signature: nothing is held back

    def _entry(self, sig: Any, codegen: Any) -> tuple[Path, bytes]:
        """The file for `sig`, and the key its digest binds the payload to."""
        magic = repr(codegen.magic_tuple())
        return file_for(self._folder, self._prefix, self._name, str(sig), magic)

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """The compile result stored for `sig`, or None (then Numba compiles)."""
        if not self._enabled:
            return None
        path, key = self._entry(sig, target_context.codegen())
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:  # not a directory, a directory, unreadable
            cache_unusable(path, error)
            return None
        from numba.core.compiler import CompileResult
        from numba.core.compiler_lock import global_compiler_lock

        # Machine code needs Numba's runtime (its symbols, for the linker), not the typing
        # and lowering registries that `target_context.refresh()` loads (as Numba's own
        # cache does): importing them was ~0.25 s of CPU of a warm process, ~40% of its
        # wait for compiled calls; a compile loads them itself (numba.core.compiler).
        initialize_runtime(target_context)
        try:
            libdata, *rest = _unpickle(unsealed(key, blob))
            codegen = target_context.codegen()
            # Under Numba's compiler lock (a compile holds it already), as Numba loads
            # every library: no other thread sees the method replaced.
            with global_compiler_lock:
                codegen.unserialize_library = functools.partial(_library, codegen)
                try:
                    result = CompileResult._rebuild(target_context, libdata, *rest)
                finally:
                    del codegen.unserialize_library
        except Exception:  # damaged, moved, or from an incompatible build: compile instead
            COUNTERS.dropped += 1
            _unlink(path)
            return None
        COUNTERS.loaded += 1
        return result

    def save_overload(self, sig: Any, cres: Any) -> None:
        """Store a fresh compile result; a cache that cannot be written is skipped (with a
        warning, once)."""
        if not self._enabled or cres.objectmode or cres.lifted:
            return
        if cres.library.has_dynamic_globals:  # addresses of this process: not reusable
            return
        from numba.core.serialize import dumps

        libdata, *rest = cres._reduce()
        payload = dumps(((*libdata, _defined_symbols(cres.library)), *rest))
        path, key = self._entry(sig, cres.codegen)
        try:
            write_atomically(path, sealed(key, payload))
        except OSError as error:
            cache_unusable(path, error)
            return
        COUNTERS.saved += 1


def file_for(folder: str, prefix: str, name: str, signature: str, magic: str) -> tuple[Path, bytes]:
    """The file of function `name` (module.qualname[tag]) compiled for `signature` (as
    Numba writes it) by a codegen of `magic` (its magic tuple's repr), and the key its
    digest binds the payload to (also read without Numba: runtime.native_code)."""
    key = "\n".join([environment_tag(), _FORMAT, name, signature, magic])
    file = prefix + hashlib.sha256(key.encode()).hexdigest()[:40] + ".nbm"
    return cache_dir() / folder / file, key.encode()


def _defined_symbols(library: Any) -> list[str]:
    """The functions and variables `library`'s module for linking defines (what Numba's
    engine lists when it loads the library: `JitEngine._load_defined_symbols`)."""
    module = library._get_module_for_linking()  # (kept by the library once built)
    return [
        value.name
        for values in (module.functions, module.global_variables)
        for value in values
        if not value.is_declaration
    ]


def _library(codegen: Any, libdata: tuple[Any, ...]) -> Any:
    """`codegen.unserialize_library(libdata)` for the libraries this cache stores (their
    symbols' names appended), without parsing the module for linking that each carries,
    which only a compile linking the library in reads (a kernel's never is: adapters call
    kernels by address): parsing it and listing its symbols was ~2 ms of CPU a library,
    and a warm process loads 10-40 (kernels, adapters, the interpreter)."""
    engine = getattr(codegen, "_engine", None)
    if (
        len(libdata) != 4
        or libdata[1] != "object"
        or not isinstance(getattr(engine, "_defined_symbols", None), set)
    ):  # a library stored without its symbols, or another Numba: Numba's own load
        return type(codegen).unserialize_library(codegen, libdata[:3])
    name, _, (object_code, bitcode), symbols = libdata
    library = _deferred(type(codegen)._library_class)(codegen, name)
    library._bitcode = bitcode
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library._finalize_final_module()
    engine._defined_symbols.update(symbols)
    return library


@functools.cache
def _deferred(base: type) -> type:
    """Numba's code library class `base`, its module for linking parsed from its bitcode
    when first asked for (Numba's `_unserialize` parses it at once)."""

    class Deferred(base):  # type: ignore[valid-type, misc]
        _bitcode: bytes | None = None
        _parsed: Any = None

        @property
        def _shared_module(self) -> Any:
            if self._parsed is None and self._bitcode is not None:
                import llvmlite.binding as llvm

                self._parsed, self._bitcode = llvm.parse_bitcode(self._bitcode), None
            return self._parsed

        @_shared_module.setter
        def _shared_module(self, module: Any) -> None:
            self._parsed = module

    Deferred.__name__ = Deferred.__qualname__ = base.__name__
    return Deferred


class _Unpickler(pickle.Unpickler):
    """Unpickles a compile result with its environments rebuilt by `_environment`."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("numba.core.environment", "_rebuild_env"):
            return _environment
        return super().find_class(module, name)


def _unpickle(payload: bytes) -> Any:
    return _Unpickler(io.BytesIO(payload)).load()


def _environment(module: str, consts: list[Any], name: str) -> Any:
    """Numba's `_rebuild_env` (the environment of a function compiled into a kernel: its
    module's globals, its constants), without importing `module` when it is one of
    Numba's own not imported yet: a kernel inlines functions of numba.np.arrayobj, whose
    import (with the string and list modules it imports) took 25-35 ms of CPU of every
    warm process, for globals that compiled code never reads (only object mode reads an
    environment's globals; nopython code reads its constants, kept here). The globals
    are then a dict holding the module's name (what saving the environment again needs)."""
    from numba.core import environment

    if module in sys.modules or not module.startswith("numba."):
        return environment._rebuild_env(module, consts, name)
    env = environment.lookup_environment(name)
    if env is None:
        env = environment.Environment({"__name__": module})
        env.consts[:] = consts
        env.env_name = name
        environment.Environment._memo[name] = env
    return env


def initialize_runtime(target_context: Any) -> None:
    """Numba's runtime (`rtsys.initialize`: its C functions for the linker, and a few
    functions in LLVM IR, reference counts and the like), those functions' machine code
    loaded from fastgrad's cache rather than compiled, as Numba does in every process
    (20-30 ms of CPU on the development machine, before the first kernel could load)."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.runtime import nrtdynmod, rtsys

    if getattr(rtsys, "_init", False):
        return
    # Under Numba's lock, which a compile holds when it initialises the runtime itself: no
    # other thread sees the function replaced (CPUContext.load_additional_registries).
    with global_compiler_lock:
        original = nrtdynmod.compile_nrt_functions
        nrtdynmod.compile_nrt_functions = functools.partial(_runtime_library, original)
        try:
            rtsys.initialize(target_context)
        finally:
            nrtdynmod.compile_nrt_functions = original


def _runtime_library(compile_functions: Callable[[Any], Any], context: Any) -> Any:
    """The code library of Numba's runtime functions (`nrtdynmod.compile_nrt_functions`),
    from the cache behind its digest, else compiled and stored (`compile_functions` if the
    module cannot be built with its machine code kept)."""
    from numba.core import config
    from numba.core.runtime import nrtdynmod

    codegen = context.codegen()
    # Numba's debug settings change these functions' code (NUMBA_DEBUG_NRT prints each
    # reference count change): a process without them must not load one built with them.
    debug = (config.DEBUG_NRT, config.DEBUG_NRT_STACK_LIMIT, config.NRT_STATS)
    parts = [environment_tag(), _FORMAT, "numba runtime", repr(codegen.magic_tuple()), repr(debug)]
    key = "\n".join(parts).encode()
    path = directory() / f"numba_runtime.{hashlib.sha256(key).hexdigest()[:40]}.nbm"
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        blob = None
    except OSError as error:
        cache_unusable(path, error)
        return compile_functions(context)
    if blob is not None:
        try:
            library = _library(codegen, pickle.loads(unsealed(key, blob)))
        except Exception:  # damaged, moved, or from an incompatible build: compile instead
            COUNTERS.dropped += 1
            _unlink(path)
        else:
            return library
    create = getattr(nrtdynmod, "create_nrt_module", None)
    if create is None:  # another Numba: its own compile, not stored
        return compile_functions(context)
    module, library = create(context)
    library.enable_object_caching()  # keeps the machine code for serialize_using_object_code
    library.add_ir_module(module)
    library.finalize()
    if not library.has_dynamic_globals:
        payload = pickle.dumps((*library.serialize_using_object_code(), _defined_symbols(library)))
        try:
            write_atomically(path, sealed(key, payload))
        except OSError as error:
            cache_unusable(path, error)
    return library


def sealed(key: bytes, payload: bytes) -> bytes:
    """A cache file's bytes: a sha256 of `key` (what the file is for) and `payload`, then
    `payload`."""
    return hashlib.sha256(key + payload).digest() + payload


def unsealed(key: bytes, blob: bytes) -> bytes:
    """The payload of `blob` (`sealed` bytes), checked before anything in it is read:
    ValueError if it is damaged, or another file's (sealed under another key)."""
    payload = blob[_DIGEST:]
    if hashlib.sha256(key + payload).digest() != blob[:_DIGEST]:
        raise ValueError("digest mismatch")
    return payload


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


class OnceLock:
    """The lock of a compile made once per process (the plan interpreter's loop, the cut
    of matrix products, the vector rows), made anew in a forked child: the compile thread
    that held it at the fork, waiting there for Numba's compiler lock, which the forking
    thread takes (runtime.compile_fork), does not exist in the child, whose own compile
    would wait for it forever (its plans running step by step, or products never cut)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self.lock = threading.Lock()

    def __enter__(self) -> OnceLock:
        self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def cached_cfunc(fn: Callable[..., Any], signature: Any, tag: str | None) -> Any:
    """`fn` compiled as a C function (Numba's CFunc, without the GIL) of Numba signature
    `signature`, its machine code kept in fastgrad's cache under `tag` (as `cached_njit`;
    no tag: compiled in memory only)."""
    from numba.core.ccallback import CFunc

    options = {"nogil": True}
    function = CFunc(fn, (signature.args, signature.return_type), locals={}, options=options)
    if tag:  # read before it compiles
        function._cache = MachineCodeCache(fn, tag, folder="adapters")
    function.compile()
    return function


def helper_njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """`numba.njit(**options)` for a helper that compiled code calls, compiled once per
    kind of arguments rather than once per constant passed. Numba types a constant
    argument as a literal (`Literal[int](16)`) and compiles a callee again for each
    constant it is called with: runtime.gemm_split's helpers were compiled 25 times
    where 13 do. The helper's arguments are typed as their plain types instead (this
    reaches into Numba's `_compiler.fold_argument_types`: check it on Numba upgrades).

    >>> twice = helper_njit()(lambda x: 2 * x)
    >>> twice(4)
    8
    """
    import numba
    from numba.core import types

    def decorate(fn: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(**options)(fn)
        fold = dispatcher._compiler.fold_argument_types

        def folded(args: Any, kws: Any) -> Any:
            signature, folded_args = fold(args, kws)
            return signature, tuple(types.unliteral(a) for a in folded_args)

        dispatcher._compiler.fold_argument_types = folded
        return dispatcher

    return decorate


# Helpers that ops build for kernels to call (gamma's sampler) are cached like kernels.
jit_hook.install(cached_njit)
