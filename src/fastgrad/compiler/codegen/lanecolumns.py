"""Column kernels whose operands span the reduced axis but are broadcast over kept ones
(bench M4's backward pass: an (N, 8, 2) loop summed over N that reads x[:, None, :] and
an (N, 8, 1) cotangent), with short kept axes.

The raveled column form (codegen.columns) reads such operands through a table of offsets:
a vector gather per element, ~13 ms for M4's 1.6e7 elements. Here the rows of the
reduced axis are taken in blocks of `BLOCK`, in the vector lanes: a block of each such
operand is copied in transposed (its kept positions' lanes adjacent), then each kept
position accumulates its block of rows lane by lane, with no gather (M4's float32 sum
13.4 -> 2.8 ms of CPU, float64 16.4 -> 11.5 ms). The kept axes' lengths are in the source
(each shorter than rowblocks.SHORT_ROW), so LLVM unrolls the transpositions; full blocks
run with a constant row count (half the time of a count known only at run time).

Accumulation: a float32 sum adds each lane's terms in float32 over `LANE_RUN` blocks,
then into float64 partials (docs/conventions.md "Accuracy of reductions"); partials are
kept per block of rows of a count set by the sizes only, and folded in order, so no
result depends on the thread count.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fastgrad.compiler.codegen.columns import (
    _element_values,
    _fold,
    _offsets,
    _operand_kind,
    column_run,
    fold_in,
    row_values,
)
from fastgrad.compiler.codegen.rowblocks import BLOCK, SHORT_ROW, copy_block, full_blocks
from fastgrad.compiler.codegen.runs import in_runs
from fastgrad.compiler.codegen.schedule import KernelState
from fastgrad.compiler.codegen.source import (
    KernelSource,
    accumulator_init,
    accumulator_type,
    reduction_init,
    scalar_type,
    widen,
)
from fastgrad.core.ir import Node, Var

if TYPE_CHECKING:
    from fastgrad.compiler.codegen.loops import _Generator

# Blocks of rows a float32 lane sums before its total goes into the float64 partials.
LANE_RUN = 16
# At most this many kept positions (a block's accumulators: BLOCK per position).
MAX_POSITIONS = 256
# Blocks of rows kept apart (partials per block, in parallel), each at least this long.
_PARTS, _PART_ROWS = 16, 4096


def lane_columnable(g: _Generator, nodes: list[Node], scalar_reductions: list[Node]) -> bool:
    """Whether a one-pass column loop takes this form: one reduced axis, the first; short
    kept axes; an operand read through a table in the raveled form; no elementwise
    output, full reduction, row pick or random sample."""
    shape, outer = g.loop.shape, g.outer
    if g.inner != [0] or not outer or shape[0] == 1 or scalar_reductions:
        return False
    if any(not 1 <= shape[a] < SHORT_ROW for a in outer) or math.prod(shape[1:]) > MAX_POSITIONS:
        return False
    if any(n.op.name in ("gather", "scatter_add") or n.op.extra.get("positional") for n in nodes):
        return False
    if any(g.loop.level[id(v)] == "elem" for v in g.loop.outputs):
        return False
    kinds = [_operand_kind(v.aval.shape, shape, 1) for v in [*g.arrays, *g.loop.outputs]]
    return all(kinds) and "table" in kinds


def column_kernel(state: KernelState) -> KernelSource:
    """A loop whose reduced axes lead: in this module's form where it applies, else in
    codegen.columns'."""
    if lane_columnable(state.g, state.nodes, state.sched.scalar_reductions):
        return lane_run(state)
    return column_run(state)


