"""A scan's iterations run inside the plan interpreter (runtime.vm's LOOP opcode), not one
Python call per iteration.

A scan's body runs in two arenas used in turn (Executable.iterations). Once each has been
lowered to a single segment of kernels, matmuls and views (runtime.plan_table), the loop
is one LOOP row in a table of its own: per iteration it sets the pointers of the body's
inputs (consts, the row t of each stacked input, the carry: the previous iteration's
output, or the initial value), calls the body's segment, and copies its stacked outputs
into row t of their stacks; after the last iteration it copies the final carry out. The
layouts the body's segments were built for are checked once per call, before the loop,
for what comes from outside (consts, initial carries, rows of stacked inputs, stacks) and
once when the row is built for what one iteration hands the next (the carries). Anything
else (a body with a host step: a library call, a nested loop, a kernel checking indices;
a layout that differs; the step runner; adapters still compiling) runs today's Python
loop, scan_loop's, which gives the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.core.config import config
from fastgrad.transforms.scan import ScanCall

# Off: every scan runs its Python loop (for side-by-side measures and tests).
ENABLED = True

Layout = tuple[tuple[int, ...], tuple[int, ...], np.dtype]


def _layout(x: Any) -> Layout | None:
    return (x.shape, x.strides, x.dtype) if type(x) is np.ndarray else None


def _contiguous(layout: Layout, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether `layout` is a C-contiguous array of `shape` and `dtype` (memcpy copies it)."""
    have, strides, have_dtype = layout
    if have != shape or have_dtype != dtype:
        return False
    expected, step = [], dtype.itemsize
    for n in reversed(shape):
        expected.append(step)
        step *= n
    return all(n <= 1 or s == e for n, s, e in zip(shape, strides, reversed(expected), strict=True))


def _handed(slot: int, segments: list[Any], call: ScanCall) -> bool:
    """Whether body output `slot` is a carry input or a view of one in any of `segments`."""
    for segment in segments:
        root = slot
        while root in segment.views:
            root = segment.views[root][0]
        if call.n_consts <= root < call.n_consts + call.n_carry:
            return True
    return False


def _in_place(slot: int, segments: list[Any], body: Any) -> tuple[list[int], list[int]] | None:
    """The pointer indices (body 0, body 1; then those of the same buffer in the kernel's
    shape, or -1) of the buffer in which each body writes output `slot`, and the address
    it has, when the LOOP may point them at row t of a stack instead (saving the row's
    copy: ~1 us a step for a (32, 128) float32 state): a buffer that no view made once
    per arena reads (its readers take its address at run time from the pointer table);
    else None."""
    indices, shaped, addresses = [], [], []
    for parity, segment in enumerate(segments):
        arena = body._alternating[parity]
        value = arena.env[slot] if slot < len(arena.env) else None
        mine = [b for b in arena.buffers if b.view_slot == slot]
        pointer = segment.table.pointer
        if type(value) is not np.ndarray or slot not in arena.static or len(mine) != 1:
            return None
        slots = {slot, mine[0].slot}
        found = [pointer[s] for s in sorted(slots) if s in pointer]
        if (
            any(s in view.ins for view in arena.static_views for s in slots)
            or any(b.slot in slots and b is not mine[0] for b in arena.buffers)
            or not found
            or any(segment.table.fixed.get(i) != value.ctypes.data for i in found)
        ):
            return None
        indices.append(found[0])
        shaped.append(found[1] if len(found) > 1 else -1)
        addresses.append(value.ctypes.data)
    if len(segments) == 1:  # one body for both parities
        indices, shaped, addresses = indices * 2, shaped * 2, addresses * 2
    return [*indices, *shaped], addresses


