"""Compiled execution of scan, while_loop and switch: each body graph is simplified,
partitioned and compiled once into its own plan (its kernels cached like any other), and
one plan step runs the loop, calling the body's plan per iteration with preallocated
stacked outputs and views of the stacked inputs; nothing is traced again.

The loop itself runs in Python (a few microseconds per iteration); a plan runtime with a
LOOP opcode can take it over from `LoopStep`, which knows the body plans and the slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastgrad.compiler.codegen.loops import KernelSource
from fastgrad.core.ir import Graph, Node
from fastgrad.transforms.calls import GroupCall
from fastgrad.transforms.control_flow import (
    SWITCH,
    WHILE,
    SwitchCall,
    WhileCall,
    branch_index,
    while_loop_run,
)
from fastgrad.transforms.scan import SCAN, ScanCall, scan_loop

# What a compiled body is: called with its input arrays, it returns its output arrays,
# and lists the kernels it runs.
Body = Any
OPS = frozenset({SCAN.name, WHILE.name, SWITCH.name})


class LoopStep:
    """One control-flow call in a plan: reads `ins`, fills `outs` (output index -> slot)."""

    def __init__(
        self,
        call: GroupCall,
        ins: list[int],
        outs: list[tuple[int, int]],
        build: Callable[[Graph], Body],
    ):
        self.call = call
        self.ins = ins
        self.outs = outs
        self.bodies: list[Body]
        if isinstance(call, ScanCall):
            self.bodies = [build(call.body)]
            body = self.bodies[0]
            self._run = lambda arrays: scan_loop(call, arrays, body)
        elif isinstance(call, WhileCall):
            self.bodies = [build(call.cond), build(call.body)]
            cond, body = self.bodies
            self._run = lambda arrays: while_loop_run(call, arrays, cond, body)
        elif isinstance(call, SwitchCall):
            self.bodies = [build(b) for b in call.branches]
            branches = self.bodies
            self._run = lambda arrays: branches[branch_index(call, arrays[0])](arrays[1:])
        else:
            raise TypeError(f"no compiled execution for {call!r}")

    def run(self, env: list[Any]) -> None:
        outs = self._run([env[i] for i in self.ins])
        for k, slot in self.outs:
            env[slot] = outs[k]

    @property
    def kernels(self) -> list[KernelSource]:
        return [k for body in self.bodies for k in body.kernels]


class LoopPlanner:
    """Turns the nodes of control-flow calls in `graph` into one `LoopStep` per call: the
    first node of a call gets the step, which fills the slots of all its nodes."""

    def __init__(self, graph: Graph, build: Callable[[Graph], Body]):
        self.build = build
        self.groups: dict[Any, list[Node]] = {}
        for node in graph.nodes:
            if node.op.name in OPS:
                self.groups.setdefault(_key(node), []).append(node)
        self.done: set[Any] = set()

    def step(self, node: Node, slot_of: Callable[[Any], int]) -> LoopStep | None:
        key = _key(node)
        if key in self.done:
            return None
        self.done.add(key)
        outs = [(n.params["index"], slot_of(n.out)) for n in self.groups[key]]
        return LoopStep(node.params["call"], [slot_of(v) for v in node.inputs], outs, self.build)


def _key(node: Node) -> Any:
    return id(node.params["call"]), tuple(id(v) for v in node.inputs)
