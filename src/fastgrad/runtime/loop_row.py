"""A scan's LOOP as rows of the enclosing plan's table (runtime.plan_table): the products
of its stacked inputs by consts as GEMM (or GEMV) rows, then its LOOP row, so that one
call into the interpreter runs what comes before the scan, the scan and what follows it.

A scan whose LOOP is built runs from its own table through `scan_call.ThinScan`: ~10 us
of Python a call around the loop (the hoisted product in NumPy, the layout checks, the
stacks, the final carries), and the enclosing plan then has a host step, so it also
sets NumPy's errstate and BLAS's threads and calls each segment by itself (~18 us a call
in all at T = 1 for the unbatched RNN, H = 16). Here the LOOP row built for the scan's
own table is copied into the enclosing one, its outer pointers (the consts, the initial
carries, the stacked inputs, the stacks, the final carries) renamed to the enclosing
table's: what comes from outside is checked by the segment as any array it reads, and
the arrays the LOOP writes are the segment's fresh outputs (what the caller may see)
or arrays of the step's own, kept from call to call (a stack nothing but the plan reads,
the buffers of a carry handed on, an unused final carry), one set per arena: a loop
body's two arenas each have theirs. It gives ThinScan's bits (the same BLAS calls by
NumPy's rules, the same LOOP).

Only a scan ThinScan runs without a step of its own before or after the loop: no sums
after it (a weight's gradient), no consts copied transposed, no stacks transposed after
it, no stacked output that is a carry shifted by a step (which shares a stack with it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastgrad.runtime import adapters
from fastgrad.runtime.plan_rows import gemm_row, vector_row
from fastgrad.runtime.vm import GEMM, HEADER, LOOP_CARRY, LOOP_COPY, LOOP_HEAD, LOOP_IN, LOOP_OUT
from fastgrad.runtime.vm_vectors import DOT, GEMV, NOBLAS


def embeddable(step: Any) -> bool:
    """Whether LoopStep `step`'s LOOP may become rows of the enclosing table once built."""
    thin, hoisted = step.thin_call(), step.hoisted
    if thin is None or thin.pairs:
        return False
    return hoisted is None or not hoisted.around_loop