class ScanLoop:
    """The LOOP of one scan (`call`, whose body plan is `body`, built with `looped`):
    `run` runs all its iterations in one call into the interpreter once it can, else
    returns None; `watch` wraps the body of a Python loop to see what its iterations
    give, which the LOOP row is built from."""

    def __init__(self, call: ScanCall, body: Any):
        self.call, self.body = call, body
        self.parities = (0,) if call.length == 1 else (0, 1)
        self.seen: dict[int, list[Layout | None]] = {}  # parity -> its outputs' layouts
        self.program: _Program | None = None
        self.failed = False  # the body cannot run in the interpreter: never try again
        # The interpreter's compile for the loop table's arrays, the program waiting for
        # it, and those arrays (their Numba type is the kind the job compiles).
        self.job: tuple[Any, _Program | None, tuple[Any, ...]] = (None, None, ())
        self._handed: frozenset[int] | None = None

    def handed(self) -> frozenset[int]:
        """The carry outputs that may be (views of) carry inputs, by the body's plan: the
        Python loop copies these, and no other (scan_loop's `handed`)."""
        if self._handed is None:
            nc, ncar = self.call.n_consts, self.call.n_carry
            self._handed = frozenset(
                k
                for k, slot in enumerate(self.body.outputs[:ncar])
                if any(nc <= s < nc + ncar for s in self.body.views_of([slot]))
            )
        return self._handed

    def waiting(self) -> bool:
        """Whether the LOOP waits for something that takes its time: its body's arenas to
        be lowered (their kernels compiled) or the interpreter's compile for it."""
        if self.job[0] is not None:
            return True
        arenas = [self.body._alternating[parity] for parity in self.parities]
        return not all(a.settled and not a.lowering and a.env is not None for a in arenas)

    def _segments(self) -> list[Any] | None:
        """The body's segments, one per arena used, once each arena is lowered to one."""
        found = []
        for parity in self.parities:
            arena = self.body._alternating[parity]
            if not arena.settled or arena.lowering or arena.lower is None or arena.env is None:
                return None  # not lowered yet
            calls = arena.calls  # one plan_table.Segment (the only `interpreted` call)
            if len(calls) != 1 or not getattr(calls[0], "interpreted", False):
                self.failed = arena.settled and arena.lower_when is None
                return None
            found.append(calls[0])
        return found

    def watch(self, body: Callable[[list[Any]], list[Any]]) -> Callable[[list[Any]], list[Any]]:
        """`body`, noting its outputs' layouts per parity when the LOOP may be built next."""
        if not ENABLED or self.failed or self.program is not None or self.call.length == 0:
            return body
        if self._segments() is None:
            return body
        count = iter(range(len(self.parities)))

        def watched(args: list[Any]) -> list[Any]:
            outs = body(args)
            i = next(count, None)
            if i is not None:
                self.seen[i] = [_layout(x) for x in outs]
            return outs

        return watched

    def run(
        self, consts: Sequence[Any], carry: Sequence[Any], xs: Sequence[Any], stores: Any
    ) -> list[Any] | None:
        """Run the loop (`stores`: (stack, body output) pairs) in the interpreter and return
        the final carry, fresh; or None when it cannot (the caller runs its Python loop)."""
        if not ENABLED or self.failed or self.call.length == 0:
            return None
        if self.program is None:
            self._build(consts, carry, xs, stores)
            if self.program is None:
                return None
        return self.program.run(consts, carry, xs, stores)

    def _build(self, consts: Any, carry: Any, xs: Any, stores: Any) -> None:
        """Make the program from what the last watched call saw, and have the interpreter
        compiled for its arrays (on the compile thread: until then, Python loops)."""
        job, program, kind = self.job
        if job is None:
            segments = self._segments() if len(self.seen) == len(self.parities) else None
            if segments is None:
                return
            program = _Program.make(
                self.call, self.body, segments, self.seen, stores, [*consts, *carry]
            )
            self.seen = {}
            arrays = None if program is None else program.arrays(consts, carry, xs, stores)
            if program is None or arrays is None:
                self.failed = program is None  # else this call's layouts differ: next one
                return
            from fastgrad.runtime import adapters

            wait = config.compile == "sync" or self.body.waits
            kind = tuple(arrays)
            job = adapters.interpreter(kind, wait)
            self.job = (job, program, kind)
        if not job.settled.is_set():
            return
        self.job = (None, None, ())
        if job.error is None and job.done.is_set():
            from fastgrad.runtime.small_call import entry_point

            # Called for that kind whatever a later call's flags: a read-only const is
            # another Numba type, and the dispatcher would compile the interpreter for it
            # inside the call (~1 s); the row's checks keep shapes, strides and dtypes.
            program.entry = entry_point(kind)
            self.program = program
        else:
            self.failed = True


