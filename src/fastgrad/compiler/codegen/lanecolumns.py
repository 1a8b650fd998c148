"""Column kernels whose operands span the reduced axis but are broadcast over kept ones
(bench M4's backward pass: an (N, 8, 2) loop summed over N that reads x[:, None, :] and
an (N, 8, 1) cotangent), with short kept axes.

The raveled column form (codegen.columns) reads such operands through a table of offsets:
a vector gather per element, ~13 ms for M4's 1.6e7 elements. Here the rows run in order
and, per row, the kept positions with the longest kept axis innermost (`loop_order`):
its elements go into the vector lanes, read in order from every operand that varies
along it (M4's cotangent, 8 wide) and broadcast from those that do not (x's element
along the other axis); each position has one accumulator, in the loop's order, so no
operand is copied or transposed. The lanes once held 64 rows of a block, each operand
copied in transposed: the copies took as long as the arithmetic (M4's float32 sum 8.6 ->
6.2 ms of CPU, float64 14.6 -> 12.9 ms). The kept lengths are arguments: one kernel
serves every short length.

Accumulation: a float32 sum adds each position's terms in float32 over runs of
`runs.COLUMN_RUN` rows, then into float64 partials (docs/conventions.md "Accuracy of
reductions"); partials are kept per block of rows of a count set by the sizes only, and
folded in order, so no result depends on the thread count.
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
from fastgrad.compiler.codegen.rowblocks import SHORT_ROW
from fastgrad.compiler.codegen.runs import COLUMN_RUN, in_runs
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

# At most this many kept positions (a chunk's accumulators).
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
    """The loop over rows in order, the longest kept axis innermost (the module's
    docstring)."""
    g, w, nodes = state.g, state.w, state.nodes
    u = "np.uint64"
    shape, outer = g.loop.shape, g.outer
    operands = [*g.arrays, *g.loop.outputs]
    kinds = {id(v): _operand_kind(v.aval.shape, shape, 1) for v in operands}
    names = {**g.in_name, **g.out_name}
    g.imports.add("fastgrad.compiler.codegen.support:flat")
    for v in operands:
        w(f"{names[id(v)]}f = flat({names[id(v)]})")
    w(f"K = {' * '.join(f'{u}(n{a})' for a in outer)}")
    w("L = K")  # for columns._offsets: rows of one loop row
    w(f"m = {u}(1)")
    for v in g.arrays:  # tiles of K: the kept positions' values in C order, for row values
        if kinds[id(v)] == "small":
            _offsets(w, names[id(v)], kinds[id(v)], v.aval.shape, shape, outer)
    order = loop_order(shape, outer)

    def element(v: Var, at: str = "i") -> str:
        """v's element at the loop's indices {at}{a}: its own C-order offset."""
        padded = (1,) * (len(shape) - v.aval.ndim) + v.aval.shape
        terms, stride = [], ""
        for a in reversed(range(len(shape))):
            if padded[a] == 1:
                continue
            index = f"{at}{a}"
            terms.append(f"{index} * {stride}" if stride else index)
            stride = f"{stride} * {u}(n{a})" if stride else f"{u}(n{a})"
        return " + ".join(reversed(terms)) or f"{u}(0)"

    def address(v: Var, at: str) -> str:
        name, kind = names[id(v)], kinds[id(v)]
        if kind == "one":
            return f"{name}f[0]"
        if at != "elem":
            return f"{name}f[j]" if kind in ("kept", "whole") else f"{name}t[j]"
        return f"{name}l[j]" if kind in ("kept", "small") else f"{name}f[{element(v)}]"

    # Operands broadcast over the rows, in the loop's order of positions: the innermost
    # loop reads them in order.
    for v in g.arrays:
        if kinds[id(v)] in ("kept", "small"):
            name = names[id(v)]
            w(f"{name}l = np.empty(K, {name}f.dtype)")
            for depth, a in enumerate(order):
                w(f"{'    ' * depth}for ix{a} in range({u}(n{a})):")
            w(f"{'    ' * len(order)}{name}l[{_flat(order, 'ix')}] = {name}f[{element(v, 'ix')}]")
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
        w(f"p{k} = np.empty((nb, K), {accumulator_type(n)})")
        if n in tiled:
            w(f"t{k}T = np.empty((nb, K), {t})")
    w(f"for c in {'prange' if g.parallel else 'range'}(nb):")
    w.indent()
    g.in_chunk = True
    body_begin, g.body_depth = len(w.lines), w.depth
    w(f"lo = {u}((c * n0) // nb)")
    w(f"hi = {u}(((c + 1) * n0) // nb)")
    for n in reducers:
        k = g.index[id(n.out)]
        w(f"p{k}[c, :] = {accumulator_init(n)}")
        if n in tiled:
            w(f"t{k} = t{k}T[c]")
    # A float32 sum adds each position's terms in float32 over a run of COLUMN_RUN rows.
    w(f"for rb in range(lo, hi, {u}({COLUMN_RUN})):")
    w.indent()
    for n in tiled:
        w(f"t{g.index[id(n.out)]}[:] = {reduction_init(n.op.name, n.out.aval.dtype)}")
    w(f"for i0 in range(rb, min(rb + {u}({COLUMN_RUN}), hi)):")
    w.indent()
    for a in order:
        w(f"for i{a} in range({u}(n{a})):")
        w.indent()
    w(f"j = {_flat(order)}")
    _element_values(state, reducers)
    for n in reducers:
        k = g.index[id(n.out)]
        acc = f"t{k}[j]" if n in tiled else f"p{k}[c, j]"
        w(f"{acc} = {fold_in(g, n, acc, g.reduced(n, native=n in tiled))}")
    w.dedent(1 + len(order))
    if tiled:  # the run's totals into the float64 partials
        w("for e in range(K):")
        for n in tiled:
            k = g.index[id(n.out)]
            w(f"    p{k}[c, e] = radd(p{k}[c, e], {widen(n, f't{k}[e]')})")
    w.dedent()
    g.body = (body_begin, len(w.lines))
    g.in_chunk = False
    w.dedent()
    # Per kept position j (C order): its place in the loop's order, its partials folded in
    # order (blocks of rows), then the row values.
    w("for j in range(K):")
    w.indent()
    w("q = j")
    for a in reversed(outer):
        w(f"i{a} = q % {u}(n{a})")
        w(f"q = q // {u}(n{a})")
    w(f"jl = {_flat(order)}")
    for n in reducers:
        k = g.index[id(n.out)]
        _fold(w, n, f"p{k}", f"{k}", "if True:", "jl")
    row_values(state)
    w.dedent()
    g.flat_columns = None
    return g.tail(state, column=True)


def loop_order(shape: tuple[int, ...], kept: list[int]) -> list[int]:
    """The kept axes in the order of the loops over them: the longest (the last of equals)
    innermost, where its elements go into the vector lanes; the others in order."""
    inner = max(kept, key=lambda a: (shape[a], a))
    return [a for a in kept if a != inner] + [inner]


def _flat(axes: list[int], at: str = "i") -> str:
    index = f"{at}{axes[0]}"
    for a in axes[1:]:
        index = f"({index} * np.uint64(n{a}) + {at}{a})"
    return index