def rows(segment: Any, step: Any) -> list[list[int]] | None:
    """The rows that run LoopStep `step` in `segment` (hoisted products, then the LOOP),
    or None where it cannot (then it stays a host step, and the segment is unchanged):
    its arrays in the segment's env (the run just made) must be those its LOOP was built
    for."""
    if not embeddable(step) or (
        step.largest_matmul and step.one_thread != segment.table.one_thread
    ):
        return None  # (its bodies' BLAS threads are set around the loop: as the table's)
    env, thin, call = segment.env, step.thin, step.call
    arrays = [env[slot] for slot in step.ins]
    for x, dtype in zip(arrays, thin.dtypes, strict=True):
        if type(x) is not np.ndarray or x.dtype != dtype or not x.flags.c_contiguous:
            return None
    nc, ncar = call.n_consts, call.n_carry
    owned = step.owned.setdefault(id(env), {})  # this arena's arrays of the step's own
    consts, xs = arrays[:nc], arrays[nc + ncar :]
    # The inner scan's inputs (consts, carries, stacked inputs): (array, slot or None)
    inputs: list[tuple[np.ndarray, int | None]] = list(zip(arrays, step.ins, strict=True))
    products = []  # (fields, operand slots, output)
    if step.hoisted is not None:
        inputs = inputs[: nc + ncar]
        inputs += [(xs[i], step.ins[nc + ncar + i]) for i in step.hoisted.xs_read]
        for n, p in enumerate(step.hoisted.products):
            x, w = xs[p.x], consts[p.w]
            flat = x.reshape(-1, x.shape[-1])  # (a view: x is C-contiguous)
            shape = (flat.shape[0], w.shape[0 if p.left else 1])
            out = _own(owned, ("product", n), shape, x.dtype)
            b = w.T if p.left else w
            fields = gemm_row(flat, b, out, False) or vector_row(flat, b, out)
            if fields is None or (len(fields) == 5 and not _vector_rows(segment)):
                return None
            products.append((fields, [step.ins[nc + ncar + p.x], step.ins[p.w]], out))
            inputs.append((out.reshape(len(x), *p.shape), None))
    slots: dict[int, list[int]] = {}  # output number -> its slots (one per node)
    for k, slot in step.outs:
        slots.setdefault(k, []).append(slot)
    # The arrays the LOOP writes: (output number, array, fresh at each call?); in a loop
    # body's arena none is fresh (the enclosing loop copies what it keeps, as it does
    # from the body's buffers).
    stacks = []
    for j, aval in thin.alone:  # (no pairs: each stacked output in an array of its own)
        fresh = ncar + j in slots and j not in step.private and not step.in_body
        y = (
            np.empty(aval.shape, aval.dtype)
            if fresh
            else _own(owned, ("stack", j), aval.shape, aval.dtype)
        )
        stacks.append((ncar + j, y, fresh))
    program = step.looped.program
    stores = [(y, thin.n_inner_carry + k - ncar) for k, y, _ in stacks]
    values = [x for x, _ in inputs]
    if (
        len(stores) != len(program.stacks)
        or program.arrays(values[:nc], values[nc : nc + ncar], values[nc + ncar :], stores) is None
    ):
        return None  # (layouts other than the LOOP's)
    finals = [
        (k, np.empty(shape, dtype) if fresh else _own(owned, ("final", k), shape, dtype), fresh)
        for k, (shape, dtype) in enumerate(program.finals)
        for fresh in [k in slots and not step.in_body]
    ]
    if any(fresh and len(slots[k]) > 1 for k, _, fresh in [*stacks, *finals]):
        return None  # (an array the caller sees, in two slots)
    # The segment's rows and pointers: nothing above has changed the segment.
    outer = [
        segment.operand(slot) if slot is not None else _fixed(segment, x) for x, slot in inputs
    ]
    product_rows = [
        _product(segment, fields, ins, _fixed(segment, out)) for fields, ins, out in products
    ]
    for k, array, fresh in [*stacks, *finals]:
        if fresh:
            (slot,) = slots[k]
            outer.append(segment.output(slot, (array.shape, array.dtype, k, None)))
            env[slot] = array
        else:  # each slot's pointer holds its address
            outer.append([_fixed(segment, array, slot) for slot in slots.get(k, [None])][0])
    for h, (shape, dtype) in enumerate(program.pairs):
        outer.append(_fixed(segment, _own(owned, ("pair", h), shape, dtype)))
    # Its LOOP's tables (and those of the loops nested in it) run by one thread at a time:
    # the segment holds the step's lock for a run (else runs its steps one by one).
    for lock in step.row_locks:
        if all(lock is not held for held in segment.locks):
            segment.locks.append(lock)
    return [*product_rows, _renamed(program, outer)]


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
    """The row of a product whose operands are in slots `ins` and output at pointer
    `index`, from `fields` (plan_rows.gemm_row's, or vector_row's), as `np.matmul`
    computes it."""
    table = segment.table
    if len(fields) == 3:  # gemm_row's
        (gemm, syrk), params, offsets = fields
        pointers = [segment.operand(ins[0]), segment.operand(ins[1]), index]
        return [GEMM, table.function(gemm), table.function(syrk), -1, *params, *pointers, *offsets]
    kind, address, params, order, offsets = fields
    job = adapters.vector_rows(table.wait)
    if not job.settled.is_set():
        table.pending.append(job)
    function = table.function(job.address) if job.address is not None else -1
    pointers = [*(segment.operand(ins[i]) for i in order), index]
    if kind == "noblas":
        return [NOBLAS, function, *params, *pointers, *offsets]
    op = GEMV if kind == "gemv" else DOT
    return [op, function, table.function(address), *params, *pointers, *offsets]


def _vector_rows(segment: Any) -> bool:
    """Whether the interpreter's vector rows are compiled or compiling (not failed)."""
    job = adapters.vector_rows(segment.table.wait)
    return not job.settled.is_set() or job.address is not None


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
