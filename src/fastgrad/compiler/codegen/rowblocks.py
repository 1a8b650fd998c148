"""Row kernels over short rows: blocks of rows, with the loops over a block's rows inside.

A loop reducing a short last axis (the 8 components of a mixture's logsumexp) runs one
row at a time in the ordinary form, each row's inner loop too short for vector
instructions: it runs scalar, 4x slower than over rows of 64 (bench M4). Here the rows
of the first axis are taken in blocks of `BLOCK`; each pass runs over the inner axis
outside and the block's rows inside, so the vector lanes hold rows. Row values are
arrays over the block; reductions accumulate per row, in the inner axis's order as the
ordinary form does. Operands varying along the first axis and another are copied in (and
out) transposed, a block at a time; further outer axes (M4's (N, 8, 2) loops, whose x[:,
None, :] keeps their axes from merging) are loops around a block's passes. Chosen where
the reduced axis is shorter than `SHORT_ROW` (but float64's one-pass reductions run one
row at a time: row_blocks); the length of every axis that short is written into the
source (a size class, like a rank: one kernel per length), so that LLVM unrolls the
loops over it and vectorizes the transpositions (M4's logsumexp over (1e6, 8) took 17 ->
11 ms of CPU with it). A block's last pass, where it only writes (a softmax's p / sum),
runs row after row and writes its outputs in place instead of into the block and copying
them out (M4's logsumexp loop 0.90-0.92x float32, 0.90-0.93x float64, same bits); a
pass whose reductions are all per row runs row after row too, the short axis inside, so
each row's accumulator stays in a register (then 0.93x and 0.97x; M4's (N, 8, 2) sum over
its last axis 0.83x float32; one process alternating, min of 40, load 9-12). Once
written, adjacent passes are merged and stores no later pass reads dropped
(codegen.rowpasses).
Several-pass reductions over the leading axis of a 2-D loop run in blocks of columns the
same way, the block's columns in the lanes (column_blockable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fastgrad.compiler.codegen.columns import fold_in
from fastgrad.compiler.codegen.rowpasses import Tag, lay_out
from fastgrad.compiler.codegen.runs import COLUMN_RUN, in_runs
from fastgrad.compiler.codegen.schedule import KernelState, Schedule
from fastgrad.compiler.codegen.source import (
    KernelSource,
    Writer,
    accumulate,
    accumulator_init,
    accumulator_type,
    init_scalars,
    narrow,
    reduction_init,
    scalar_type,
    trips,
    widen,
)
from fastgrad.compiler.fusion import row_drop
from fastgrad.core.ir import Node, Var

if TYPE_CHECKING:
    from fastgrad.compiler.codegen.loops import _Generator

# Reduced axes shorter than this run in blocks of rows; rows per block.
SHORT_ROW = 16
BLOCK = 64
_UNBLOCKED = ("gather", "scatter_add")


def blockable(g: _Generator, nodes: list[Node]) -> bool:
    """Whether the loop reduces a short last axis, its first axis is blocked, and every
    node reads elements at their own point (row picks and random samples index by axis).
    Over more outer axes (bench M4's (N, 8, 2) loops), a block holds rows of the first
    axis only and the others are loops around the block's passes: taking rows from
    several axes, a block's rows would need their indices from a table, LLVM then cannot
    tell that the loop's stores miss its loads, and vectorizes nothing. A value of the
    row shape without the reduced axis that NumPy's broadcasting would also align with
    the loop's trailing axes is refused (its transposed layout would be ambiguous)."""
    shape = g.loop.shape
    drop = row_drop(shape, g.loop.reduce_axes)
    return (
        not g.flat
        and len(shape) >= 2
        and g.inner == [len(shape) - 1]
        and 0 < shape[-1] < SHORT_ROW
        and (len(shape) == 2 or shape[0] != 1 and drop != shape[len(shape) - len(drop) :])
        and not any(n.op.name in _UNBLOCKED or n.op.extra.get("positional") for n in nodes)
    )


def row_blocks(g: _Generator, w: Writer, nodes: list[Node], sched: Schedule) -> bool:
    """Whether the loop runs in blocks of rows (blockable), or else in the ordinary form,
    one row at a time, with the short axes' lengths written into the source here, so that
    LLVM unrolls each row's loop. That form is taken where every reduction is one pass
    over float64 values: the block form's transposed copies of float64 operands go by
    their own indices (copy_block) and cost more than the lanes gain. One-pass sum, max
    and mean of squares over (1e6, 2 / 4 / 7 / 8) and (1e6, 4 / 8, 2) took 0.60-0.90x
    the block form's CPU time (one tie, 1.03x), with AVX-512 code and with AVX2 code
    (Numba's CPU set to haswell) alike, so no rule by vector width; M4's (N, 8, 2)
    float64 sum 10.5 -> 8.1 ms. Float32's are mixed (0.73-1.41x) and several-pass ones
    (logsumexp) 4.6-5.7x slower: blocks."""
    if not blockable(g, nodes):
        return False
    reduced = [n.inputs[0].aval.dtype for n in nodes if id(n.out) in sched.reduce_phase]
    if sched.n_phases > 1 or not reduced or any(d != np.float64 for d in reduced):
        return True
    short_lengths(g, w)
    return False


def short_lengths(g: _Generator, w: Writer) -> None:
    """The lengths of the loop's short inner and non-first outer axes, as constants (a
    size class, like a rank: one kernel per length)."""
    for a in g.inner + g.outer[1:]:
        if g.loop.shape[a] < SHORT_ROW:
            w(f"n{a} = np.uint64({g.loop.shape[a]})")


def _blocked(g: _Generator, v: Var) -> list[int] | None:
    """For an operand of a block form: the loop axes of its dims after the first that are
    not 1, where it varies along the blocked first axis and along one of them too (its
    block is copied in or out transposed); else None (read where it is: one address per
    row, or the same for all rows)."""
    shape, ndim = v.aval.shape, len(g.loop.shape)
    if len(shape) == ndim:
        axes = list(range(ndim))
    elif shape == row_drop(g.loop.shape, g.loop.reduce_axes):
        axes = g.outer
    else:
        return None  # aligned with the trailing axes: the same for every row
    rest = [a for a, d in zip(axes[1:], shape[1:], strict=True) if d != 1]
    return rest if axes[0] == 0 and shape[0] != 1 and rest else None


def column_blockable(g: _Generator, nodes: list[Node], sched: Schedule) -> bool:
    """Whether the loop reduces the leading axis of a 2-D shape in several passes (a
    logsumexp or softmax over axis 0; one pass is codegen.columns'). Blocks of columns run
    as blocks of short rows do, without the transposition: a block's columns are already
    adjacent in memory. The ordinary form walks each column down its stride, scalar
    (logsumexp over axis 0 of 4096x1024 float32: 2% of the exp map's speed). Values kept
    for a later pass would take a block times the column's length: recomputed instead."""
    return (
        not g.flat
        and len(g.loop.shape) == 2
        and g.inner == [0]
        and g.outer == [1]
        and sched.n_phases > 1
        and not sched.stored
        and not sched.scalar_reductions  # their partials per chunk would then vary
        and not any(n.op.name in _UNBLOCKED or n.op.extra.get("positional") for n in nodes)
    )


def block_run(state: KernelState, transpose: bool = True) -> KernelSource:
    """Blocks of BLOCK rows (or, `transpose` False, columns: column_blockable), the
    block's rows in the innermost loops."""
    g, w, nodes, level, outputs = state.g, state.w, state.nodes, state.level, state.outputs
    sched = state.sched
    u = "np.uint64"
    inner = g.inner[0]
    scalar_index = sched.scalar_index
    rows = [n for n in nodes if level[id(n.out)] == "row"]
    if transpose:  # short axes' lengths as constants (the module's docstring)
        short_lengths(g, w)
    names = {**g.in_name, **g.out_name}
    operands = [*g.arrays, *(v for v in g.loop.outputs if level[id(v)] != "scalar")]
    blocked = {id(v): (v, rest) for v in operands if transpose and (rest := _blocked(g, v))}
    for v, _ in blocked.values():  # copy_block's view
        if v.aval.dtype.itemsize < 8:
            g.imports.add("fastgrad.compiler.codegen.support:flat")
            w(f"{names[id(v)]}f = flat({names[id(v)]})")
    w(f"for c in {'prange' if g.parallel else 'range'}(nchunks):")
    w.indent()
    init_scalars(w, sched.scalar_reductions)
    # Every row value, accumulator, stored elem value and transposed operand of a block is in
    # one array per dtype, at offsets whose distance LLVM sees: with an array each, the loop
    # over a block's rows needs more overlap checks than LLVM makes, and stays scalar.
    at: dict[str, str] = {}  # "w3", "t8", "a0" -> its place in its dtype's array
    taken: dict[str, tuple[int, list[str]]] = {}  # dtype -> elements used: blocks, and more

    def place(key: str, dtype: str, blocks: int, more: str = "") -> None:
        count, parts = taken.get(dtype, (0, []))
        at[key] = f"{_array(dtype)}[{' + '.join([f'{u}({count * BLOCK})', *parts])} + "
        taken[dtype] = (count + blocks, parts + [more] if more else parts)

    for n in rows:
        place(f"w{g.index[id(n.out)]}", scalar_type(n.out.aval.dtype), 1)
    # A short row's float32 sum has fewer terms than a run (codegen.runs): it adds them
    # in float32, as a block's full sums do (per block). A column's (column_blockable)
    # accumulates in a float64 slot of its own.
    widened = {id(n.out) for n in [*rows, *sched.scalar_reductions] if in_runs(n)}
    native = widened if transpose else {id(n.out) for n in sched.scalar_reductions} & widened
    acc_slot = {id(n.out): f"w{g.index[id(n.out)]}" for n in rows}
    for n in rows:
        if id(n.out) in sched.reduce_phase and id(n.out) in widened - native:
            acc_slot[id(n.out)] = f"x{g.index[id(n.out)]}"
            place(acc_slot[id(n.out)], accumulator_type(n), 1)
    for k in sorted(g.index[i] for i in sched.stored):
        place(f"t{k}", scalar_type(nodes[k].out.aval.dtype), 0, f"{u}({BLOCK}) * {u}(n{inner})")
    # Operands varying along the blocked axis and another are copied in (and out)
    # transposed, a block at a time, so the loops over a block's rows read and write them
    # in order.
    for v, rest in blocked.values():
        size = " * ".join(f"{u}(n{a})" for a in rest)
        place(names[id(v)], scalar_type(v.aval.dtype), 0, f"{u}({BLOCK}) * {size}")
    for dtype, (count, parts) in taken.items():
        w(f"{_array(dtype)} = np.empty({' + '.join([f'{u}({count * BLOCK})', *parts])}, {dtype})")

    def slot(key: str, index: str) -> str:
        return f"{at[key]}{index}]"

    def flat(rest: list[int]) -> str:
        """The index of the current point in a transposed block (row r's)."""
        index = f"i{rest[0]}"
        for a in rest[1:]:
            index = f"({index} * {u}(n{a}) + i{a})"
        return f"{index} * {u}({BLOCK}) + r"

    for v, rest in blocked.values():
        g.transposed[id(v)] = slot(names[id(v)], flat(rest))

    def copy(v: Var, rest: list[int], inward: bool) -> None:
        copy_block(w, v, names[id(v)], rest, slot(names[id(v)], flat(rest)), inward)

    o = g.outer[0]
    w(f"lo = {u}((c * n{o}) // nchunks)")
    w(f"hi = {u}(((c + 1) * n{o}) // nchunks)")
    w(f"for rb in range(lo, hi, {u}({BLOCK})):")
    w.indent()
    w(f"nr = min({u}({BLOCK}), hi - rb)")
    start = len(w.lines)
    for v, rest in blocked.values():
        if id(v) in g.in_name:
            copy(v, rest, inward=True)
    # Further outer axes: loops around the block's passes (their trip counts, as any
    # kernel's). A float32 full sum's run is a block's terms at one point of them: at
    # most BLOCK x (SHORT_ROW - 1) < RUN (codegen.runs).
    middle = g.outer[1:]
    for a in middle:
        w(f"for i{a} in range({trips(g.loop.shape, a)}):")
        w.indent()
    block_sums = [(k, n) for k, n in enumerate(sched.scalar_reductions) if id(n.out) in native]
    for k, n in block_sums:
        w(f"s{k}r = {reduction_init(n.op.name, n.out.aval.dtype)}")
    done: set[int] = set()
    in_place: set[int] = set()  # outputs the last pass wrote where they belong
    tags: dict[int, Tag] = {}  # what lines are, for codegen.rowpasses' layout

    def tagged(line: str, tag: Tag) -> None:
        tags[len(w.lines)] = tag
        w(line)

    def open_rows() -> None:
        tagged("for r in range(nr):", Tag("head"))
        w.indent()
        tagged(f"i{o} = rb + r", Tag("row"))  # affine: LLVM can check arrays do not overlap
        for n in rows:  # the row values known so far, read back (unused reads vanish)
            if id(n.out) in done:
                k = g.index[id(n.out)]
                tagged(f"v{k} = {slot(f'w{k}', 'r')}", Tag("read", k, n.out.aval.dtype.itemsize))

    def keep(n: Node) -> None:
        k = g.index[id(n.out)]
        tagged(f"{slot(f'w{k}', 'r')} = v{k}", Tag("store", k, n.out.aval.dtype.itemsize))
        g.after_value(w, n, "row", outputs, scalar_index)
        done.add(id(n.out))

    def emit_rows(up_to: int) -> None:
        now = [
            n
            for n in rows
            if id(n.out) not in done
            and id(n.out) not in sched.reduce_phase
            and sched.avail[id(n.out)] <= up_to
        ]
        if not now:
            return
        open_rows()
        for n in now:
            g.assign(w, f"v{g.index[id(n.out)]}", g.expression(n, "row"))
            keep(n)
        w.dedent()

    for p in range(sched.n_phases):
        emit_rows(p)
        sinks, reducers, needed = sched.plan[p]
        row_reducers = [n for n in reducers if id(n.out) in sched.reduce_phase]
        # A pass whose reductions are all per row, over the short axis (its length in
        # the source): each row's points in turn, its accumulators in registers, where
        # the block's would be loaded and stored at every point. Same order per row.
        by_row = transpose and row_reducers and len(row_reducers) == len(reducers)
        inits = {}
        for n in row_reducers:
            init = accumulator_init(n)
            if id(n.out) in native:
                init = reduction_init(n.op.name, n.out.aval.dtype)
            inits[id(n.out)] = init
            if not by_row:
                w("for r in range(nr):")
                w(f"    {slot(acc_slot[id(n.out)], 'r')} = {init}")
        # A column's float32 sum: runs of COLUMN_RUN terms in its w slot, each added to
        # its float64 x slot (codegen.runs; widened term by term, logsumexp over axis 0
        # of 256x512 float32 took 1.36x as long).
        runs = [n for n in row_reducers if acc_slot[id(n.out)] != f"w{g.index[id(n.out)]}"]
        if runs:
            w(f"b{inner} = {u}(0)")
            w(f"while b{inner} < {u}(n{inner}):")
            w.indent()
            w(f"e{inner} = min(b{inner} + {u}({COLUMN_RUN}), {u}(n{inner}))")
            for n in runs:
                w("for r in range(nr):")
                zero = reduction_init(n.op.name, n.out.aval.dtype)
                w(f"    {slot(f'w{g.index[id(n.out)]}', 'r')} = {zero}")
        bounds = f"b{inner}, e{inner}" if runs else f"{u}(n{inner})"
        # The last pass, where it only writes: each row's points in turn, its blocked
        # outputs written in place, not into the block and copied out after.
        direct = not middle and p == sched.n_phases - 1 and not reducers and not runs
        direct = direct and any(id(v) in blocked for v in g.loop.outputs)
        if direct or by_row:
            open_rows()
            for n in row_reducers:
                w(f"racc{g.index[id(n.out)]} = {inits[id(n.out)]}")
            w(f"for i{inner} in range({bounds}):")
            w.indent()
        else:
            w(f"for i{inner} in range({bounds}):")
            w.indent()
            open_rows()
        for n in nodes:
            if id(n.out) not in needed:
                continue
            k = g.index[id(n.out)]
            stored = id(n.out) in sched.stored
            scratch = slot(f"t{k}", f"i{inner} * {u}({BLOCK}) + r") if stored else ""
            if id(n.out) in sched.stored and sched.phase[id(n.out)] < p:
                w(f"v{k} = {scratch}")
                continue
            if sched.phase[id(n.out)] < p:
                g.recomputed.append(f"{n.op.name} (phase {p})")
            g.assign(w, f"v{k}", g.expression(n, "elem"))
            if id(n.out) in sched.stored:
                w(f"{scratch} = v{k}")
            if id(n.out) in outputs and sched.phase[id(n.out)] == p:
                if direct and id(n.out) in blocked:
                    there = _there(n.out, names[id(n.out)], blocked[id(n.out)][1])
                    w(f"{there} = v{k}")
                    in_place.add(id(n.out))
                    continue
                w(f"{g.address(n.out, g.loop.shape, 'elem')} = v{k}")
        for n in reducers:
            operand = g.reduced(n, native=id(n.out) in native or n in runs)
            if id(n.out) in sched.reduce_phase:  # an accumulator per row: nothing carried
                acc = slot(f"w{g.index[id(n.out)]}" if n in runs else acc_slot[id(n.out)], "r")
                acc = f"racc{g.index[id(n.out)]}" if by_row else acc
                w(f"{acc} = {fold_in(g, n, acc, operand)}")
                continue
            acc = f"s{scalar_index[id(n.out)]}{'r' if id(n.out) in native else ''}"
            for line in accumulate(n, acc, operand):
                w(line)
        w.dedent()
        for n in row_reducers if by_row else []:
            k, size = g.index[id(n.out)], n.out.aval.dtype.itemsize
            tagged(f"{slot(acc_slot[id(n.out)], 'r')} = racc{k}", Tag("acc", k, size))
        w.dedent()
        if runs:
            for n in runs:
                total, run = slot(acc_slot[id(n.out)], "r"), slot(f"w{g.index[id(n.out)]}", "r")
                w("for r in range(nr):")
                w(f"    {total} = radd({total}, {widen(n, run)})")
            w(f"b{inner} = e{inner}")
            w.dedent()
        if row_reducers:
            open_rows()
            for n in row_reducers:
                acc, k = slot(acc_slot[id(n.out)], "r"), g.index[id(n.out)]
                tagged(
                    f"v{k} = {acc if id(n.out) in native else narrow(n, acc)}",
                    Tag("load", k, n.out.aval.dtype.itemsize, acc),
                )
                keep(n)
            w.dedent()
    emit_rows(sched.n_phases + 1)
    for k, n in block_sums:
        w(f"s{k} = radd(s{k}, {widen(n, f's{k}r')})")
    w.dedent(len(middle))
    for v, rest in blocked.values():
        if id(v) in g.out_name and id(v) not in in_place:
            copy(v, rest, inward=False)
    w.lines[start:] = lay_out(w.lines[start:], tags, start)
    if not transpose:  # blocks of rows measured no faster so (M4's (N, 8, 2) slower)
        full_blocks(w, start)
    w.dedent()
    g.body = (0, 0)
    return g._finish(state)


def copy_block(w: Writer, v: Var, name: str, rest: list[int], here: str, inward: bool) -> None:
    """Copy the block's rows of operand `v` (array `name`, its first axis blocked) into
    `here`, its transposed place at row r and the point of loop axes `rest` (its other
    axes that are not 1), or (not `inward`) back. A float32 array is addressed through
    its C-order view `{name}f` (support.flat), where a row's stride is a product of the
    short axes' constant lengths, so LLVM vectorizes the copy with interleaved loads: a
    sum over the last axis of (1e6, 8, 2) float32 took 7.0 -> 3.5 ms of CPU. A float64
    one by its own indices: through the view, M4's float64 kernels took 1.7-1.9x as long
    (an interleaved group of 8 doubles)."""
    w("for r in range(nr):")
    for depth, a in enumerate(rest, 1):
        w("    " * depth + f"for i{a} in range(np.uint64(n{a})):")
    there = _there(v, name, rest)
    pad = "    " * (len(rest) + 1)
    w(f"{pad}{here} = {there}" if inward else f"{pad}{there} = {here}")


def _there(v: Var, name: str, rest: list[int]) -> str:
    """Operand `v`'s element (array `name`) at row rb + r and the point of loop axes
    `rest`, where it is (copy_block's other end)."""
    if v.aval.dtype.itemsize < 8:
        index = f"i{rest[0]}"
        for a in rest[1:]:
            index = f"({index} * np.uint64(n{a}) + i{a})"
        size = " * ".join(f"np.uint64(n{a})" for a in rest)
        return f"{name}f[(rb + r) * {size} + {index}]"
    axes = iter(rest)
    index = ", ".join(["rb + r", *("0" if d == 1 else f"i{next(axes)}" for d in v.aval.shape[1:])])
    return f"{name}[{index}]"


def full_blocks(w: Writer, start: int) -> None:
    """The block's body from line `start` twice: for a full block, its loops over the
    block's lanes of a constant count, and for the last, partial one. LLVM then keeps a
    block's accumulators in registers: logsumexp over axis 0 of 4096x1024 float32 in
    blocks of columns 4.0 -> 3.2 ms of CPU, codegen.lanecolumns' sums 9.7 -> 4.8 ms."""
    body = w.lines[start:]
    pad = "    " * w.depth
    full = [line.replace("range(nr)", f"range(np.uint64({BLOCK}))") for line in body]
    w.lines[start:] = [
        f"{pad}if nr == np.uint64({BLOCK}):",
        *("    " + line for line in full),
        f"{pad}else:",
        *("    " + line for line in body),
    ]


def _array(dtype: str) -> str:
    """The name of a block's array of values of a scalar type ("f32", "np.bool_")."""
    return "b" + dtype.removeprefix("np.").rstrip("_")