def lane_run(state: KernelState) -> KernelSource:
    """The loop in blocks of rows in the lanes (see the module's docstring)."""
    g, w, nodes = state.g, state.w, state.nodes
    u = "np.uint64"
    shape, outer = g.loop.shape, g.outer
    operands = [*g.arrays, *g.loop.outputs]
    kinds = {id(v): _operand_kind(v.aval.shape, shape, 1) for v in operands}
    names = {**g.in_name, **g.out_name}
    for a in outer:
        w(f"n{a} = {u}({shape[a]})")
    g.imports.add("fastgrad.compiler.codegen.support:flat")
    for v in operands:
        w(f"{names[id(v)]}f = flat({names[id(v)]})")
    w(f"K = {' * '.join(f'n{a}' for a in outer)}")
    w("L = K")  # for columns._offsets: rows of one loop row
    w(f"m = {u}(1)")
    for v in g.arrays:  # tiles of K: the kept positions' values in order
        if kinds[id(v)] in ("kept", "small"):
            _offsets(w, names[id(v)], kinds[id(v)], v.aval.shape, shape, outer)

    def rest(v: Var) -> list[int]:
        return [a for a, d in zip(outer, v.aval.shape[1:], strict=True) if d != 1]

    def flat(axes: list[int]) -> str:
        index = f"i{axes[0]}"
        for a in axes[1:]:
            index = f"({index} * n{a} + i{a})"
        return index

    lanes = [v for v in g.arrays if kinds[id(v)] in ("whole", "table") and rest(v)]

    def address(v: Var, at: str) -> str:
        name, kind = names[id(v)], kinds[id(v)]
        if kind == "one":
            return f"{name}f[0]"
        if at != "elem":
            return f"{name}f[j]" if kind in ("kept", "whole") else f"{name}t[j]"
        if v in lanes:
            return f"{name}b[({flat(rest(v))}) * {u}({BLOCK}) + r]"
        if kind in ("whole", "table"):  # along the reduced axis only
            return f"{name}f[rb + r]"
        return f"{name}t[j]"

    g.flat_columns = address
    reducers = [n for n in nodes if id(n.out) in state.sched.reduce_phase]
    tiled = [n for n in reducers if in_runs(n)]
    w(f"nb = max({u}(1), min({u}({_PARTS}), {u}(n0) // {u}({_PART_ROWS})))")
    # Every array the chunk loop stores into is allocated here, one row per chunk, and the
    # loop is outlined (codegen.outline): LLVM then needs no run-time check that they do not
    # overlap (16 sums ran scalar: 16x the time of 8).
    g.outline = True
    for n in reducers:
        k, t = g.index[id(n.out)], scalar_type(n.out.aval.dtype)
        w(f"p{k} = np.empty((nb, K * {u}({BLOCK})), {accumulator_type(n)})")
        if n in tiled:
            w(f"t{k}T = np.empty((nb, K * {u}({BLOCK})), {t})")
    for v in lanes:
        size = " * ".join([f"{u}({BLOCK})", *(f"n{a}" for a in rest(v))])
        w(f"{names[id(v)]}B = np.empty((nb, {size}), {scalar_type(v.aval.dtype)})")
    w(f"for c in {'prange' if g.parallel else 'range'}(nb):")
    w.indent()
    g.in_chunk = True
    body_begin, g.body_depth = len(w.lines), w.depth
    w(f"lo = {u}((c * n0) // nb)")
    w(f"hi = {u}(((c + 1) * n0) // nb)")
    for v in lanes:
        w(f"{names[id(v)]}b = {names[id(v)]}B[c]")
    for n in reducers:
        k = g.index[id(n.out)]
        w(f"p{k}[c, :] = {accumulator_init(n)}")
        if n in tiled:
            w(f"t{k} = t{k}T[c]")
            w(f"t{k}[:] = {reduction_init(n.op.name, n.out.aval.dtype)}")
    w("q = 0")
    w(f"for rb in range(lo, hi, {u}({BLOCK})):")
    w.indent()
    w(f"nr = min({u}({BLOCK}), hi - rb)")
    start = len(w.lines)
    for v in lanes:  # the block's rows, transposed
        copy_block(w, v, names[id(v)], rest(v), address(v, "elem"), inward=True)
    for a in outer:
        w(f"for i{a} in range(n{a}):")
        w.indent()
    w(f"j = {flat(outer)}")
    w("for r in range(nr):")
    w.indent()
    _element_values(state, reducers)
    for n in reducers:
        k = g.index[id(n.out)]
        acc = f"t{k}[j * {u}({BLOCK}) + r]" if n in tiled else f"p{k}[c, j * {u}({BLOCK}) + r]"
        operand = g.reduced(n, native=n in tiled)
        w(f"{acc} = {fold_in(g, n, acc, operand)}")
    w.dedent(1 + len(outer))
    full_blocks(w, start)
    if tiled:  # a float32 run ends every LANE_RUN blocks, and at the chunk's end
        w("q += 1")
        w(f"if q == {LANE_RUN} or rb + {u}({BLOCK}) >= hi:")
        w("    q = 0")
        w(f"    for e in range(K * {u}({BLOCK})):")
        for n in tiled:
            k = g.index[id(n.out)]
            w(f"        p{k}[c, e] = radd(p{k}[c, e], {widen(n, f't{k}[e]')})")
            w(f"        t{k}[e] = {reduction_init(n.op.name, n.out.aval.dtype)}")
    w.dedent()
    g.body = (body_begin, len(w.lines))
    g.in_chunk = False
    w.dedent()
    # Per kept position: its partials folded in order (blocks of rows, then lanes), then
    # the row values.
    w("for j in range(K):")
    w.indent()
    for n in reducers:
        k = g.index[id(n.out)]
        _fold(w, n, f"p{k}", f"{k}", f"for t in range({u}({BLOCK})):", f"j * {u}({BLOCK}) + t")
    row_values(state)
    w.dedent()
    g.flat_columns = None
    return g.tail(state, column=True)
