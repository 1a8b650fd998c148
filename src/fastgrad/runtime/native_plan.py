"""A warm process's plans lowered and run before Numba is imported: the kernels' final
variants, their adapters and the interpreter's loop (runtime.vm's `_run_table`) loaded
from their stored machine code by runtime.native_code, the loop called through ctypes.

A kernel step whose final variant is stored and loads this way (a parallel one too, its
threading layer started as Numba would start it: runtime.threading_layer; not where the
user chose a layer but TBB) settles on it (`settle`): the same machine code
Numba would load, so its tier has nothing left to wait for and hands the compile thread
no compile (no Numba import). Where the loop is small (llvmlite's import, ~26 ms of CPU,
and the loads would cost its first call more than NumPy running it) the compile thread
loads it (`Load`, ahead of any compile) while the first call runs on NumPy, and the
first call that finds it loaded settles on it. A plan whose steps all settle so is
lowered at the end of the next run (runtime.plan_table, with `loop()`), its segments
run by `Runner`: the arrays' addresses written into the table from Python, then the
loop called, what run_steps does in compiled code. Rows that need code only Numba's
import gives (a product the cut's worker would split, products with a dimension of 1,
scan loops) stay host steps.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import warnings
from typing import Any

import numpy as np

from fastgrad.compiler import machine_code
from fastgrad.compiler.kernel_cache import kernel_key, needs_build
from fastgrad.core import compile_log
from fastgrad.core.config import config
from fastgrad.runtime import background, native_code, numba_load, threading_layer, vm_rows
from fastgrad.runtime.vm_rows import LOOP_FUNCTION, loop_source_tag

#: The interpreter loop's C type: `void f(int64* table, int64 at)` (vm.TABLE_SIGNATURE).
LOOP = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
_LOOP_SIGNATURE = "(int64*, int64) -> none"  # str() of vm.TABLE_SIGNATURE


def settle(tier: Any, step: Any, env: list[Any]) -> bool:
    """Install the final variant of `step`'s kernel loaded without Numba as `step.kernel`
    and settle the step (`step.tier = None`): True if it is stored and loads (a parallel
    one where runtime.threading_layer can start Numba's layer without Numba), and
    this call's operands are C-contiguous (the layouts the plan keeps); else False (asked
    once per tier). Loaded in this call only where that costs nothing or pays back within
    it (`native_code.worth_loading`), or the call waits for its kernels (sync mode,
    `compile`, `warmup`); otherwise handed to the compile thread (`Load`: False, and the
    tier answers with NumPy until it is loaded)."""
    if tier.loading is not None:
        return False  # loading on the compile thread: the tier answers (`Load.answer`)
    final = tier.stored[-1]
    if (
        not native_code.ENABLED
        or config.runtime != "vm"  # (step by step, Numba's dispatcher costs less a call)
        or (getattr(step, "parallel", False) and not threading_layer.loads_parallel_kernels())
        or (found := _stored(final, step)) is None
        or not native_code.contiguous(step, env)
    ):
        return False
    shape, key = found
    if not (
        tier.wait
        or config.compile == "sync"
        or native_code.known(key)
        or native_code.worth_loading(tier, work := _excess(tier, final.source))
        or _worth_with_others(work)
    ):
        tier.loading = Load.of(final, shape, key)
        return False
    kernel = native_code.kernel(final.source, shape)
    if kernel is None:
        return False
    step.kernel, step.tier = kernel, None
    return True


#: The work (`native_code.excess`) of the loops a first call has left to NumPy so far,
#: beyond which it loads the rest itself, though none alone pays for llvmlite's import;
#: loops under `SMALL_WORK` are not counted (NumPy's cost there is its calls', which a
#: kernel called through ctypes pays much of too). Bench M2's nine loops (2^17-2^22
#: each, 2^23 in all, its first two 2^20.1) answered its warm first call in 185-288 ms
#: of wall on NumPy (its blocks on two threads) against 69-149 loaded, the import
#: included; the T=200 RNN's 599 (2^12-2^14 each, 2^20 in all) in 112 ms of CPU against
#: 132 (f32, load 3-5).
CALL_WORK, SMALL_WORK = 1 << 20, 1 << 16


def _stored(final: Any, step: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """The adapter signature of `step` (a kernel step, runtime.plan_steps) and its
    native_code `_key` with `final` (the step's final variant), if that is stored; else
    None. Kept per kernel and form of step (`_Form`, with its sizes' count and scalars'
    types, NumPy's: a Python int's dtype follows its value): an unrolled loop's steps
    share a few (the T=200 RNN's 599: 6; ~4 us a step asked afresh)."""
    types = tuple(map(type, step.scalars))
    kind = (getattr(step, "_form", None), len(step.sizes), types)
    known = _STORED.get(id(final))
    if known is not None and known[0] is final and known[1] == kind:
        return known[2]
    shape = getattr(step, "adapter_signature", lambda: None)()
    if shape is None or needs_build(final.source):
        return None  # (asked again: stored since, maybe)
    found = shape, native_code._key(final.source, shape)
    if kind[0] is not None and all(issubclass(t, np.generic) for t in types):
        _STORED[id(final)] = (final, kind, found)  # (`final` kept: its id is not reused)
    return found


_STORED: dict[int, tuple[Any, tuple[Any, ...], tuple[Any, tuple[Any, ...]]]] = {}


def _excess(tier: Any, source: str) -> int:
    """`native_code.excess(tier)`, kept by the loop's kernel and shape: an unrolled loop's
    steps share a few (the T=200 RNN's 599: 6)."""
    work = _EXCESS.get((source, tier.shape))
    if work is None:
        work = _EXCESS[source, tier.shape] = native_code.excess(tier)
    return work


def _worth_with_others(work: int) -> bool:
    """Whether the loops of the first call under way that NumPy answers, this one (of
    `work`, `native_code.excess`) with them, add up to `CALL_WORK` (counted on that
    call's `background.Batch`; not in a first call, in background mode: False)."""
    batches = background._batches.open  # (the first calls under way in this thread)
    if not batches:
        return False
    batch = batches[-1]
    batch.native_work = getattr(batch, "native_work", 0) + (work if work >= SMALL_WORK else 0)
    return bool(batch.native_work >= CALL_WORK)


_EXCESS: dict[tuple[str, tuple[int, ...]], int] = {}


class Load:
    """A job of the compile thread (runtime.background's interface: run, drop, done,
    settled, apart, later, label, source): a stored final kernel and its adapter loaded
    without Numba (llvmlite's import first, once per process, then the interpreter's
    loop and the segments' entry, which lowering takes at a later call), so that a first
    call of small loops keeps NumPy's speed. Queued ahead of every kernel's compile
    (`first`): a plan whose kernels all load so never imports Numba; where Numba's import
    is to come anyway (`_numba_to_come`), it comes first. One job per kernel and adapter
    signature, shared by the tiers asking for it."""

    apart = later = False
    first = True
    # What the watchdog's warning says follows where a load outruns compile_timeout.
    overdue = "it loads machine code stored before (no compile); the loop takes Numba's path"

    def __init__(self, source: Any, shape: Any):
        self.source, self.shape = source, shape  # (a KernelSource: the watchdog reads it)
        self.label = f"stored kernel fastgrad_kernel_{kernel_key(source.source)} (no Numba)"
        self.kernel: native_code.NativeKernel | None = None
        self.error: BaseException | None = None
        self.done, self.settled = threading.Event(), threading.Event()

    @classmethod
    def of(cls, source: Any, shape: Any, key: tuple[Any, ...]) -> Load:
        """The job loading `source` for `shape` (`key`: native_code's `_key` of them), made
        and handed over when first asked."""
        job = _LOADS.get(key)  # (no lock once made: an unrolled loop's steps share a few)
        if job is not None:
            return job
        with _LOADS_LOCK:
            job = _LOADS.get(key)
            new = job is None
            if new:
                job = _LOADS[key] = cls(source, shape)
        if new:
            background.submit(job)
        return job

    def run(self) -> None:
        start = time.perf_counter()
        try:
            if _numba_to_come():  # (its import brings llvmlite's: loads are cheap after it)
                background.load_numba()
            self.kernel = native_code.kernel(self.source.source, self.shape)
            # A fork's handler holds numba_load's lock for the fork: not a refusal (kept by
            # every tier of this kernel, sending the process to Numba), so ask again.
            while self.kernel is None and native_code.undecided():
                if time.perf_counter() - start > config.compile_timeout:
                    break
                time.sleep(0.002)
                self.kernel = native_code.kernel(self.source.source, self.shape)
            if self.kernel is not None and "numba" not in sys.modules and loop() is not None:
                _entry()  # (with Numba imported, lowering takes Numba's path: runtime.vm)
        except Exception as error:  # (a bug: its tier says so, then takes the usual path)
            self.error = error
        seconds = time.perf_counter() - start
        compile_log.log_kernel_ready(self.label, self.kernel is not None, False, seconds)
        self.done.set()
        self.settled.set()

    def drop(self) -> None:
        self.settled.set()

    def answer(self, tier: Any, step: Any, env: list[Any], bound: Any) -> bool | None:
        """For `tier` (a KernelTier whose `loading` is this job) at a call of `step`: True
        while the job runs, the loop run with NumPy (`bound`: KernelTier.answer's), unless
        the call waits for its kernels (then for the job); False once the loaded kernel is
        `step.kernel` and the step settled; None where nothing loaded (not stored after
        all, damaged, a symbol unknown, the process forked amid the load): the tier goes
        on as if never asked, Numba's way."""
        if not self.settled.is_set():
            if not (tier.wait or config.compile == "sync"):
                tier.numpy_loop.run(env, bound)
                return True
            background.wait_for(self)
        tier.loading = None
        if self.error is not None and not tier.warned:
            tier.warned = True
            warnings.warn(
                f"fastgrad: loading the {self.label} failed ({type(self.error).__name__}: "
                f"{self.error}); this loop runs with NumPy until Numba's kernel is ready",
                RuntimeWarning,
                stacklevel=3,
            )
        kernel = self.kernel  # (read once: an overdue job may still end)
        if kernel is None or not native_code.contiguous(step, env):
            return None
        step.kernel, step.tier = kernel, None
        return False


_LOADS: dict[tuple[Any, ...], Load] = {}
_LOADS_LOCK = threading.Lock()


def _numba_to_come() -> bool:
    """Whether Numba is imported, or a kernel's job (whose run imports it) is queued or
    running: a plan with a parallel kernel (or one to compile) reaches its steady state
    sooner with Numba's import first than behind llvmlite's and the loads (bench M2)."""
    if numba_load.imported("numba") is not None:
        return True
    inflight = list(getattr(background._WORKER, "inflight", ()))  # (a test's may have none)
    return any(isinstance(job, background.Job) for job in inflight)


_LOOP_ADDRESS: list[int | None] = []


def loop() -> int | None:
    """The address of the interpreter's loop loaded from its stored machine code (as
    runtime.vm's `table_function` stores it), or None: not stored, or not loadable."""
    if not _LOOP_ADDRESS:
        made = native_code.engine()
        if made is None:
            return None  # (asked again: Numba's import may have been under way)
        name = f"fastgrad.runtime.vm._run_table[{loop_source_tag()}]"
        path, key = machine_code.file_for("adapters", "", name, _LOOP_SIGNATURE, made.magic)
        with native_code._LOCK:
            if not _LOOP_ADDRESS:  # (the compile thread's Load may have loaded it meanwhile)
                _LOOP_ADDRESS.append(made.load(path, key))
    return _LOOP_ADDRESS[0]


# Where CPython and NumPy keep what the entry reads (their C structs' layouts on a 64-bit
# build, as their C APIs' macros read them): a tuple's items after its variable-size
# object head (PyTupleObject.ob_item), an array's data pointer after its object head
# (PyArrayObject_fields.data).
_TUPLE_ITEMS, _ARRAY_DATA = 24, 16


def _entry_ir() -> str:
    """LLVM IR of `entry(int64* table, int64 at, PyObject* arrays)`: run_steps without
    Numba: the data pointers of the tuple `arrays` into the pointer entries the
    segment's record at `table[at]` names, then the loop at `table[LOOP_FUNCTION]`."""
    from llvmlite import ir

    i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
    loop_type = ir.FunctionType(ir.VoidType(), [i64.as_pointer(), i64])
    module = ir.Module("fastgrad_native_entry")
    function = ir.Function(
        module, ir.FunctionType(ir.VoidType(), [i64.as_pointer(), i64, i8p]), "native_entry"
    )
    table, at, arrays = function.args
    start, body, end = (function.append_basic_block(n) for n in ("start", "body", "end"))
    b = ir.IRBuilder(start)

    def entry(index: Any) -> Any:
        return b.load(b.gep(table, [index]))

    count = entry(b.add(at, i64(2)))
    ptrs = entry(i64(2))
    b.cbranch(b.icmp_signed(">", count, i64(0)), body, end)
    b.position_at_end(body)
    k = b.phi(i64)
    k.add_incoming(i64(0), start)
    item = b.gep(arrays, [b.add(i64(_TUPLE_ITEMS), b.mul(k, i64(8)))])
    array = b.load(b.bitcast(item, i8p.as_pointer()))
    data = b.load(b.bitcast(b.gep(array, [i64(_ARRAY_DATA)]), i64.as_pointer()))
    slot = b.add(ptrs, entry(b.add(b.add(at, i64(3)), k)))
    b.store(data, b.gep(table, [slot]))
    following = b.add(k, i64(1))
    k.add_incoming(following, body)
    b.cbranch(b.icmp_signed("<", following, count), body, end)
    b.position_at_end(end)
    b.call(b.inttoptr(entry(i64(LOOP_FUNCTION)), loop_type.as_pointer()), [table, at])
    b.ret_void()
    return str(module)


#: The entry's C type: the table's address, the record's place, the tuple of arrays.
ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.py_object)
_ENTRY: list[Any] = []


def _entry() -> Any:
    """The entry (`_entry_ir`), loaded once into the engine holding the loaded files."""
    made = native_code.engine()
    assert made is not None  # (the loop, loaded by it, is what runs)
    with native_code._LOCK:
        if not _ENTRY:
            made.engine.add_object_file(made.llvm.ObjectFileRef.from_data(_entry_code(made)))
            made.engine.finalize_object()
            _ENTRY.append(ENTRY(made.engine.get_function_address("native_entry")))
        return _ENTRY[0]


def _entry_code(made: Any) -> bytes:
    """The entry's machine code for `made` (native_code's engine), stored in fastgrad's
    cache beside the adapters (compiling it cost each process ~7 ms of the compile
    thread's CPU, loading it ~1); compiled and stored where missing or damaged."""
    tag = machine_code.source_tag("native entry", __file__, vm_rows.__file__)
    name = f"fastgrad.runtime.native_plan.entry[{tag}]"
    path, key = machine_code.file_for("adapters", "", name, "entry", made.magic)
    try:
        return machine_code.unsealed(key, path.read_bytes())
    except (OSError, ValueError):  # not stored yet, or damaged
        pass
    module = made.llvm.parse_assembly(_entry_ir())
    module.verify()
    code: bytes = made.machine.emit_object(module)
    try:
        machine_code.write_atomically(path, machine_code.sealed(key, code))
    except OSError:
        pass  # (a read-only cache: compiled again by the next process)
    return code


class Runner:
    """A segment's entry (the signature of runtime.small_call's `entry_point`): the
    compiled `_entry_ir` on the table, which the loop at `address` runs; ctypes lets
    the GIL go meanwhile (the caller holds the arrays)."""

    def __init__(self, address: int, table: np.ndarray, at: int):
        assert table[LOOP_FUNCTION] == address
        self.call = _entry()
        self.table, self.address = table, table.ctypes.data  # (the table never moves)

    def __call__(self, table: np.ndarray, at: int, arrays: tuple[np.ndarray, ...]) -> None:
        self.call(self.address, at, arrays)
