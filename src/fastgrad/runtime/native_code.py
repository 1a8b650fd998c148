"""Stored kernels run before Numba is imported: their machine code loaded with llvmlite
alone and called through ctypes.

A warm process (every kernel on disk) used to answer its first calls with NumPy while
the compile thread imported Numba (~0.2 s of CPU) and loaded the kernels. What a stored
file holds (compiler.machine_code) is an object file of Numba's engine and its symbols'
names; the cfunc wrapper of a kernel, an adapter (runtime.vm) and the interpreter's loop
need from outside only (measured on every stored file of W1-W4 and M1-M5): Python's C
API and libc (found in the process), Numba's helper library (`numba_gil_ensure`,
`numba_do_raise`, ... : error paths) and Numba's runtime (`NRT_MemInfo_call_dtor`, ...:
reference counts), whose addresses their extension modules list (`c_helpers`), loaded here
without the numba package; and, for parallel variants only, Numba's threading layer
(`numba_parallel_for`, `do_scheduling_unsigned`, `get_num_threads`, ...), which
runtime.threading_layer starts as Numba would (TBB, from its extension module) when the
first such file loads, where Numba would choose TBB. A file whose undefined symbols are
not all known is not loaded (so parallel variants wait for Numba where the user chose
another layer), and a file whose digest does not match is left to the usual path: never
a crash, never a wrong result.

A kernel runs through its adapter (the C function of one signature the plan interpreter
calls kernels by: compiler.codegen.adapter) with the row, pointers and floats written
from Python: the machine code the interpreter runs later, so the same bits.
`import llvmlite.binding` costs ~26 ms of CPU, each file ~0.5 ms (Numba's import:
~200 ms); a process that never finds its kernels on disk never imports it.
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
import pickle
import struct
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastgrad.compiler import machine_code
from fastgrad.compiler.codegen.adapter import FLOATS, adapter_source
from fastgrad.compiler.kernel_cache import FOLDER, STATS, kernel_key, needs_build
from fastgrad.core.config import config
from fastgrad.runtime import numba_load, threading_layer

# FASTGRAD_NATIVE=0 turns this path off: kernels wait for Numba as before.
ENABLED = os.environ.get("FASTGRAD_NATIVE", "1") != "0"
# Numba settings that change the CPU its machine code is keyed by: left to Numba.
_NUMBA_CPU = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_ENABLE_AVX")
ADAPTER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_ADAPTER_SIGNATURE = "(int64*, int64*, float64*) -> none"  # str() of vm.ADAPTER_SIGNATURE
_LOCK = threading.Lock()  # held while llvmlite is imported and LLVM links code (`_Fork`)


class _Engine:
    """One LLVM execution engine holding the loaded files, with Numba's symbols known."""

    def __init__(self) -> None:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.llvm = llvm
        features = llvm.get_host_cpu_features().flatten()
        # What Numba's codegen keys its machine code by (CPUCodegen.magic_tuple).
        self.magic = repr((llvm.get_process_triple(), llvm.get_host_cpu_name(), features))
        target = llvm.Target.from_default_triple()
        machine = target.create_target_machine(codemodel="jitdefault", jit=True)
        self.machine = machine  # (what code compiled here is emitted by: runtime.native_plan)
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
        self.loaded: dict[tuple[Path, bytes], int | None] = {}  # (twice: defined twice)
        _add_numba_symbols(llvm)

    def load(self, path: Path, key: bytes) -> int | None:
        """The address of the C function stored in `path` (its digest checked against
        `key`), or None: missing, damaged, or needing a symbol not known yet."""
        if (path, key) not in self.loaded:
            self.loaded[path, key] = self._load(path, key)
        return self.loaded[path, key]

    def _load(self, path: Path, key: bytes) -> int | None:
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        try:
            payload = machine_code.unsealed(key, blob)
        except ValueError:
            return None
        try:
            library = _Unpickler(io.BytesIO(payload)).load()[0]
            _, kind, (object_code, _), symbols = library
        except Exception:  # another layout (a library stored by Numba's own cache)
            return None
        entry = "cfunc." + symbols[0]
        if kind != "object" or entry not in symbols:
            return None
        try:
            missing = [s for s in undefined(object_code) if not self.llvm.address_of_symbol(s)]
        except (ValueError, struct.error, IndexError):  # not an object file this reads
            return None
        if missing and set(missing) <= threading_layer.SYMBOLS.keys():  # a parallel kernel
            symbols = threading_layer.native_symbols()  # (its threads started, if not yet)
            for name, address in (symbols or {}).items():
                self.llvm.add_symbol(name, address)
            missing = [s for s in missing if not self.llvm.address_of_symbol(s)]
        if missing:  # resolving it later would abort the process (LLVM's fatal error)
            return None
        self.engine.add_object_file(self.llvm.ObjectFileRef.from_data(object_code))
        self.engine.finalize_object()
        return self.engine.get_function_address(entry) or None


