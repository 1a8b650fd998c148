"""A scan's LOOP as rows of the enclosing plan's table (runtime.plan_table), with the work
it does for all its steps at once around the loop (runtime.loop_hoisting), so that one
call into the interpreter runs what comes before the scan, the scan and what follows it.

A scan whose LOOP is built runs from its own table through `scan_call.ThinScan`: ~10 us
of Python a call around the loop (the hoisted product in NumPy, the layout checks, the
stacks, the final carries, the sums after it), and the enclosing plan then has a host
step, so it also sets NumPy's errstate and BLAS's threads and calls each segment by
itself (~18 us a call in all at T = 1 for the unbatched RNN, H = 16). Here the LOOP row
built for the scan's own table is copied into the enclosing one, its outer pointers (the
consts, the initial carries, the stacked inputs, the stacks, the final carries) renamed
to the enclosing table's: what comes from outside is checked by the segment as any
array it reads, and the arrays the rows write are the segment's fresh outputs (what the
caller may see) or arrays of the step's own, kept from call to call (a stack nothing but
the plan reads, the buffers of a carry handed on, an unused final carry, a product or
a partial sum), one set per arena: a loop body's two arenas each have theirs. Around
the LOOP row, rows do ThinScan's NumPy work, each as NumPy does it (runtime.vm_arrays,
plan_rows): before it, consts copied transposed (COPY), the initial carry into the
first row of the array that the carry's stacks before and after each step share (COPY:
a forward scan of a VJP), the products of stacked inputs by consts (GEMM, GEMV); after
it, the carries summed over all steps at once (a weight's gradient: a product into an
array of the step's own, then ADD of the initial value; a bias's: SUM over the leading
axes, then ADD) and stacks transposed (COPY). It gives ThinScan's bits.

A scan whose stacks share an array the caller would see, or whose sum is over axes that
are not leading or keeps one element (NumPy sums those pairwise), stays a host step.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastgrad.runtime import adapters
from fastgrad.runtime.plan_rows import gemm_row, vector_row
from fastgrad.runtime.vm_rows import (
    ADD,
    COPY,
    DOT,
    GEMM,
    GEMV,
    HEADER,
    LOOP_CARRY,
    LOOP_COPY,
    LOOP_HEAD,
    LOOP_IN,
    LOOP_OUT,
    MAX_AXES,
    NOBLAS,
    SUM,
)

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# An array a row reads or writes: ("slot", slot) an env slot (read: checked at each call
# by the segment, or written by an earlier step), ("own", array) an array of the step's
# own (its address fixed), ("out", k, array, fresh) the scan's output k.
Ref = tuple[Any, ...]


def embeddable(step: Any) -> bool:
    """Whether LoopStep `step`'s LOOP may become rows of the enclosing table (asked before
    it is built too: the plan then waits for it)."""
    return step.looped is not None and (step.hoisted is None or step.hoisted.as_rows)


def rows(segment: Any, step: Any) -> list[list[int]] | None:
    """The rows that run LoopStep `step` in `segment` (the module's docstring), or None
    where they cannot (then it stays a host step, and the segment is unchanged): its
    arrays in the segment's env (the run just made) must be those its LOOP was built
    for."""
    thin = step.thin_call()
    if (
        thin is None
        or not embeddable(step)
        or (step.largest_matmul and step.one_thread != segment.table.one_thread)
    ):
        return None  # (its bodies' BLAS threads are set around the loop: as the table's)
    arrays = [segment.env[slot] for slot in step.ins]
    for x, dtype in zip(arrays, thin.dtypes, strict=True):
        if type(x) is not np.ndarray or x.dtype != dtype or not x.flags.c_contiguous:
            return None
    plan = _Plan(segment, step, thin, arrays)
    if not plan.inputs() or not plan.stacks() or not plan.around():
        return None
    return plan.emit()


class _Plan:
    """The rows of one LoopStep in a segment, worked out before any is made (`emit`):
    `before` and `after` the LOOP, (kind, fields with refs) each."""

    def __init__(self, segment: Any, step: Any, thin: Any, arrays: list[np.ndarray]):
        self.segment, self.step, self.thin, self.arrays = segment, step, thin, arrays
        self.owned = step.owned.setdefault(id(segment.env), {})  # this arena's own arrays
        self.slots: dict[int, list[int]] = {}  # output number -> its slots (one per node)
        for k, slot in step.outs:
            self.slots.setdefault(k, []).append(slot)
        self.refs: list[Ref] = []  # the inner scan's inputs, as the LOOP reads them
        self.values: list[np.ndarray] = []  # their arrays
        self.written: list[Ref] = []  # the LOOP's stacks, then its final carries
        self.shown: list[Ref] = []  # stacks the LOOP writes as part of another's array
        self.before: list[tuple[str, Any]] = []
        self.after: list[tuple[str, Any]] = []
        self.ys: list[Any] = []  # the inner scan's stacked outputs
        self.pointers: dict[Any, int] = {}

    def input(self, k: int) -> Ref:
        return ("slot", self.step.ins[k])

    def own(self, key: Any, shape: Any, dtype: Any) -> Ref:
        return ("own", _own(self.owned, key, shape, dtype))

    def fresh(self, k: int | None) -> bool:
        """Whether the scan's output k is an array the caller may see: fresh at each call
        (None: no output of the scan)."""
        step = self.step
        return (
            k is not None
            and k in self.slots
            and k - step.call.n_carry not in step.private
            and not step.in_body
        )

    def output(self, k: int | None, shape: Any, dtype: Any, key: Any) -> Ref | None:
        """Where the rows write the scan's output k (None: no output, an array of the
        step's own under `key`); None when it is an array the caller sees in two slots."""
        if not self.fresh(k):
            return ("out", k, _own(self.owned, key, shape, dtype), False)
        if len(self.slots[k]) > 1:
            return None
        return ("out", k, np.empty(shape, dtype), True)

    def inputs(self) -> bool:
        """The inner scan's inputs: consts, consts copied transposed (COPY rows), carries,
        stacked inputs, products of stacked inputs by consts (GEMM or vector rows)."""
        step, arrays, hoisted = self.step, self.arrays, self.step.hoisted
        nc, ncar = step.call.n_consts, step.call.n_carry
        if hoisted is None:
            self.refs = [self.input(k) for k in range(len(arrays))]
            self.values = list(arrays)
            return True
        consts, xs = arrays[:nc], arrays[nc + ncar :]
        self.refs, self.values = [self.input(k) for k in range(nc)], list(consts)
        for n, (i, axes) in enumerate(hoisted.transposed):
            view = consts[i].transpose(axes)
            copy = self.own(("transposed", n), view.shape, view.dtype)
            if not self._copy(self.input(i), view, copy):
                return False
            self.refs.append(copy)
            self.values.append(copy[1])
        for k in range(ncar):
            if all(s.carry != k for s in hoisted.sums):
                self.refs.append(self.input(nc + k))
                self.values.append(arrays[nc + k])
        for i in hoisted.xs_read:
            self.refs.append(self.input(nc + ncar + i))
            self.values.append(xs[i])
        for n, p in enumerate(hoisted.products):
            x, w = xs[p.x], consts[p.w]
            flat = x.reshape(-1, x.shape[-1])  # (a view: x is C-contiguous)
            out = self.own(("product", n), (len(flat), w.shape[0 if p.left else 1]), x.dtype)
            b = w.T if p.left else w
            if not self._product([self.input(nc + ncar + p.x), self.input(p.w)], flat, b, out):
                return False
            self.refs.append(out)
            self.values.append(out[1].reshape(len(x), *p.shape))
        return True

    def stacks(self) -> bool:
        """The inner scan's stacked outputs, as ThinScan makes them: a carry's values
        before and after each step (`thin.pairs`) share one array of a row more, its first
        (last, reversed) the initial carry (a COPY row); the others an array each."""
        step, thin = self.step, self.thin
        ncar, n_ys = step.call.n_carry, thin.n_ys
        hoisted = step.hoisted
        relaid = set() if hoisted is None else {j for j, _ in hoisted.relaid}

        def number(j: int) -> int | None:  # the scan's output number of stacked output j
            return ncar + j if j < n_ys and j not in relaid else None

        ys: list[Any] = [None] * thin.n_stacked
        outs: dict[int, Ref] = {}
        for k, before, after, rows in thin.pairs:
            if self.fresh(number(after)):
                return False  # (an array the caller sees, sharing memory with another)
            both = _own(self.owned, ("pair", after), rows.shape, rows.dtype)
            first, rest = (both[:-1], both[1:]) if thin.reverse else (both[1:], both[:-1])
            ys[after], ys[before] = first, rest
            outs[after] = ("out", number(after), first, False)
            if number(before) in self.slots:  # the plan reads it: a view of the pair's array
                self.shown.append(("out", number(before), rest, False))
            first_carry = step.looped.call.n_consts
            carry = self.values[first_carry + k]
            start = both[-1 if thin.reverse else 0]
            if not self._copy(self.refs[first_carry + k], carry, ("own", start)):
                return False
        for j, aval in thin.alone:
            out = self.output(number(j), aval.shape, aval.dtype, ("stack", j))
            if out is None:
                return False
            ys[j], outs[j] = out[2], out
        self.ys = ys
        self.written = [outs[j] for j in thin.stored]
        inner = step.looped.call
        program = step.looped.program
        stores = [(ys[j], thin.n_inner_carry + j) for j in thin.stored]
        values, nc, ncar = self.values, inner.n_consts, inner.n_carry
        if (
            len(stores) != len(program.stacks)
            or program.arrays(values[:nc], values[nc : nc + ncar], values[nc + ncar :], stores)
            is None
        ):
            return False  # (layouts other than the LOOP's)
        kept = range(step.call.n_carry)
        if hoisted is not None:
            kept = [k for k in kept if all(s.carry != k for s in hoisted.sums)]
        for i, (k, (shape, dtype)) in enumerate(zip(kept, program.finals, strict=True)):
            out = self.output(k, shape, dtype, ("final", i))
            if out is None:
                return False
            self.written.append(out)
        return True

    def around(self) -> bool:
        """The rows after the LOOP: the sums of the carries summed over all steps at once
        (each part a product or a SUM into an array of the step's own, added in turn to
        the initial value: ADD), the stacks transposed (COPY)."""
        step, hoisted = self.step, self.step.hoisted
        if hoisted is None:
            return True
        nc, ncar = step.call.n_consts, step.call.n_carry
        xs = self.arrays[nc + ncar :]
        added = self.ys[len(self.ys) - hoisted.n_added :]
        for s in hoisted.sums:
            if s.carry not in self.slots:
                continue  # (read by nothing)
            init = self.arrays[nc + s.carry]
            total = self.input(nc + s.carry)
            for n, part in enumerate(s.parts):
                refs = [
                    self.input(nc + ncar + i) if i >= 0 else ("own", added[-1 - i])
                    for i in part.operands
                ]
                stacks = [xs[i] if i >= 0 else added[-1 - i] for i in part.operands]
                term = self._term(part, refs, stacks, init, (s.carry, n))
                last = n == len(s.parts) - 1
                key = ("total", s.carry, n)
                out = (
                    self.output(s.carry, init.shape, init.dtype, key)
                    if last
                    else self.own(key, init.shape, init.dtype)
                )
                if term is None or out is None or init.dtype not in _FLOATS:
                    return False
                self.after.append(("add", (total, term, out, init.size, init.dtype)))
                total = out
        for j, axes in hoisted.relaid:
            k = step.call.n_carry + j
            if k not in self.slots:
                continue
            view = self.ys[j].transpose(0, *(a + 1 for a in axes))
            out = self.output(k, view.shape, view.dtype, ("relaid", j))
            if out is None or not self._copy(("own", self.ys[j]), view, out, self.after):
                return False
        return True

    def _term(
        self, part: Any, refs: list[Ref], stacks: list[np.ndarray], init: np.ndarray, key: Any
    ) -> Ref | None:
        """An array of the step's own that one part of a sum is computed into, by a row
        after the LOOP (as loop_hoisting.Part.total computes it); None where no row does."""
        out = self.own(("term", *key), init.shape, init.dtype)
        if part.kind == "sum":
            (x,) = stacks
            lead = 1 + len(part.axes)
            rows, cols = math.prod(x.shape[:lead]), math.prod(x.shape[lead:])
            if cols < 2 or cols != init.size or x.dtype != init.dtype:
                return None  # (NumPy sums one column pairwise)
            self.after.append(("sum", (refs[0], rows, cols, out, x.dtype)))
            return out
        if part.kind == "matmul":
            p, q = (s.reshape(-1, s.shape[-1]) for s in stacks)
        else:  # "outer"
            p, q = (s.reshape(len(s), s.shape[1]) for s in stacks)
        if (p.shape[1], q.shape[1]) != init.shape:
            return None
        return out if self._product(refs, p.T, q, out, self.after) else None

    def _product(
        self, refs: list[Ref], a: np.ndarray, b: np.ndarray, out: Ref, rows: Any = None
    ) -> bool:
        """A row of `out = a @ b` (views at the addresses of `refs`), as `np.matmul`
        computes it, into `rows` (those before the LOOP by default)."""
        fields = gemm_row(a, b, out[1], False) or vector_row(a, b, out[1])
        if fields is None or (len(fields) == 5 and not _vector_rows(self.segment)):
            return False
        (self.before if rows is None else rows).append(("product", (fields, refs, out)))
        return True

    def _copy(self, source: Ref, view: np.ndarray, out: Ref, rows: Any = None) -> bool:
        """A COPY row of `view` (at the address of `source`) into `out`, C-contiguous."""
        if view.ndim > MAX_AXES or view.dtype.itemsize not in (1, 2, 4, 8):
            return False
        if not _vector_rows(self.segment):
            return False
        (self.before if rows is None else rows).append(("copy", (source, view, out)))
        return True

    def pointer(self, ref: Ref) -> int:
        """The segment's pointer index of `ref` (made once per ref)."""
        segment = self.segment
        key = ref[1] if ref[0] == "slot" else ("array", id(ref[-2] if ref[0] == "out" else ref[1]))
        if key in self.pointers:
            return self.pointers[key]
        if ref[0] == "slot":
            index = segment.operand(ref[1])
        elif ref[0] == "own":
            index = _fixed(segment, ref[1])
        else:
            _, k, array, fresh = ref
            if fresh:
                (slot,) = self.slots[k]
                index = segment.output(slot, (array.shape, array.dtype, k, None))
                if _layout(segment.env[slot]) != _layout(array):
                    segment.env[slot] = array  # (the views made of the run's kept: theirs)
            else:  # each slot's pointer holds its address
                index = [_fixed(segment, array, slot) for slot in self.slots.get(k, [None])][0]
        self.pointers[key] = index
        return index

    def emit(self) -> list[list[int]]:
        """The rows, made in the segment: nothing before has changed it."""
        segment, step = self.segment, self.step
        before = [self._row(kind, fields) for kind, fields in self.before]
        outer = [self.pointer(ref) for ref in [*self.refs, *self.written]]
        for h, (shape, dtype) in enumerate(step.looped.program.pairs):
            outer.append(_fixed(segment, _own(self.owned, ("pair", h), shape, dtype)))
        for ref in self.shown:
            self.pointer(ref)
        after = [self._row(kind, fields) for kind, fields in self.after]
        # Its LOOP's tables (and those of the loops nested in it) run by one thread at a
        # time: the segment holds their locks for a run (else runs its steps one by one).
        for lock in step.row_locks:
            if all(lock is not held for held in segment.locks):
                segment.locks.append(lock)
        return [*before, _renamed(step.looped.program, outer), *after]

    def _row(self, kind: str, fields: Any) -> list[int]:
        if kind == "product":
            found, refs, out = fields
            return _product(self.segment, found, [self.pointer(r) for r in refs], self.pointer(out))
        function = _vector_function(self.segment)
        if kind == "copy":
            source, view, out = fields
            item = view.dtype.itemsize
            pointers = [self.pointer(source), self.pointer(out)]
            return [COPY, function, view.ndim, item, *pointers, *view.shape, *view.strides]
        double = int(fields[-1] == np.float64)
        if kind == "sum":
            x, rows, cols, out, _ = fields
            return [SUM, function, double, rows, cols, self.pointer(x), self.pointer(out)]
        a, b, out, size, _ = fields  # "add"
        return [ADD, function, double, size, *(self.pointer(r) for r in (a, b, out))]


def _layout(x: Any) -> Any:
    return (x.shape, x.strides, x.dtype) if type(x) is np.ndarray else None


def _own(owned: dict[Any, np.ndarray], key: Any, shape: Any, dtype: Any) -> np.ndarray:
    """The step's own array `key` in this arena, kept from call to call."""
    array = owned.get(key)
    if array is None or array.shape != tuple(shape) or array.dtype != dtype:
        array = owned[key] = np.empty(shape, dtype)
    return array


def _fixed(segment: Any, array: np.ndarray, slot: int | None = None) -> int:
    """The pointer index of an array of the step's own: its address is fixed; `slot`,
    when the plan reads it (a private stack), holds it after each run."""
    table = segment.table
    key = slot if slot is not None else -1 - len(table.pointer)  # no env slot is negative
    index = table.index(key)
    table.fixed[index] = array.ctypes.data
    if slot is not None:
        segment.env[slot] = array
        segment.produced.add(slot)
        segment.kept.append((slot, array))
    return index


def _product(segment: Any, fields: Any, ins: list[int], index: int) -> list[int]:
    """The row of a product whose operands are at pointers `ins` and output at pointer
    `index`, from `fields` (plan_rows.gemm_row's, or vector_row's), as `np.matmul`
    computes it."""
    table = segment.table
    if len(fields) == 3:  # gemm_row's
        (gemm, syrk), params, offsets = fields
        functions = [table.function(gemm), table.function(syrk)]
        return [GEMM, *functions, -1, *params, ins[0], ins[1], index, *offsets]
    kind, address, params, order, offsets = fields
    function = _vector_function(segment)
    pointers = [*(ins[i] for i in order), index]
    if kind == "noblas":
        return [NOBLAS, function, *params, *pointers, *offsets]
    op = GEMV if kind == "gemv" else DOT
    return [op, function, table.function(address), *params, *pointers, *offsets]


def _vector_rows(segment: Any) -> bool:
    """Whether the interpreter's vector rows are compiled or compiling (not failed)."""
    job = adapters.vector_rows(segment.table.wait)
    return not job.settled.is_set() or job.address is not None


def _vector_function(segment: Any) -> int:
    """The index in the table's functions of the C function running the vector rows and
    runtime.vm_arrays' (-1 while it compiles: the plan waits for it)."""
    table = segment.table
    job = adapters.vector_rows(table.wait)
    if not job.settled.is_set():
        table.pending.append(job)
    return table.function(job.address) if job.address is not None else -1


def _renamed(program: Any, outer: list[int]) -> list[int]:
    """`program`'s LOOP row (loop_table._Program: the first row of its own table), its
    outer pointer indices (0, 1, ... in its own table) replaced by `outer`'s."""
    table = program.table
    n_in, n_out, n_copy, n_carry = (int(v) for v in table[HEADER + 3 : HEADER + 7])
    size = LOOP_HEAD + LOOP_IN * n_in + LOOP_OUT * n_out + LOOP_COPY * n_copy
    row = [int(v) for v in table[HEADER : HEADER + size + LOOP_CARRY * n_carry]]
    ins = LOOP_HEAD
    copies = ins + LOOP_IN * n_in + LOOP_OUT * n_out
    carries = copies + LOOP_COPY * n_copy
    fields = [*range(ins + 1, copies - LOOP_OUT * n_out, LOOP_IN)]  # each input's pointer
    fields += range(copies + 1, carries, LOOP_COPY)  # each stack's (and pair's)
    fields += range(carries + 2, len(row), LOOP_CARRY)  # each final carry's
    for f in fields:
        row[f] = outer[row[f]]
    return row
