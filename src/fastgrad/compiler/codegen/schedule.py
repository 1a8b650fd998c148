"""When each value of a loop with rows is computed: the pass (phase) over a row's inner
axes that makes each elem value, the pass after which each row value is available, the
pass each reduction accumulates in, and what each pass computes and keeps in a row-sized
scratch buffer for later passes (codegen.recompute). Both row kernel forms use it: one
row at a time (codegen.loops) and blocks of short rows (codegen.rowblocks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastgrad.compiler.codegen.recompute import choose_stored
from fastgrad.compiler.codegen.source import Writer, closure
from fastgrad.compiler.fusion import REDUCTIONS
from fastgrad.core.ir import Node

if TYPE_CHECKING:
    from fastgrad.compiler.codegen.loops import _Generator


@dataclass
class Schedule:
    phase: dict[int, int]  # elem value -> the pass computing it
    avail: dict[int, int]  # row value -> the pass before which it is known
    reduce_phase: dict[int, int]  # row reduction -> the pass it accumulates in
    scalar_reductions: list[Node]
    n_phases: int
    # Per pass: the elem outputs it stores, the reductions it accumulates, and the ids of
    # the elem values it computes (or reads back from scratch: `stored`).
    plan: list[tuple[list[Node], list[Node], set[int]]]
    stored: set[int]

    @property
    def scalar_index(self) -> dict[int, int]:
        return {id(n.out): k for k, n in enumerate(self.scalar_reductions)}


@dataclass
class KernelState:
    """One kernel being written, as each kernel form takes it (codegen.loops' row form,
    codegen.rowblocks, codegen.columns, codegen.lanecolumns): the generator, the writer,
    the kernel's argument names, the loop's nodes, their levels, the ids of the loop's
    outputs and the schedule."""

    g: _Generator
    w: Writer
    args: list[str]
    nodes: list[Node]
    level: dict[int, str]
    outputs: set[int]
    sched: Schedule


def schedule(g: _Generator, nodes: list[Node], level: dict[int, str]) -> Schedule:
    loop = g.loop
    phase: dict[int, int] = {}
    avail: dict[int, int] = {}
    for n in nodes:
        lv = level[id(n.out)]
        inside = [v for v in n.inputs if id(v) in level]
        if lv == "elem":
            phase[id(n.out)] = max(
                [phase[id(v)] if level[id(v)] == "elem" else avail[id(v)] for v in inside],
                default=0,
            )
        elif lv == "row":
            x = n.inputs[0]
            if n.op.name in REDUCTIONS and (
                level.get(id(x)) == "elem" or (id(x) not in level and x.aval.shape == loop.shape)
            ):
                avail[id(n.out)] = phase.get(id(x), 0) + 1
            elif n.op.name == "gather":  # needs what x needs, then reads it anywhere
                avail[id(n.out)] = phase.get(id(x), 0)
            else:
                avail[id(n.out)] = max((avail[id(v)] for v in inside), default=0)
    outputs = {id(v) for v in loop.outputs}
    reduce_phase: dict[int, int] = {}  # reduction node id(out) -> phase it accumulates in
    for n in nodes:
        if n.op.name in REDUCTIONS and n.params["axis"] and level[id(n.out)] == "row":
            x = n.inputs[0]
            if level.get(id(x), "elem" if x.aval.shape == loop.shape else "row") == "elem":
                reduce_phase[id(n.out)] = phase.get(id(x), 0)
    scalar_reductions = [
        n
        for n in nodes
        if level[id(n.out)] == "scalar" and n.op.name in REDUCTIONS and n.params["axis"]
    ]
    # A reduction of an input read straight from memory accumulates in phase 0.
    accumulate_phases = list(reduce_phase.values()) + [
        phase.get(id(n.inputs[0]), 0) for n in scalar_reductions if g._elem_input(n, level)
    ]
    n_phases = max([*phase.values(), *accumulate_phases], default=-1) + 1
    scalar_index = {id(n.out): k for k, n in enumerate(scalar_reductions)}

    # What each pass computes: the elem values its outputs and reductions need.
    plan = []
    for p in range(n_phases):
        sinks = [
            n
            for n in nodes
            if level[id(n.out)] == "elem" and phase[id(n.out)] == p and id(n.out) in outputs
        ]
        reducers = [
            n
            for n in nodes
            if (id(n.out) in reduce_phase and reduce_phase[id(n.out)] == p)
            or (
                id(n.out) in scalar_index
                and g._elem_input(n, level)
                and phase.get(id(n.inputs[0]), 0) == p
            )
        ]
        plan.append((sinks, reducers, closure([*sinks, *reducers], nodes, level)))
    # A value a later pass needs again is kept in a row-sized scratch buffer (it stays
    # in cache) where recomputing it costs more: exp in a softmax, the chain of a GELU
    # derivative in a layer norm's backward pass.
    stored: set[int] = set()
    if len(g.inner) == 1:
        stored = choose_stored(nodes, level, phase, [[*s, *r] for s, r, _ in plan], g.cost)
    by_id = {id(n.out): n for n in nodes}
    for p in range(n_phases):
        sinks, reducers, _ = plan[p]
        cut = {k for k in stored if phase[k] < p}
        kept = [by_id[k] for k in stored if phase[k] == p]  # computed here
        plan[p] = (sinks, reducers, closure([*sinks, *reducers, *kept], nodes, level, cut))
    return Schedule(phase, avail, reduce_phase, scalar_reductions, n_phases, plan, stored)
