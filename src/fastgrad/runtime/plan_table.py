"""Lower an arena's settled steps to segments for the plan interpreter (runtime.vm): each
run of kernels, matmuls and views becomes one call into compiled code; any other step
(a library call, a loop, a kernel checking indices that the same segment computes, a
matmul BLAS cannot take as it is) stays a host step, the arena's own prepared call.

Lowering happens at the end of a run, from the values that run left in its slots: their
layouts (shapes, strides, dtypes) are what the table is built for. A view's address is
its input's plus a fixed offset; a matmul's operands give BLAS its transpose flags and
leading dimensions. A segment checks at each call that the arrays it reads from outside
(arguments, host steps' results) have the layouts it was built for, and otherwise runs
its steps one by one: never a wrong answer.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from contextlib import nullcontext
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.adapter import ADAPTED, FLOATS, adapter_source
from fastgrad.core.config import config
from fastgrad.runtime import adapters, loop_table, plan_posts
from fastgrad.runtime.arena import PAGE, staggered_empty
from fastgrad.runtime.blas import OneThread, region_address
from fastgrad.runtime.gemm_bands import DEFAULT_MIN_WORK
from fastgrad.runtime.loop_row import rows as loop_rows
from fastgrad.runtime.native_plan import Runner
from fastgrad.runtime.native_plan import loop as native_loop
from fastgrad.runtime.plan_rows import gemm_row, vector_row, view_offset
from fastgrad.runtime.plan_steps import dtype_name
from fastgrad.runtime.small_call import drop, entry_point, take
from fastgrad.runtime.thread_budget import cuts_products
from fastgrad.runtime.vm_rows import DOT, GEMM, GEMV, KERNEL, NOBLAS, VIEW, pack


class Waiting:
    """Lowering waits for adapters being compiled: `ready()` says when to try again."""

    def __init__(self, jobs: Sequence[adapters.CompileJob]):
        self.jobs = list(jobs)

    def ready(self) -> bool:
        return all(job.settled.is_set() for job in self.jobs)


class _Table:
    """The step table under construction, shared by a plan's segments."""

    def __init__(
        self, env: list[Any], static: AbstractSet[int], wait: bool, one_thread: bool
    ) -> None:
        self.env, self.static, self.wait = env, static, wait
        self.one_thread = one_thread  # BLAS on one thread (a loop's bodies need it so)
        self.cut = one_thread and cuts_products()  # big products cut across the cores
        self.code: list[int] = []
        self.starts: list[int] = []
        self.floats: list[float] = []
        self.functions: dict[int, int] = {}  # address -> index in the function table
        self.pointer: dict[int, int] = {}  # env slot -> index in the pointer table
        self.fixed: dict[int, int] = {}  # pointer index -> address known once for all
        self.pending: list[adapters.CompileJob] = []  # adapters still compiling
        self.split = False  # whether a product is offered to the worker that cuts them
        self.posting = True  # and may be handed to it unwaited (gemm_split.POSTING)
        # What each row reads and writes (runtime.plan_posts): by where it starts in
        # `code`, (slots read, slots written, work); None: it may touch anything.
        self.effects: dict[int, plan_posts.Effect | None] = {}
        # Before Numba's import: the loop's stored machine code (runtime.native_plan), or
        # None (then Numba's path); its rows take no piece Numba builds.
        self.native: int | None = None

    def index(self, slot: int) -> int:
        return self.pointer.setdefault(slot, len(self.pointer))

    def function(self, address: int) -> int:
        return self.functions.setdefault(address, len(self.functions))

    def scalar(self, value: Any) -> int:
        if dtype_name(np.asarray(value).dtype) in FLOATS:
            self.floats.append(float(value))
            return len(self.floats) - 1
        return int(value)

    def append(self, row: list[int], effect: plan_posts.Effect | None = None) -> None:
        self.effects[len(self.code)] = effect
        self.starts.append(len(self.code))
        self.code += row


