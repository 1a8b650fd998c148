"""Compiled execution of scan, while_loop and switch: each body graph is simplified,
partitioned and compiled once into its own plan (its kernels cached like any other), and
one plan step runs the loop, calling the body's plan per iteration with preallocated
stacked outputs and views of the stacked inputs; nothing is traced again.

A scan whose body the plan interpreter runs as one segment runs all its iterations in
one call into it (runtime.loop_table: the LOOP opcode), once built as rows of the
enclosing plan's table (runtime.loop_row: a plan of scans and kernels, nested scans too,
is then one call); other loops run in Python, a few microseconds per iteration.
A loop whose bodies' matmuls are all small runs with BLAS on one thread (see SMALL_MATMUL).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager, nullcontext
from functools import cache, partial
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.loops import KernelSource
from fastgrad.compiler.loop_products import fuse_small_products
from fastgrad.core.config import config
from fastgrad.core.ir import Aval, Graph, Node
from fastgrad.runtime import loop_table
from fastgrad.runtime.background import loading_beats_numpy
from fastgrad.runtime.blas import OneThread, has_local_threads
from fastgrad.runtime.loop_hoisting import HoistedScan, hoist
from fastgrad.runtime.loop_table import ScanLoop
from fastgrad.runtime.recycling import unheld
from fastgrad.runtime.scan_call import ThinScan
from fastgrad.runtime.small_call import drop, take
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
# A matmul with up to this many multiply-adds runs on one BLAS thread inside a loop. Waking
# BLAS's threads costs each step of a loop, and on a busy machine a wake-up waits for a
# scheduler slice: a float32 (32, 128) @ (128, 128) took 2.1 ms on two threads against
# 0.1 ms on one, with the load average at 13 on the 2-core development machine. 2^23 is
# ~17 MFLOP, a fraction of a millisecond on one core, so a second thread saves at most
# about 0.1 ms where a wake-up under load costs milliseconds: per-example gradients of
# bench V1, whose largest product is (1024, 64) @ (64, 64), took 16.1 ms (float32) and
# 24.7 ms (float64) of CPU per call on two BLAS threads, 1.7 and 5.9 ms on one (load ~7).
SMALL_MATMUL = 1 << 23
# What a fused loop's NumPy run costs per call beyond its element-ops, in element-ops (its
# Python calls, errstate, the tier's question; 16-50 us at 1-3 ns each): a scan's body is
# small and runs many times. S1's first call at T = 1000 ran 2000 body steps on NumPy (a
# kernel of 3-4 ops over 4096 elements and a matmul each) in ~0.2 s of CPU, ~100 us a
# step, where the kernels' element-ops alone would take 15-50 us.
STEP_WORK = 1 << 14
# Runs a plan waits for a scan's LOOP to be built before it lowers its steps without it
# (the LOOP needs the body's segments and one watched run; the runs while the body's
# kernels or the interpreter compile for it, bounded by the compile watchdog, are not
# counted: in background mode a cold nested scan used them all up before).
HOLDS = 20


class LoopStep:
    """One control-flow call in a plan: reads `ins`, fills `outs` (output index -> slot)."""

    def __init__(
        self,
        call: GroupCall,
        ins: list[int],
        outs: list[tuple[int, int]],
        build: Callable[[Graph, bool], Body],
    ):
        self.call = call
        self.ins = ins
        self.outs = outs
        self.bodies: list[Body]
        # Bodies are called with `.run`: the plan that runs this step has set errstate.
        # A loop's bodies write their outputs into preallocated buffers (`iterations`),
        # which one loop at a time uses (`iterating`, shared with the loops nested in its
        # bodies: re-entrant, a LOOP's rows run theirs) and one run of this loop at a time
        # (`busy`: never re-entered, as by a callback in its body calling the same function
        # on the same thread); a loop that finds either in use runs with fresh outputs per
        # iteration. (Copies of the step share both, and its bodies.)
        self.nest = Nest()
        self.busy = threading.Lock()
        self.carried = 0  # how many of the outputs are the final carry, copied out
        # A scan's stacked outputs that nothing but this plan's steps reads (`publish`).
        self.private: frozenset[int] = frozenset()
        self.stacks = StackPool()
        self._loop: Callable[..., list[Any]]
        self.looped: ScanLoop | None = None  # the scan's LOOP in the interpreter
        self.thin: ThinScan | None = None  # its call once the LOOP is built (scan_call)
        self.hoisted: HoistedScan | None = None  # a scan's work outside its loop
        self.first = True  # no run yet: a long scan may wait for its bodies' kernels
        # A scan whose LOOP may be built holds its plan's lowering for a few runs, so that
        # the LOOP becomes rows of that plan's table (runtime.loop_row); arrays the rows
        # write that the step keeps, per arena (by id of its env).
        self.holds = HOLDS
        # In a loop body's arena (whose outputs the loop copies): rows write no fresh arrays
        self.in_body = False
        self.owned: dict[int, dict[Any, np.ndarray]] = {}
        if isinstance(call, ScanCall):
            self.carried = call.n_carry
            hoisted = hoist(call)  # sums after the loop, products before it
            inner = call if hoisted is None else hoisted.inner
            self.bodies = [build(fuse_small_products(inner.body), True)]
            self._loop = partial(scan_loop, call) if hoisted is None else hoisted.run
            self.looped = ScanLoop(inner, self.bodies[0])
            self.hoisted = hoisted
        elif isinstance(call, WhileCall):
            self.bodies = [build(call.cond, True), build(fuse_small_products(call.body), True)]
            self.carried = len(call.body.outputs)
            self._loop = partial(while_loop_run, call)
        elif isinstance(call, SwitchCall):
            self.bodies = [build(b, False) for b in call.branches]
            self._branch = partial(branch_index, call)
        else:
            raise TypeError(f"no compiled execution for {call!r}")
        if not isinstance(call, SwitchCall):  # (the bodies' own arenas: not their copies)
            for step in _nested_loops(self.bodies):
                step.in_body = True
        for step in _all_nested(self.bodies):
            step.nest.lock = self.nest.lock
        # A loop (not a switch, whose branch runs once) limits BLAS for all it runs, loops
        # nested in it included, so these need not limit it again at each step.
        self.largest_matmul = _largest_matmul(self.bodies)
        self.small_matmuls = (
            not isinstance(call, SwitchCall) and 0 < self.largest_matmul <= SMALL_MATMUL
        )
        # Its bodies run with BLAS on one thread set around the loop (by this step, or by
        # the loop it is nested in, which then has small products too).
        self.one_thread = self.small_matmuls
        # A body whose plan runs BLAS on one thread (its products cut: shares_cores) runs
        # so in the step runner too, as its tables do in the interpreter: the Python loop
        # calls the bodies' plans without their own region (Executable.run), and its
        # products then ran on BLAS's threads (other bits in float32).
        self.in_region = self.small_matmuls or any(
            getattr(b, "one_blas_thread", False) for b in self.bodies
        )
        if self.small_matmuls:
            for step in _nested_loops(self.bodies):
                step.small_matmuls = False

    def prepare(self, env: list[Any], static: Any) -> Callable[[], None] | None:
        """The step's call in an arena, or None while its LOOP may yet be built: the
        arena then waits to lower its steps (runtime.plan_table), which makes a built
        LOOP rows of its table (runtime.loop_row)."""
        looped = self.looped
        if (
            self.holds > 0
            and looped is not None
            and looped.program is None
            and not looped.failed
            and self.call.length > 0
            and loop_table.ENABLED
            and config.runtime == "vm"
            and (self.hoisted is None or self.hoisted.as_rows)
        ):
            if not looped.waiting():  # (kernels or the interpreter compiling: not counted)
                self.holds -= 1
            return None
        return partial(self.run, env)

    def run(self, env: list[Any]) -> None:
        if self.first:
            self.first = False
            if isinstance(self.call, ScanCall):
                wait_if_loading_pays(self.call.length, self.bodies)
        with one_blas_thread() if self.in_region else nullcontext():
            outs = self._run([env[i] for i in self.ins])
        for k, slot in self.outs:
            env[slot] = outs[k]

    def _run(self, arrays: list[Any]) -> list[Any]:
        if isinstance(self.call, SwitchCall):  # runs once: fresh outputs, nothing to copy
            return self.bodies[self._branch(arrays[0])].run(arrays[1:])
        if self.looped is not None:
            arrays = _contiguous_consts(arrays, self.call.n_consts)
        if not take(self.locks):
            return self._loop(arrays, *(b.run for b in self.bodies))
        try:
            thin = self.thin_call()
            if thin is not None:
                outs = thin(arrays)  # its final carries are fresh
                if outs is not None:
                    return outs
            stacks: dict[str, Any] = {}
            bodies = [b.iterations() for b in self.bodies]
            fresh: list[Any] = []  # the final carries the LOOP allocated
            if self.looped is not None:  # a scan
                stacks = {"empty": self.stacks.empty, "private": self.private}
                stacks["loop"] = partial(_noting, self.looped.run, fresh)
                stacks["handed"] = self.looped.handed()
                bodies = [self.looped.watch(bodies[0])]
            outs = self._loop(arrays, *bodies, **stacks)
            # the carry may be in a body's buffers, which the next call overwrites
            carry = outs[: self.carried]
            carry = [x if any(x is f for f in fresh) else np.array(x, copy=True) for x in carry]
            return carry + outs[self.carried :]
        finally:
            drop(self.locks)

    def thin_call(self) -> ThinScan | None:
        """The scan's call once its LOOP is built (runtime.scan_call), else None."""
        if self.thin is None and self.looped is not None and self.looped.program is not None:
            self.thin = ThinScan(
                self.call, self.hoisted, self.looped, self.stacks.empty, self.private
            )
            if self.one_thread:  # the bodies need not set it at each iteration
                self.looped.program.threads_set_around()
        return self.thin

    @property
    def iterating(self) -> Any:
        """Held while the loop uses its bodies' preallocated arenas or its LOOP's tables:
        by one thread at a time (re-entrant: the loops nested in its bodies share it,
        since a LOOP's rows may run theirs, runtime.loop_row)."""
        return self.nest.lock

    @property
    def locks(self) -> tuple[Any, ...]:
        """What a run of this loop on its own arenas and tables holds: `busy`, `iterating`."""
        return (self.busy, self.nest.lock)

    @property
    def row_locks(self) -> tuple[Any, ...]:
        """What a run of this loop's LOOP as rows of another table holds (runtime.loop_row):
        `locks` and the `busy` of every loop nested in it, whose tables those rows run."""
        return (*self.locks, *(step.busy for step in _all_nested(self.bodies)))

    @property
    def returnable(self) -> list[int]:
        """The input slots whose arrays the loop may return (a scan of no steps returns its
        initial carry): all but a scan's stacked inputs."""
        if isinstance(self.call, ScanCall):
            return self.ins[: self.call.n_consts + self.call.n_carry]
        return self.ins

    def publish(self, fresh: Collection[int]) -> None:
        """Note which stacked outputs the plan's caller may see: those whose slots are in
        `fresh` (executable.fresh_slots); the others may share memory (scan_loop)."""
        seen = {k - self.carried for k, slot in self.outs if slot in fresh}
        n_out = len(self.call.body.outputs) if isinstance(self.call, ScanCall) else 0
        self.private = frozenset(range(n_out - self.carried)) - seen

    @property
    def kernels(self) -> list[KernelSource]:
        return [k for body in self.bodies for k in body.kernels]