def _add_numba_symbols(llvm: Any) -> None:
    """Tell LLVM the addresses Numba tells it at its import (numba.core.base's
    `_load_global_helpers`, the runtime's `initialize`): its helper library's and its
    runtime's C functions, read from their extension modules loaded without the numba
    package (the same shared objects Numba's import maps later: the same addresses)."""
    # Not beside Numba's import on the compile thread (it would load the same modules):
    # then this path waits for a later call (`_Busy`), for it may never wait for that
    # import, which pauses while a first call runs.
    if not numba_load.LOCK.acquire(blocking=False):
        raise _Busy
    try:
        helpers = numba_load.extension("numba._helperlib")
        runtime = numba_load.extension("numba.core.runtime._nrt_python")
        runtime.memsys_use_cpython_allocator()  # as numba.core.runtime.nrt's import does
    finally:
        numba_load.LOCK.release()
    for name, address in helpers.c_helpers.items():
        llvm.add_symbol("numba_" + name, address)
    for name, address in runtime.c_helpers.items():
        llvm.add_symbol(name if name.startswith("_") else "NRT_" + name, address)
    llvm.add_symbol("_Py_NoneStruct", id(None))
    import builtins

    for value in vars(builtins).values():
        if isinstance(value, type) and issubclass(value, BaseException):
            llvm.add_symbol(f"PyExc_{value.__name__}", id(value))


class _Busy(Exception):
    """Numba is being imported on another thread."""