class Segment:
    """Steps `first` .. `first + count - 1` of the table, run by one call into the
    interpreter after the arrays they read from outside are checked and their fresh
    outputs are allocated; then the views Python needs are made."""

    interpreted = True  # computes nothing with NumPy (but when it falls back to its steps)

    def __init__(self, table: _Table, first: int):
        self.table, self.first, self.count = table, first, 0
        self.env = table.env
        self.host: list[Callable[[], None]] = []  # the same steps, one by one
        self.reads: list[tuple[int, tuple[int, ...], tuple[int, ...], np.dtype]] = []
        self.read_indices: list[int] = []
        self.read_slots: set[int] = set()  # (those of `reads`: a warm RNN's ~200 scanned per read)
        self.fresh: list[tuple[Any, ...]] = []  # (shape, dtype, k, view, slot, small)
        self.fresh_indices: list[int] = []
        self.produced: set[int] = set()  # slots this segment's steps write
        self.views: dict[int, tuple[int, Callable[[], None]]] = {}  # out -> (in, host call)
        self.view_steps: dict[int, Any] = {}  # out -> its view step (runtime.small_call)
        self.exported: set[int] = set()  # views whose arrays Python needs after the run
        self.exports: list[Callable[[], None]] = []
        # Kernels' index checks, on arrays read from outside: made before the run.
        self.checks: list[Callable[[list[Any]], None]] = []
        # Arrays a LOOP row writes that its step keeps (runtime.loop_row): (slot, array),
        # and the locks of the loops whose tables its LOOP rows run (taken for a run)
        self.kept: list[tuple[int, np.ndarray]] = []
        self.locks: list[Any] = []
        self.effect: plan_posts.Effect | None = None  # of the row being built

    def operand(self, slot: int) -> int:
        """The pointer index of an array a step reads: fixed (a buffer, a constant),
        written by this segment, or read from outside and checked at each call."""
        table = self.table
        index = table.index(slot)
        value = self.env[slot]
        if slot in table.static:
            if index not in table.fixed:  # (a fixed array's address, once: ~1.3 us each)
                table.fixed[index] = value.ctypes.data
        elif slot not in self.produced and slot not in self.read_slots:
            self.read_slots.add(slot)
            self.reads.append((slot, value.shape, value.strides, value.dtype))
            self.read_indices.append(index)
        return index

    def output(self, slot: int, fresh: tuple[Any, ...] | None) -> int:
        """The pointer index of an array a step writes: a buffer, or `fresh` (shape,
        dtype, k, view), allocated at each call."""
        if fresh is None:
            return self.operand(slot)
        shape, dtype, k, view = fresh
        small = math.prod(shape) * dtype.itemsize < PAGE  # staggered_empty's np.empty
        if small and view is not None:
            # The interpreter takes its address only: made in the graph's shape, no
            # reshape per call (a 0-d value's (1,) buffer cost ~0.2 us).
            shape, view = view, None
        self.fresh.append((shape, dtype, k, view, slot, small))
        self.fresh_indices.append(self.table.index(slot))
        self.produced.add(slot)
        return self.table.index(slot)

    def add(self, step: Any, call: Callable[[], None]) -> bool:
        """Append a step; False (nothing added) if it cannot run in the interpreter."""
        kind = type(step).__name__
        self.effect = None
        if kind == "LoopStep" and self.table.native:
            return False  # its bodies' tables need Numba's entry
        if kind == "LoopStep":  # a scan whose LOOP is built: its rows
            return self._rows(loop_rows(self, step), call)
        row = (
            self._kernel(step)
            if kind == "_KernelStep"
            else self._matmul(step)
            if kind == "MatmulStep"
            else self._view(step, call)
            if kind == "_ViewStep"
            else None
        )
        return self._rows(None if row is None else [row], call)

    def _rows(self, rows: list[list[int]] | None, call: Callable[[], None]) -> bool:
        if rows is None:
            return False
        for row in rows:
            self.table.append(row, self.effect if len(rows) == 1 else None)
        self.host.append(call)
        self.count += len(rows)
        return True

    def _arrays(self, slots: Sequence[int]) -> list[np.ndarray] | None:
        values = [self.env[slot] for slot in slots]
        return values if all(isinstance(v, np.ndarray) for v in values) else None

    def _kernel(self, step: Any) -> list[int] | None:
        source = getattr(step, "source", None)
        if (
            source is None
            or step.kernel is None
            or step.tier is not None
            or any(slot in self.produced for slot in step.checks)
            or any(
                dtype_name(v.aval.dtype) not in ADAPTED for v in [*source.inputs, *source.outputs]
            )
        ):
            return None
        inputs = self._arrays(step.ins)
        if inputs is None or not all(
            x.flags.c_contiguous and x.dtype == v.aval.dtype
            for x, v in zip(inputs, source.inputs, strict=True)
        ):
            return None
        table = self.table
        shape = step.adapter_signature()
        if shape is None:
            return None
        native = getattr(step.kernel, "adapter", None)  # loaded without Numba: native_plan
        if native is not None:
            entry_address, adapter = step.kernel.address, native
        elif table.native:
            return None  # a dispatcher's entry needs Numba
        else:
            entry_address, adapter = self._entry(step, shape)
            if adapter is None:
                return None
        row = [entry_address, *step.sizes, step.nchunks, *map(table.scalar, step.scalars)]
        for var, slot, reshape in zip(source.inputs, step.ins, step._reshape_in, strict=True):
            row += [self.operand(slot), *((var.aval.size,) if reshape else var.aval.shape)]
        fresh = {k: entry for k, *entry in step._fresh}
        for k, ((shape, dtype), slot, buffer) in enumerate(
            zip(step.allocations, step.outs, step._buffers, strict=True)
        ):
            if buffer is not None:
                row += [self.operand(buffer), *shape]
                continue
            _, _, view, _ = fresh[k]
            row += [self.output(slot, (shape, dtype, k, view)), *shape]
        function = table.function(adapter) if adapter >= 0 else -1
        if step.checks:
            self.checks.append(step.check_indices)
        writes = [
            slot if buffer is None else buffer
            for slot, buffer in zip(step.outs, step._buffers, strict=True)
        ]
        sizes = [v.aval.size for v in source.inputs] + [math.prod(s) for s, _ in step.allocations]
        self.effect = plan_posts.Effect(list(step.ins), writes, plan_posts.KERNEL_COST * sum(sizes))
        return [KERNEL, function, *row]

    def _entry(self, step: Any, shape: Any) -> tuple[int, int | None]:
        """The addresses of the kernel's C entry and of its adapter, built on the compile
        thread (0 and -1 while they are, their jobs then pending); None: no adapter."""
        from fastgrad.runtime.kernel_entry import kernel_signature  # (imports Numba)

        signature = kernel_signature(*shape)
        if signature is None:
            return 0, None
        table = self.table
        job = adapters.adapter(adapter_source(*shape), table.wait)
        entry = adapters.entry(step.kernel, step.source.source, signature, table.wait)
        for needed in (job, entry):
            if needed.settled.is_set() and needed.address is None:
                return 0, None  # failed to compile, or the process is exiting
            if not needed.settled.is_set():
                table.pending.append(needed)
        return entry.address or 0, -1 if job.address is None else job.address

    def _matmul(self, step: Any) -> list[int] | None:
        arrays = self._arrays(step.ins)
        if arrays is None:
            return None
        a, b = arrays
        target = step.out if step.accumulate else step.buffer
        reads = [*step.ins, *([target] if step.accumulate else [])]
        effect = plan_posts.Effect(reads, [step.out if target is None else target], 0)
        self.effect = effect
        out = self.env[target] if target is not None else None
        if out is None:
            out = np.empty(step.shape, step.dtype)  # what the fresh output will look like
        fields = gemm_row(a, b, out, step.accumulate)
        if fields is None:
            return None if step.accumulate else self._vector(step, a, b, out)
        (gemm, syrk), params, offsets = fields
        work = params[3] * params[4] * params[5] * offsets[0]
        effect.work = work
        if self.table.cut and self.table.native and work >= DEFAULT_MIN_WORK:
            # The cut's worker needs Numba: its job (which imports Numba) is asked for and
            # the plan lowered again through Numba once it is there, with the cut: a plan
            # lowered without it ran such a product whole on one BLAS thread at every call
            # (bench W4 f32 in a warm process: 8.1 ms a call against 4.8 with the cut).
            # Until then (or if the worker cannot be built) np.matmul, as a host step,
            # asked before the operands are noted: a fresh output noted for a row never
            # added was still allocated by the segment, in the host step's slot.
            job = adapters.product_worker(self.table.wait)
            if not job.settled.is_set() or "numba" in sys.modules:  # (else: never built)
                self.table.pending.append(job)
            return None
        pointers = [self.operand(step.ins[0]), self.operand(step.ins[1])]
        fresh = None if target is not None else (step.shape, step.dtype, 0, None)
        pointers.append(self.output(step.out, fresh) if fresh else self.operand(target))
        functions = [self.table.function(gemm), self.table.function(syrk)]
        split = -1  # a big product cut across the cores (runtime.gemm_split)
        if self.table.cut and not self.table.native:
            split = self._split(work)
        return [GEMM, *functions, split, *params, *pointers, *offsets]

    def _split(self, work: int) -> int:
        """The function index of runtime.gemm_split's state for a product of `work`
        multiply-adds big enough to cut, else -1."""
        from fastgrad.runtime import gemm_split  # (imports Numba)

        state = gemm_split.state()  # (tuning may have moved the threshold)
        least = gemm_split.DEFAULT_MIN_WORK if state is None else state[gemm_split.MIN_WORK]
        if work < least:
            return -1
        address = gemm_split.state_address()
        split = self.table.function(address) if address else -1
        self.table.posting = state is None or state[gemm_split.POSTING] != 0
        self.table.split = self.table.split or split >= 0
        return split

    def _vector(self, step: Any, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Any:
        """The row of a product with a dimension of 1 (runtime.vm_vectors), or None."""
        fields = vector_row(a, b, out)
        if fields is None or self.table.native:  # (its C function needs Numba)
            return None
        kind, address, params, order, offsets = fields
        table = self.table
        job = adapters.vector_rows(table.wait)
        if job.settled.is_set() and job.address is None:
            return None  # failed to compile, or the process is exiting
        if not job.settled.is_set():
            table.pending.append(job)
        rows = table.function(job.address) if job.address is not None else -1
        pointers = [self.operand(step.ins[i]) for i in order]
        fresh = None if step.buffer is not None else (step.shape, step.dtype, 0, None)
        pointers.append(self.output(step.out, fresh) if fresh else self.operand(step.buffer))
        if kind == "noblas":
            return [NOBLAS, rows, *params, *pointers, *offsets]
        op = GEMV if kind == "gemv" else DOT
        return [op, rows, table.function(address), *params, *pointers, *offsets]

    def _view(self, step: Any, call: Callable[[], None]) -> list[int] | None:
        arrays = self._arrays([step.ins[0], step.out])
        offset = None if arrays is None else view_offset(*arrays)
        if offset is None:
            return None  # a reshape that copied
        index = self.operand(step.ins[0])
        self.produced.add(step.out)
        self.views[step.out] = (step.ins[0], call)
        self.view_steps[step.out] = step
        self.effect = plan_posts.Effect([], [], 0)  # only an address (`views` says whose)
        return [VIEW, index, self.table.index(step.out), offset]

    def export(self, slot: int) -> None:
        """Make the view in `slot` (and the views of this segment it is made from) an
        array in the env after each run: Python reads it."""
        while slot in self.views and slot not in self.exported:
            self.exported.add(slot)
            slot = self.views[slot][0]

    def stand_ins(self) -> tuple[np.ndarray, ...]:
        """Arrays of the kinds a call hands the interpreter (for its compile)."""
        arrays = [self.env[slot] for slot, *_ in self.reads]
        arrays += [np.empty(shape, dtype) for shape, dtype, *_ in self.fresh]
        return tuple(arrays) or (np.zeros(1),)

    def record(self) -> list[int]:
        """The segment's record in the table: its steps and the pointers it fills."""
        indices = self.read_indices + self.fresh_indices
        if not indices:  # the interpreter takes one tuple kind at least: a scratch entry
            indices = [len(self.table.pointer)]
        return [self.first, self.count, len(indices), *indices]

    def finish(self, table: np.ndarray, at: int, one_thread: bool) -> None:
        """Take the finished table (shared by the plan's segments) and this segment's place;
        with `one_thread`, its steps run one by one with BLAS on one thread, as the
        interpreter runs them."""
        self.array, self.at = table, at
        self.one_thread = one_thread
        self.exports = [call for slot, (_, call) in self.views.items() if slot in self.exported]
        self.scratch = () if self.reads or self.fresh else (np.zeros(1),)
        # The compiled entry for the kind of tuple the interpreter was built for: besides
        # skipping Numba's type resolution, an argument that differs only in what the
        # layout check does not look at (read-only) does not make Numba compile a new kind
        # in the call.
        native = self.table.native
        self.run = Runner(native, table, at) if native else entry_point(self.stand_ins())

    def __call__(self) -> None:
        env = self.env
        arrays = []
        for slot, shape, strides, dtype in self.reads:
            value = env[slot]
            if not (
                type(value) is np.ndarray
                and value.strides == strides
                and value.shape == shape
                and value.dtype == dtype
            ):
                return self._steps()
            arrays.append(value)
        if not self.hold():
            return self._steps()
        try:
            for check in self.checks:
                check(env)
            for shape, dtype, k, view, slot, small in self.fresh:
                buffer = np.empty(shape, dtype) if small else staggered_empty(shape, dtype, k)
                env[slot] = buffer if view is None else buffer.reshape(view)
                arrays.append(buffer)
            self.run(self.array, self.at, tuple(arrays) or self.scratch)
        finally:
            drop(self.locks)
        for slot, array in self.kept:
            env[slot] = array
        for call in self.exports:
            call()

    def hold(self) -> bool:
        """Whether this call may run the LOOP rows: loop tables on (`loop_table.ENABLED`,
        the switch that runs every scan as its Python loop) and the locks of their loops
        taken (else another thread runs one). A False: run the steps one by one."""
        if self.locks and not loop_table.ENABLED:
            return False
        return take(self.locks)

    def _steps(self) -> None:
        """Its steps one by one, under the step runner's settings (Executable.__call__
        skips them for a plan run by the interpreter alone)."""
        with np.errstate(all="ignore"), OneThread() if self.one_thread else nullcontext():
            for call in self.host:
                call()


def lower(
    steps: Sequence[Any],
    calls: Sequence[Callable[[], None]],
    env: list[Any],
    static: AbstractSet[int],
    outputs: Sequence[int],
    wait: bool = False,
    one_thread: bool = False,
    private: AbstractSet[int] = frozenset(),
) -> list[Callable[[], None]] | Waiting:
    """The calls of an arena whose steps are settled (`calls[i]` runs `steps[i]` on
    `env`, which holds the values of a run just made), with each run of steps the
    interpreter can take made one call into it; or, while adapters compile in the
    background (unless `wait` or sync mode), what to wait for before trying again. With
    `one_thread` (the plan's Executable.one_blas_thread), BLAS runs on one thread and
    big products are cut across the cores (runtime.gemm_split), or handed to its worker
    while this thread goes on (runtime.plan_posts; `private`: the slots of the arguments
    and of views of them, which share no memory with the arena's buffers)."""
    table = _Table(env, static, wait or config.compile == "sync", one_thread)
    if "numba" not in sys.modules:
        table.native = native_loop()
    out: list[Callable[[], None]] = []
    owner: list[Segment | None] = []  # the segment of each step
    segments: list[Segment] = []
    segment: Segment | None = None
    for step, call in zip(steps, calls, strict=True):
        if segment is None:
            segment = Segment(table, len(table.starts))
        if segment.add(step, call):
            if not segments or segments[-1] is not segment:  # its first step
                segments.append(segment)
                out.append(segment)
            owner.append(segment)
            continue
        owner.append(None)
        out.append(call)
        if segment.count:
            segment = None
    for segment in [] if table.native else segments:
        job = adapters.interpreter(segment.stand_ins(), table.wait)
        if job.settled.is_set() and (job.error is not None or not job.done.is_set()):
            if job.error is not None:  # a bug: say so, never hide it behind the slower path
                warnings.warn(
                    f"fastgrad: {job.label} failed to compile ({type(job.error).__name__}: "
                    f"{job.error}); this plan runs its steps one by one",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return list(calls)  # no interpreter for it (or the process is exiting)
        if not job.settled.is_set():
            table.pending.append(job)
    if table.split:  # the worker's compile, once, behind the interpreter (which runs
        adapters.product_worker(table.wait)  # products whole until the worker serves)
    if table.pending:
        return Waiting(table.pending)
    _exports(steps, owner, segments, outputs)
    if table.cut:
        for segment in segments:
            _products_side_by_side(table, segment)
        if table.posting:
            plan_posts.place(table, segments, private)
    functions = sorted(table.functions, key=table.functions.__getitem__)
    array, at = pack(
        table.code,
        table.starts,
        functions,
        len(table.pointer) + 1,  # the last: a scratch entry
        table.floats,
        [segment.record() for segment in segments],
        region_address() if one_thread else 0,
        table.native or _table_function(),
    )
    for index, address in table.fixed.items():
        array[array[2] + index] = address
    for segment, place in zip(segments, at, strict=True):
        segment.finish(array, place, one_thread)
    return out


def _table_function() -> int:
    """runtime.vm's `table_function` (the loop Numba compiles or loads), imported then."""
    from fastgrad.runtime.vm import table_function

    return table_function()


def _products_side_by_side(table: _Table, segment: Segment) -> None:
    """Move the views between two products the interpreter may cut before the first, so
    that it finds them side by side and runs them at once, each on one core
    (runtime.gemm_split.pair: a backward pass's two products of a matmul, dA = g @ B.T
    and dB = A.T @ g, come with transposes between). A view only sets an address, from
    addresses set before the segment runs or by earlier views: it reads no data, so it
    may run earlier. Each product pairs at most once, with the one before it."""
    code, lo = table.code, segment.first
    starts = table.starts  # (only this segment's: every step's, per segment, was quadratic)
    cut = {
        i: code[starts[i]] == GEMM and code[starts[i] + 3] >= 0
        for i in range(lo, lo + segment.count)
    }
    order: list[int] = []  # step indices in their new order
    held: list[int] = []  # views after a product that may pair with the next one
    waiting = False  # the last index placed is a product not yet paired
    for i in range(lo, lo + segment.count):
        if waiting and code[table.starts[i]] == VIEW:
            held.append(i)
            continue
        if waiting and cut[i]:
            before = order.pop()
            order += [*held, before, i]
            held, waiting = [], False
            continue
        order += [*held, i]
        held, waiting = [], cut[i]
    order += held
    table.starts[lo : lo + segment.count] = [table.starts[i] for i in order]


def _exports(
    steps: Sequence[Any],
    owner: Sequence[Segment | None],
    segments: Sequence[Segment],
    outputs: Sequence[int],
) -> None:
    """Tell each segment which of its views Python reads: those read by a step outside
    it, and the plan's outputs."""
    # The segments making a view of each slot, looked up rather than each segment asked
    # for each slot each step reads (steps x segments: ~60 ms of lowering the T=200 RNN,
    # 2,002 steps in 400 segments without Numba).
    viewing: dict[int, list[Segment]] = {}
    for segment in segments:
        for slot in segment.views:
            viewing.setdefault(slot, []).append(segment)
    for step, mine in zip(steps, owner, strict=True):
        for slot in [*step.ins, *getattr(step, "checks", ())]:
            for segment in viewing.get(slot, ()):
                if segment is not mine:
                    segment.export(slot)
    for slot in outputs:
        for segment in viewing.get(slot, ()):
            segment.export(slot)