def _contiguous_consts(arrays: list[Any], n_consts: int) -> list[Any]:
    """`arrays` with a scan's consts that are views of another layout (`w.T` closed over)
    copied C-contiguous at each call, before the loop (the others, 0-d ones too, as they
    are): read as they are, each iteration's kernel or small product needed a copy of its
    own (a host step: the body never ran as a LOOP; unbatched RNN reading `w.T`, H = 16,
    T = 200, value_and_grad 28x slower)."""
    if all(type(x) is not np.ndarray or x.flags.c_contiguous for x in arrays[:n_consts]):
        return arrays
    consts = [
        np.ascontiguousarray(x) if type(x) is np.ndarray and not x.flags.c_contiguous else x
        for x in arrays[:n_consts]
    ]
    return [*consts, *arrays[n_consts:]]


class Nest:
    """The lock of a loop and of the loops nested in its bodies (and of their copies,
    which share this object): whoever runs one of their LOOPs' tables or preallocated
    arenas holds it (with that loop's own `busy`)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()


def _all_nested(bodies: list[Body]) -> list[LoopStep]:
    """The loops in `bodies` and in theirs, all the way down."""
    found = _nested_loops(bodies)
    return found + [s for step in found for s in _all_nested(step.bodies)]


class StackPool:
    """A scan's stacked outputs kept from call to call: an array is handed out again once
    nothing else holds it (nor a view of it), so a long loop does not write its outputs
    into fresh pages at each call (at T = 1000, a fresh (T, 32, 128) float32 output cost
    ~2.4 us a step in page faults, a third of the loop's own per-step work). Nothing else
    holding it is runtime.recycling's rule (a weak reference counts: a caller's
    weak-valued cache of results saw the array change at the next call)."""

    def __init__(self) -> None:
        self.kept: dict[int, np.ndarray] = {}

    def empty(self, k: int, aval: Aval) -> np.ndarray:
        kept = self.kept.get(k)
        if kept is not None and kept.shape == aval.shape and kept.dtype == aval.dtype:
            del kept  # (our own reference: `unheld` counts the dict's alone)
            if unheld(self.kept, k):
                return self.kept[k]
        self.kept[k] = fresh = np.empty(aval.shape, aval.dtype)
        return fresh


class LoopPlanner:
    """Turns the nodes of control-flow calls in `graph` into one `LoopStep` per call: the
    first node of a call gets the step, which fills the slots of all its nodes."""

    def __init__(self, graph: Graph, build: Callable[[Graph, bool], Body]):
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


def _noting(run: Callable[..., list[Any] | None], fresh: list[Any], *args: Any) -> Any:
    """`run(*args)`, its results (if any) added to `fresh`."""
    final = run(*args)
    fresh.extend(final or ())
    return final


def wait_if_loading_pays(length: int, bodies: list[Body]) -> None:
    """Have the kernels of a loop's `bodies` (and of the loops nested in them) wait on
    their first run for their machine code on disk, when `length` iterations on NumPy would
    cost more than loading it (background.loading_beats_numpy). Each kernel step asks
    only about its own call, which in a loop body is small, but runs `length` times."""
    work, tiers = _numpy_work(bodies)
    tiers = [tier for tier in tiers if tier.jobs is None and not tier.wait]
    sources = [tier.variants[-1].source for tier in tiers]
    if tiers and loading_beats_numpy(length * work, sources):
        for tier in tiers:
            tier.wait = True


def _numpy_work(bodies: list[Body]) -> tuple[int, list[Any]]:
    """Element-ops of one run of `bodies` with their kernels on NumPy (a nested scan's
    times its length; a while loop's body counted once), and the kernels' tiers."""
    work, tiers = 0, []
    for body in bodies:
        for step in body.plan:
            tier = getattr(step, "tier", None)
            if tier is not None:  # a kernel not settled yet
                work += STEP_WORK + tier.numpy_loop.size * int(np.prod(tier.shape))
                tiers.append(tier)
            elif isinstance(step, LoopStep):
                inner, found = _numpy_work(step.bodies)
                length = step.call.length if isinstance(step.call, ScanCall) else 1
                work += length * inner
                tiers += found
    return work, tiers


def _nested_loops(bodies: list[Body]) -> list[LoopStep]:
    return [step for body in bodies for step in body.plan if isinstance(step, LoopStep)]


def _largest_matmul(bodies: list[Body]) -> int:
    """Multiply-adds of the largest matmul in the bodies and the loops nested in them (0:
    none): each body's plan counts its own and its loops' (Executable.largest_matmul)."""
    return max((body.largest_matmul for body in bodies), default=0)


def one_blas_thread() -> AbstractContextManager[Any]:
    """A context in which this thread's BLAS runs on one thread (restored on exit): two
    calls into the library where it can set this thread's count, else threadpoolctl's
    limit of every library's (~100 us a loop, which a short loop's call notices)."""
    return (
        OneThread() if has_local_threads() else _blas_controller().limit(limits=1, user_api="blas")
    )


@cache
def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController  # finds BLAS once: ~30 ms

    return ThreadpoolController()


def _key(node: Node) -> Any:
    return id(node.params["call"]), tuple(id(v) for v in node.inputs)
