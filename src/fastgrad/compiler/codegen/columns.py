"""Column kernels: loops whose reduced axes all come before the kept ones (a bias gradient
summed over the batch, an (N, 8, 2) array summed over N).

Rows are walked in memory order, each element added into one accumulator per kept
position, so the inner loop runs along contiguous memory and vectorizes. The kept
positions are split into chunks (one per thread is enough); full reductions also keep one
accumulator per kept position, combined in order at the end, so no result depends on the
chunk count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastgrad.compiler.codegen.source import (
    KernelSource,
    Writer,
    accumulate,
    closure,
    combine,
    reduction_init,
    scalar_type,
    settle,
    tracks_nan,
)
from fastgrad.core.ir import Node

if TYPE_CHECKING:
    from fastgrad.compiler.codegen.loops import _Generator


def column_run(
    g: _Generator,
    w: Writer,
    args: list[str],
    nodes: list[Node],
    level: dict[int, str],
    outputs: set[int],
    reduce_phase: dict[int, int],
    scalar_reductions: list[Node],
) -> KernelSource:
    """The loop nest with the reduced (leading) axes outside the kept ones."""
    o, rest = g.outer[0], g.outer[1:]
    kept = ", ".join(f"n{a}" for a in g.outer)
    position = ", ".join(f"i{a}" for a in g.outer)
    local = ", ".join(["hi - lo", *(f"n{a}" for a in rest)])
    local_position = ", ".join([f"i{o} - lo", *(f"i{a}" for a in rest)])
    scalar_index = {id(n.out): k for k, n in enumerate(scalar_reductions)}
    for k, n in enumerate(scalar_reductions):
        w(f"q{k} = np.empty(({kept},), {scalar_type(n.out.aval.dtype)})")
        if tracks_nan(n):
            w(f"q{k}n = np.empty(({kept},), np.bool_)")
    g.scalar_acc = lambda k: f"q{k}[{position}]"
    w(f"for c in {'prange' if g.parallel else 'range'}(nchunks):")
    w.indent()
    g.in_chunk = True
    body_begin, g.body_depth = len(w.lines), w.depth
    w(f"lo = np.uint64((c * n{o}) // nchunks)")
    w(f"hi = np.uint64(((c + 1) * n{o}) // nchunks)")
    # Reset here, not before the chunk loop: a chunk that reruns (bounded trig) starts over.
    for k, n in enumerate(scalar_reductions):
        w(f"q{k}[lo:hi] = {reduction_init(n.op.name, n.out.aval.dtype)}")
        if tracks_nan(n):
            w(f"q{k}n[lo:hi] = False")
    rows = [n for n in nodes if id(n.out) in reduce_phase]
    for n in rows:
        k = g.index[id(n.out)]
        w(f"r{k} = np.full(({local},), {reduction_init(n.op.name, n.out.aval.dtype)})")
        if tracks_nan(n):
            w(f"r{k}n = np.zeros(({local},), np.bool_)")
    for a in g.inner:
        w(f"for i{a} in range(np.uint64(n{a})):")
        w.indent()
    _kept_loops(w, o, rest)
    sums = [n for n in scalar_reductions if g._elem_input(n, level)]
    elem_outputs = [n for n in nodes if level[id(n.out)] == "elem" and id(n.out) in outputs]
    needed = closure(elem_outputs + rows + sums, nodes, level)
    for n in nodes:
        if id(n.out) in needed:
            k = g.index[id(n.out)]
            g.assign(w, f"v{k}", g.expression(n, "elem"))
            if id(n.out) in outputs:
                w(f"{g.address(n.out, g.loop.shape, 'elem')} = v{k}")
    for n in rows + sums:
        if id(n.out) in reduce_phase:
            k = g.index[id(n.out)]
            acc, flag = f"r{k}[{local_position}]", f"r{k}n[{local_position}]"
        else:
            k = scalar_index[id(n.out)]
            acc, flag = f"q{k}[{position}]", f"q{k}n[{position}]"
        for line in accumulate(n, acc, g.reduced(n), flag):
            w(line)
    w.dedent(len(g.inner) + 1 + len(rest))
    _kept_loops(w, o, rest)
    for n in nodes:
        if level[id(n.out)] != "row":
            continue
        k = g.index[id(n.out)]
        if id(n.out) in reduce_phase:
            expr = settle(n, f"r{k}[{local_position}]", f"r{k}n[{local_position}]")
        else:
            expr = g.expression(n, "row")
        g.assign(w, f"v{k}", expr)
        g.after_value(w, n, "row", outputs, scalar_index)
    w.dedent(1 + len(rest))
    g.body = (body_begin, len(w.lines))
    g.in_chunk = False
    w.dedent()
    for k, n in enumerate(scalar_reductions):
        acc = f"v{g.index[id(n.out)]}"
        w(f"{acc} = {reduction_init(n.op.name, n.out.aval.dtype)}")
        w(f"qf{k} = q{k}.reshape(-1)")
        if tracks_nan(n):
            w(f"qf{k}n = q{k}n.reshape(-1)")
        w(f"for j in range(qf{k}.size):")
        w(f"    {acc} = {combine(n.op.name, acc, settle(n, f'qf{k}[j]', f'qf{k}n[j]'))}")
    return g.tail(w, args, nodes, level, outputs, scalar_reductions, column=True)


def _kept_loops(w: Writer, o: int, rest: list[int]) -> None:
    w(f"for i{o} in range(lo, hi):")
    w.indent()
    for a in rest:
        w(f"for i{a} in range(np.uint64(n{a})):")
        w.indent()