class _Program:
    """A LOOP row in a table of its own, and the layouts its call checks: `checks` (input,
    layout) of the consts, initial carries and rows of stacked inputs, `stacks` those of
    the stacks it fills. `keep`: the body tables the row points at."""

    def __init__(
        self,
        call: ScanCall,
        row: list[int],
        checks: list[tuple[int, Layout]],
        stacks: list[Layout],
        keep: list[np.ndarray],
        handed: list[int],
    ):
        from fastgrad.runtime.vm import pack, run_steps

        # Both parities' segments read most inputs alike: each check once.
        self.call, self.checks, self.stacks, self.keep = (
            call,
            list(dict.fromkeys(checks)),
            stacks,
            keep,
        )
        self.handed = handed
        outputs = call.body.outputs
        self.finals = [(v.aval.shape, v.aval.dtype) for v in outputs[: call.n_carry]]
        self.pairs = [((2, *outputs[k].aval.shape), outputs[k].aval.dtype) for k in handed]
        self.entry: Callable[..., None] = run_steps  # the compiled kind's, once settled
        self.in_place = 0  # how many of its stacks the body writes in place
        count = len(call.body.inputs) + len(stacks) + call.n_carry + len(handed)
        # Outer pointers: consts, initial carries, stacked inputs, stacks, final carries,
        # the pairs of buffers of the carries handed on.
        self.table, (self.at,) = pack(row, [0], [], count + 1, [], [[0, 1, count, *range(count)]])

    @staticmethod
    def make(
        call: ScanCall,
        body: Any,
        segments: list[Any],
        seen: dict[int, Any],
        stores: Any,
        values: Sequence[Any],
    ) -> _Program | None:
        """The row for `call` whose body's arenas are the single `segments` (by parity),
        whose outputs had the layouts `seen`; None when a layout does not allow it."""
        from fastgrad.runtime import vm_rows as vm

        nc, ncar = call.n_consts, call.n_carry
        inputs, outputs = body.graph.inputs, body.outputs
        n_in, n_xs = len(inputs), call.n_xs
        parities = len(segments)
        reads = []  # per parity: slot -> layout the segment was built for
        for segment in segments:
            layouts = {
                slot: (shape, strides, dtype) for slot, shape, strides, dtype in segment.reads
            }
            if segment.checks or segment.fresh or any(slot >= n_in for slot in layouts):
                return None
            reads.append(layouts)
        first_x = nc + ncar
        first_stack = first_x + n_xs
        first_final = first_stack + len(stores)
        checks: list[tuple[int, Layout]] = []  # (input, layout) per parity 0 then 1
        entries: list[int] = []
        for k in range(n_in):
            kind = vm.FIXED if k < nc else vm.CARRY if k < first_x else vm.SLICE
            # a carry: the output feeding it; a stacked input: its rows' bytes (C-contiguous)
            aval = inputs[k].aval
            stride = k - nc if kind == vm.CARRY else aval.size * aval.dtype.itemsize
            indices = [seg.table.pointer.get(k, -1) for seg in segments]
            entries += [kind, k, stride, indices[0], indices[-1], 0]
        # Carries handed on (a carry input, or a view of one): they live in the buffers
        # the next iteration writes, so each iteration copies them into a pair of its own.
        handed = [k for k, slot in enumerate(outputs[:ncar]) if _handed(slot, segments, call)]
        # Stacked outputs each body writes in place, into row t of its stack (by slot).
        in_place: dict[int, tuple[list[int], list[int]]] = {}
        for _, j in stores:
            slot = outputs[j]
            found = None if slot in in_place else _in_place(slot, segments, body)
            if found is not None:
                in_place[slot] = found
        out_entries: list[int] = []
        for slot in outputs:
            where = []
            kinds = set()
            for parity, segment in enumerate(segments):
                arena = body._alternating[parity]
                value = arena.env[slot] if slot < len(arena.env) else None
                if slot in in_place:  # where its buffer's pointer says: row t of a stack
                    kinds.add(vm.POINTER)
                    where.append(in_place[slot][0][parity])
                elif slot < n_in:
                    kinds.add(vm.INPUT)
                    where.append(0)
                elif slot in arena.static and type(value) is np.ndarray:
                    kinds.add(vm.ADDRESS)
                    where.append(value.ctypes.data)
                elif slot in segment.table.pointer and slot in segment.produced:
                    kinds.add(vm.POINTER)
                    where.append(segment.table.pointer[slot])
                else:
                    return None
            if len(kinds) != 1:
                return None
            out_entries += [kinds.pop(), where[0], where[-1], slot if slot < n_in else 0, 0]
        for parity in range(parities):
            outs = seen[parity]
            nxt = (parity + 1) % 2 if parities == 2 else 0
            for k in range(ncar):  # what this iteration hands the next
                aval = call.body.outputs[k].aval
                layout = outs[k]
                if layout is None or not _contiguous(layout, aval.shape, aval.dtype):
                    return None
                want = reads[nxt].get(first_x - ncar + k)
                if k in handed:  # the next iteration reads half of the pair
                    layout = _layout(np.empty((2, *aval.shape), aval.dtype)[0])
                if want is not None and want != layout:
                    return None
            for _, j in stores:
                aval = call.body.outputs[j].aval
                if outs[j] is None or not _contiguous(outs[j], aval.shape, aval.dtype):
                    return None
        for parity in range(parities):
            for slot, layout in reads[parity].items():
                if slot < nc or slot >= first_x:
                    checks.append((slot, layout))
        for slot, layout in reads[0].items():
            if nc <= slot < first_x:
                checks.append((slot, layout))
        # Consts and initial carries the body hands on unread: their layout is what the
        # next iteration reads and what the final copy assumes.
        read = {slot for r in reads for slot in r}
        for slot in range(first_x):
            aval = inputs[slot].aval
            layout = _layout(values[slot])
            if slot not in read:
                if layout is None or not _contiguous(layout, aval.shape, aval.dtype):
                    return None
                checks.append((slot, layout))
        copies: list[int] = []
        for h, k in enumerate(handed):  # before the stacks: they copy what it hands on
            aval = call.body.outputs[k].aval
            nbytes = int(np.prod(aval.shape)) * aval.dtype.itemsize
            copies += [-1 - k, first_final + ncar + h, nbytes, nbytes, -1, -1, -1, -1, 0, 0]
        written = 0  # stacks written in place
        for i, (y, j) in enumerate(stores):
            aval = call.body.outputs[j].aval
            if not _contiguous((y.shape[1:], y.strides[1:], y.dtype), aval.shape, aval.dtype):
                return None
            # in place: the buffer's pointer indices and addresses (one stack per buffer)
            indices, addresses = in_place.pop(outputs[j], ([-1] * 4, [0, 0]))
            written += indices[0] >= 0
            copies += [j, first_stack + i, y.strides[0], y[0].nbytes if len(y) else 0]
            copies += [*indices, *addresses]
        finals: list[int] = []
        for k in range(ncar):
            aval = call.body.outputs[k].aval
            nbytes = int(np.prod(aval.shape)) * aval.dtype.itemsize
            finals += [k, nc + k, first_final + k, nbytes]
        bodies = segments * 2 if parities == 1 else segments
        n_copy = len(stores) + len(handed)
        head = [vm.LOOP, call.length, int(call.reverse), n_in, len(outputs), n_copy, ncar]
        for segment in bodies:
            head += [segment.array.ctypes.data, segment.at]
        row = [*head, *entries, *out_entries, *copies, *finals]
        stacks = [(y.shape, y.strides, y.dtype) for y, _ in stores]
        keep = [segment.array for segment in bodies]
        program = _Program(call, row, checks, stacks, keep, handed)
        program.in_place = written
        return program

    def threads_set_around(self) -> None:
        """The loop's caller runs BLAS on one thread around all its runs (the Python
        loop's too): the bodies' tables need not set and restore it at each iteration
        (two calls into OpenBLAS, ~12 ns a step, 7% of a 200-step LOOP of (16, 16)
        products)."""
        from fastgrad.runtime.vm_rows import THREADS

        for table in self.keep:
            table[THREADS] = 0

    def arrays(
        self, consts: Sequence[Any], carry: Sequence[Any], xs: Sequence[Any], stores: Any
    ) -> list[Any] | None:
        """The arrays of the table's outer pointers for this call, fresh final carries
        among them; None when a layout is not the one the row was built for."""
        values = [*consts, *carry, *xs]
        first_x = len(consts) + len(carry)
        for slot, (shape, strides, dtype) in self.checks:
            x = values[slot]
            if type(x) is not np.ndarray or x.dtype != dtype:
                return None
            if slot >= first_x:
                if x.shape[1:] != shape or x.strides[1:] != strides:
                    return None
            elif x.shape != shape or x.strides != strides:
                return None
        for (y, _), (shape, strides, dtype) in zip(stores, self.stacks, strict=True):
            if y.shape != shape or y.strides != strides or y.dtype != dtype:
                return None
        fresh = [np.empty(shape, dtype) for shape, dtype in (*self.finals, *self.pairs)]
        return [*values, *(y for y, _ in stores), *fresh]

    def run(
        self, consts: Sequence[Any], carry: Sequence[Any], xs: Sequence[Any], stores: Any
    ) -> list[Any] | None:
        arrays = self.arrays(consts, carry, xs, stores)
        if arrays is None:
            return None
        self.entry(self.table, self.at, tuple(arrays))
        end = len(arrays) - len(self.handed)
        return arrays[end - len(carry) : end]