class _Stub:
    """Stands for any of Numba's objects in a stored compile result: only the library's
    plain data (names, bytes) is read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] in ("numba", "llvmlite", "fastgrad") or "cloudpickle" in module:
            return _Stub
        return super().find_class(module, name)


def undefined(object_code: bytes) -> list[str]:
    """The names of the symbols an ELF64 little-endian object file uses but does not
    define; an object file of another kind raises ValueError."""
    if object_code[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not an ELF64 little-endian object file")
    (shoff,) = struct.unpack_from("<Q", object_code, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", object_code, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", object_code, shoff + i * shentsize) for i in range(shnum)
    ]
    names = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for at in range(offset + entsize, offset + size, entsize):  # (entry 0 is null)
            name, _, _, shndx = struct.unpack_from("<IBBH", object_code, at)
            if shndx == 0 and name:
                end = object_code.index(b"\0", strings + name)
                names.append(object_code[strings + name : end].decode())
    return names


_ENGINE: list[_Engine | None] = []  # the engine once made (None: this path is unavailable)


class _Fork(threading.local):
    """A fork waits for a load under way (the compile thread imports llvmlite and links
    files: runtime.native_plan.Load): a child would find `_LOCK` held by a thread it does
    not have, and maybe LLVM's engine half-changed. Where the wait times out, the child
    takes the usual path (Numba's) for what it has not loaded yet. (The child's lock is
    released, not replaced: its compile thread, started by an earlier handler, may
    already wait for it.)"""

    held = False

    @classmethod
    def before(cls) -> None:
        _FORK.held = _LOCK.acquire(timeout=config.compile_timeout)

    @classmethod
    def in_parent(cls) -> None:
        if _FORK.held:
            _LOCK.release()

    @classmethod
    def in_child(cls) -> None:
        if not _FORK.held:  # a load never ended: the engine may be half-changed
            _ENGINE[:] = [None]
        if _LOCK.locked():  # (by the fork, or by a thread the child does not have)
            _LOCK.release()


_FORK = _Fork()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_Fork.before, after_in_parent=_Fork.in_parent)
    os.register_at_fork(after_in_child=_Fork.in_child)


def engine() -> _Engine | None:
    """The execution engine, made on first use; None where this path cannot run."""
    with _LOCK:
        if not _ENGINE:
            made = None
            if ENABLED and sys.platform == "linux" and not any(map(os.environ.get, _NUMBA_CPU)):
                try:
                    made = _Engine()
                except _Busy:
                    return None  # asked again at a later call
                except Exception:  # no llvmlite, no numba, another layout: Numba's path
                    made = None
            _ENGINE.append(made)
        return _ENGINE[0]


def started() -> bool:
    """Whether the engine is made (loading more files is then cheap)."""
    return bool(_ENGINE) and _ENGINE[0] is not None


def undecided() -> bool:
    """Whether the engine is neither made nor refused: its making found runtime.numba_load's
    lock taken (Numba's import, or a fork's handler holding it across the fork)."""
    return not _ENGINE


_SCALAR_TYPES = {"float64", "float32", "int64", "int32", "bool"}


def kernel_types(nsizes: int, scalars: Sequence[str], operands: Sequence[tuple[int, str]]) -> str:
    """`str()` of the Numba argument types an adapter hands a kernel
    (runtime.kernel_entry.kernel_signature), written without Numba.

    >>> kernel_types(1, ["float32"], [(2, "float64")])
    "(int64, int64, float32, Array(float64, 2, 'C', False, aligned=True))"
    """
    names = ["int64"] * (nsizes + 1) + list(scalars)
    names += [f"Array({d}, {n}, 'C', False, aligned=True)" for n, d in operands]
    return "(" + ", ".join(names) + ")"


@functools.cache
def _entry_tag() -> str:
    """runtime.kernel_entry.source_tag(), without importing that module (it imports Numba)."""
    path = Path(__file__).with_name("kernel_entry.py")
    return machine_code.source_tag("kernel entry", path)


class NativeKernel:
    """A kernel called with a step's arguments (sizes, chunks, scalars, arrays, as its
    Numba dispatcher is) through its adapter at `adapter`, the kernel at `address`."""

    def __init__(self, adapter: int, address: int, nsizes: int, scalars: Sequence[str]):
        self.call = ADAPTER(adapter)
        self.adapter = adapter  # (the plan interpreter calls it so: runtime.plan_table)
        self.address, self.head = address, nsizes + 1 + len(scalars)
        self.floats = [dtype in FLOATS for dtype in scalars]

    def __call__(self, *args: Any) -> None:
        arrays = args[self.head :]
        row = [self.address, *map(int, args[: self.head - len(self.floats)])]
        floats = []
        for value, is_float in zip(
            args[self.head - len(self.floats) : self.head], self.floats, strict=True
        ):
            if is_float:
                row.append(len(floats))
                floats.append(float(value))
            else:
                row.append(int(value))
        pointers = []
        for j, array in enumerate(arrays):
            pointers.append(array.__array_interface__["data"][0])
            row += [j, *array.shape]
        # ctypes arrays, passed as pointers: NumPy arrays and their ctypes.data cost ~4.5 us
        # more a call (the first of the T=200 RNN's calls running its 599 steps so).
        self.call(
            (ctypes.c_int64 * len(row))(*row),
            (ctypes.c_int64 * len(pointers))(*pointers),
            (ctypes.c_double * max(1, len(floats)))(*floats),
        )  # (the arrays are held until it returns)


_KERNELS: dict[tuple[Any, ...], NativeKernel | None] = {}


def kernel(source: str, shape: tuple[int, list[str], list[tuple[int, str]]]) -> NativeKernel | None:
    """The kernel in `source` for the adapter signature `shape` (nsizes, scalars'
    dtypes, operands' ranks and dtypes: _KernelStep.adapter_signature), loaded from
    fastgrad's cache, or None (not stored, damaged, needs Numba)."""
    key = _key(source, shape)
    if key in _KERNELS:
        return _KERNELS[key]
    made = engine()
    if made is None:
        return None  # (not kept: Numba's import may have been under way)
    found = None
    if not any(d not in _SCALAR_TYPES for d in shape[1]):
        name = kernel_key(source)
        module = f"fastgrad_kernel_{name}"
        path, file_key = machine_code.file_for(
            FOLDER, module + ".", f"{module}.kernel[{name}]", kernel_types(*shape), made.magic
        )
        text = adapter_source(*shape)
        tag = kernel_key(text + _entry_tag())
        adapter_path, adapter_key = machine_code.file_for(
            "adapters", "", f"fastgrad_adapter_{tag}.adapter[{tag}]", _ADAPTER_SIGNATURE, made.magic
        )
        with _LOCK:
            address = made.load(path, file_key)
            adapter = made.load(adapter_path, adapter_key) if address else None
        if address and adapter:
            found = NativeKernel(adapter, address, shape[0], shape[1])
            STATS.native_loads += 1
    _KERNELS[key] = found
    return found


def known(key: tuple[Any, ...]) -> bool:
    """Whether `kernel(source, shape)` answers at once (`key`: `_key(source, shape)`):
    asked before, or the path cannot run here."""
    return key in _KERNELS or _ENGINE == [None]


def _key(source: str, shape: tuple[int, list[str], list[tuple[int, str]]]) -> tuple[Any, ...]:
    return (source, shape[0], tuple(shape[1]), tuple(shape[2]))


# When a first call takes this path for a loop rather than NumPy (or waiting for Numba),
# counted as what NumPy costs beyond the kernel (element-ops counted as float64's, less
# 4 per element: a loop of a few ops runs about as fast on NumPy's two threads, over
# blocks, as on one kernel's): llvmlite's import ~26 ms of CPU once (30-70 wall under
# load), then ~0.5 ms a kernel and its adapter. A loop NumPy runs whole (not over blocks:
# each op's call is long) needs more: W2's loss (34 ops over 4096 x 1000 in f32, 2^26.9
# counted so) answered its warm first call in 110 ms on NumPy against 176 through its
# kernel, llvmlite imported (f32, load 6); M3's 93 ops over 10^6 (2^25.4, over blocks)
# in 90-230 against 365-487.
IMPORT_WORK, WHOLE_WORK, LOAD_WORK = 1 << 25, 1 << 28, 1 << 20


def for_tier(tier: Any, step: Any, env: list[Any]) -> NativeKernel | None:
    """The kernel of `step` (a kernel step, runtime.plan_steps) loaded without Numba, for
    its tier (runtime.background.KernelTier) while Numba's is not ready: when its machine
    code is on disk (the final variant first; a parallel one where Numba's threading
    layer can start without Numba, runtime.threading_layer), the loop's work is worth
    loading it (above) and this call's operands are C-contiguous. The tier keeps it in
    `tier.native` (False: never)."""
    if tier.native is False:
        return None
    if tier.native is None:
        if not ENABLED:
            tier.native = False
            return None
        if not worth_loading(tier):  # (first: the cheapest question)
            return None  # asked again at the next call
        stored = [v for v in reversed(tier.stored) if not needs_build(v.source)]
        shape = getattr(step, "adapter_signature", lambda: None)()
        if not stored or shape is None:
            tier.native = False
            return None
        if engine() is None:
            if not _ENGINE:  # Numba's import on the compile thread holds its lock
                return None  # asked again at the next call
            tier.native = False
            return None
        found = (kernel(v.source, shape) for v in stored)
        tier.native = next((k for k in found if k is not None), False)
        if tier.native is False:
            return None
    return tier.native if contiguous(step, env) else None  # type: ignore[no-any-return]


def worth_loading(tier: Any, work: int | None = None) -> bool:
    """Whether the loop of `tier` (runtime.background.KernelTier; `work`: its `excess`,
    if known) does enough work that loading its kernel in this call (llvmlite's import
    too, if not done yet) costs less than NumPy running it (`IMPORT_WORK`, `WHOLE_WORK`,
    `LOAD_WORK` above)."""
    if started():
        least = LOAD_WORK
    else:
        least = IMPORT_WORK if tier.numpy_loop.blocked is not None else WHOLE_WORK
    return (excess(tier) if work is None else work) >= least


def excess(tier: Any) -> int:
    """What NumPy costs beyond the kernel for the loop of `tier`, as counted above."""
    return int(tier._work() - 4 * tier._work(ops=1))


def contiguous(step: Any, env: list[Any]) -> bool:
    """Whether the arrays a kernel step hands its kernel this call are C-contiguous (the
    layouts it was stored for; raveled inputs are copies), as a loaded kernel needs."""
    # (Plain loops: asked by each kernel step of a first call, the T=200 RNN's 599.)
    for slot, flat in zip(step.ins, step._reshape_in, strict=True):
        if not flat and not _c_contiguous(env[slot]):
            return False
    for slot in step._buffers:
        if slot is not None and not _c_contiguous(env[slot]):
            return False
    return True


def _c_contiguous(a: Any) -> bool:
    return isinstance(a, np.ndarray) and a.flags.c_contiguous
