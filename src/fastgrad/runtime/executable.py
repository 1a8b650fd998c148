"""Run a partitioned graph: fused kernels and library calls over a flat list of buffers.

Every value has a slot; graph inputs and constants are filled in first, then each step
reads its slots and fills its own. Kernels and matmuls write into buffers preallocated in
an arena (runtime.arena), or into fresh arrays for what the caller receives. A loop's
kernel is generated, and compiled, on its first run: the serial variant for small sizes,
the parallel one (prange) above a threshold. A kernel step asks its tier
(runtime.background) at each run whether its kernel is ready; until then the tier runs the
loop with NumPy (in sync mode it waits for the kernel, or for the compile watchdog)."""

from __future__ import annotations

import copy
import itertools
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.loops import KernelSource
from fastgrad.compiler.codegen.math_names import VECTOR_MATH
from fastgrad.compiler.codegen.memo import generated
from fastgrad.compiler.codegen.rowblocks import SHORT_ROW
from fastgrad.compiler.fusion import Call, Loop, Step, partition
from fastgrad.compiler.passes import simplify
from fastgrad.core.config import config
from fastgrad.core.ir import Graph
from fastgrad.runtime import threading_layer  # noqa: F401  (before any parallel kernel)
from fastgrad.runtime.arena import Arena, Buffer
from fastgrad.runtime.background import KernelTier
from fastgrad.runtime.blas import OneThread
from fastgrad.runtime.build_tables import Stale, Tables, slot_table, values
from fastgrad.runtime.control_flow import OPS as LOOP_OPS
from fastgrad.runtime.control_flow import SMALL_MATMUL, LoopPlanner, LoopStep
from fastgrad.runtime.matmul import MatmulStep as _MatmulStep
from fastgrad.runtime.matmul import fold_accumulations
from fastgrad.runtime.numpy_tier import NumpyLoop
from fastgrad.runtime.ownership import borrowed
from fastgrad.runtime.plan_rows import VIEW_ARG
from fastgrad.runtime.plan_steps import PlanStep, _CallStep, _KernelStep, _ViewStep
from fastgrad.runtime.small_call import SmallCall, function
from fastgrad.runtime.small_call import build as build_small_call
from fastgrad.runtime.stored_plan import (
    StoredExecutable,
    build,
    describe,
    layout_tables,
    stored_arena,
)
from fastgrad.runtime.thread_budget import numba_threads, products, shares_cores

# Below this many iterations a parallel loop costs more than it saves: thread wake-up, and
# contention with BLAS threads still spinning after a matmul (measured on the MLP
# benchmark: a 256x512 elementwise loop took 4.3 ms parallel, 0.8 ms serial).
PARALLEL_THRESHOLD = 1 << 18
# Full reductions keep one partial per chunk: a count fixed by the loop's size makes
# results independent of the thread count and of the serial/parallel choice.
MAX_CHUNKS = 64
# Elements per chunk at least: each chunk costs ~45 ns (its partial, its bounds), which at
# N=16 took a chunk per element and half of the kernel's time (0.67 of 1.33 us). Loops
# large enough to run in parallel (PARALLEL_THRESHOLD) still get MAX_CHUNKS.
MIN_CHUNK = 1024
DEBUG = bool(os.environ.get("FASTGRAD_DEBUG"))


class Executable:
    """A graph ready to run: call it with the graph's input arrays.

    Intermediate values live in one arena of preallocated buffers, reused from call to
    call (the first touch of fresh memory is what costs); what the caller receives is
    always allocated afresh. A call that finds the arena in use (another thread, or a
    re-entrant call) runs with buffers of its own.
    """

    def __init__(
        self,
        graph: Graph,
        steps: Sequence[Step],
        looped: bool = False,
        generated: dict[tuple[int, bool], KernelSource] | None = None,
        tables: Tables | None = None,
        record: bool = False,
    ):
        """`tables`: this plan's build stored by another process (runtime.build_tables),
        used instead of working it out (raises build_tables.Stale if they do not fit);
        `record`: keep this build's tables in `self.tables`, for the plan cache to store."""
        self.graph = graph
        self.arity = len(graph.inputs)  # (a stored build's graph is read only if asked)
        self.steps = list(steps)
        # Kernel sources by (index of the loop in `steps`, parallel): given (a plan loaded
        # from disk, compiler.plan_cache) or filled here, for the plan cache to store.
        self.generated = {} if generated is None else generated
        # Each value's slot, by the value (a Var hashes by identity): numbered here, or
        # as stored tables say (a value they do not number raises: they do not fit).
        slot: dict[Any, int] = {} if tables is None else slot_table(tables, graph, self.steps)
        stored_slots = len(slot)
        # (~12,600 calls building the T=200 RNN's plan; from tables, no Python frame each)
        slot_of = _numbering(slot) if tables is None else slot.__getitem__
        for v in graph.inputs:
            slot_of(v)
        consts = [(n.out, n.params["value"]) for n in graph.nodes if n.op.name == "const"]
        self.constants = {id(v): value for v, value in consts}
        self.plan: list[PlanStep] = []
        loops = LoopPlanner(graph, compile_graph)
        numpy = tables.numpy if tables is not None else {}
        folded = tables.folded if tables is not None else frozenset()
        matmuls = tables.matmuls if tables is not None else None
        at: dict[int, int] = {}  # id of a plan step -> the index of its step in `steps`
        for index, step in enumerate(self.steps):
            if isinstance(step, Call) and step.node.op.name in LOOP_OPS:
                loop = loops.step(step.node, slot_of)  # one step for all of a loop's nodes
                if loop is not None:
                    self.plan.append(loop)
            elif isinstance(step, Call):
                planned = self._call_step(step.node, slot_of)
                if matmuls is not None and isinstance(planned, _MatmulStep):
                    _stored_matmul(planned, matmuls.get(index))
                self.plan.append(planned)
            elif index not in folded:  # (folded: an add BLAS does, `stored` below)
                self.plan.append(self._kernel_step(step, slot_of, index, numpy.get(index)))
            else:
                continue
            at[id(self.plan[-1])] = index
        self.outputs = [slot_of(v) for v in graph.outputs]
        # Stored tables: what they say, if they fit (every slot known, the same outputs).
        if tables is not None and (
            len(slot) != stored_slots or tuple(self.outputs) != tables.outputs
        ):
            raise Stale("the tables do not fit this plan")
        views = [(s.ins[0], s.out) for s in self.plan if isinstance(s, _ViewStep)]
        per_call = borrowed(views, len(graph.inputs))  # arguments, and views of them
        if tables is None:
            fresh = fresh_slots(self.plan, self.outputs)
            seen = fresh_slots(self.plan, self.outputs, stacked_inputs=False)
            for planned in self.plan:
                if isinstance(planned, LoopStep):
                    planned.publish(seen)
            kept = fold_accumulations(self.plan, fresh)
        else:
            kept = self.plan  # (the matmuls as the tables say, `_stored_matmul`)
        self.template: list[Any] = [None] * len(slot)
        for v, value in consts:
            if v in slot:
                self.template[slot[v]] = value
        # (stored: what thread_budget reads of the graph's matmuls, a pass over its nodes)
        one = self._settings(kept, products(graph) if tables is None else tables.products)
        if looped:
            # The plan's own steps run the loop; copies of them (bound to buffers of
            # their own) serve `run`, for a loop that finds the two arenas in use.
            copies = [copy.copy(s) for s in kept]
            first = _arena(kept, self.template, self.outputs, per_call, True, one)
            self._alternating = [first, first.fresh()]
            self.arena = _arena(copies, self.template, self.outputs, per_call, False, one)
        elif tables is not None:
            self.arena = _arena(kept, self.template, self.outputs, per_call, False, one, tables)
        else:
            self.arena = _arena(kept, self.template, self.outputs, per_call, False, one)
            if record and not loops.done:
                self.tables = self._record(slot, self.plan, kept, at)
        self.plan = kept

    def _settings(self, kept: list[PlanStep], matmuls: Any) -> bool:
        """What a build sets besides its steps and arena, given the steps kept and the
        products (thread_budget.products); whether BLAS runs on one thread."""
        self.views_of = partial(fresh_slots, kept)  # (runtime.loop_table's carries)
        self.waits = False  # set by settle()
        self._lock = threading.Lock()
        self._small: Any = None  # runtime.small_call's Plan, or False
        self.products = matmuls
        # Multiply-adds of its largest single product (a batched one counts one matrix),
        # its loops' too: a loop's LOOP may run from this plan's table (runtime.loop_row),
        # and a loop reads its bodies' (control_flow), so that a product is small or not
        # the same in a loop body and out of one.
        in_loops = [s.largest_matmul for s in kept if isinstance(s, LoopStep)]
        self.largest_matmul = max([size for _, size, *_ in self.products] + in_loops, default=0)
        self.small_matmuls = 0 < self.largest_matmul <= SMALL_MATMUL
        self.one_blas_thread = self.small_matmuls or shares_cores(kept, self.products)
        self._alternating: list[Arena] = []  # a loop body's two arenas (iterations)
        # What a process reading this plan from disk may take as it is (runtime.build_tables):
        # a plan run by itself (a loop body's plan, or a plan running loops, is built anew).
        self.tables: Tables | None = None
        return self.one_blas_thread

    def finish_stored(
        self, plan: list[PlanStep], template: list[Any], inputs: int, tables: Tables
    ) -> None:
        """Build from stored steps (runtime.stored_plan's `build`, which made `plan` and
        the constants' `template`), for a graph of `inputs` arguments."""
        self.plan, self.template, self.arity = plan, template, inputs
        self.outputs = list(tables.outputs)
        self.constants: dict[int, Any] = {}
        views = [(s.ins[0], s.out) for s in plan if isinstance(s, _ViewStep)]
        per_call = borrowed(views, inputs)  # arguments, and views of them
        one = self._settings(plan, tables.products)
        self.arena = _arena(plan, template, self.outputs, per_call, False, one, tables)

    def _record(
        self, slot: dict[Any, int], built: list[PlanStep], kept: list[PlanStep], at: dict[int, int]
    ) -> Tables:
        """This build as tables, for another process to read (runtime.build_tables): its
        steps themselves where they have a stored form (runtime.stored_plan), else what
        a build from the plan read from disk would work out again."""
        arena = layout_tables(kept, self.arena)
        steps = describe(self, kept, self.steps, at)
        if steps is not None:  # (all the rest follows from the steps)
            return Tables((), tuple(self.outputs), frozenset(), {}, {}, arena, self.products, steps)
        order = values(self.graph, self.steps)
        kept_ids = set(map(id, kept))
        return Tables(
            slots=tuple(slot.get(v, -1) for v in order),
            outputs=tuple(self.outputs),
            folded=frozenset(at[id(s)] for s in built if id(s) not in kept_ids),
            matmuls={at[id(s)]: (s.out, s.accumulate) for s in kept if isinstance(s, _MatmulStep)},
            numpy={
                at[id(s)]: s.tier.numpy_loop.tables()
                for s in kept
                if isinstance(s, _KernelStep) and s.tier is not None
            },
            arena=arena,
            products=self.products,
        )

    def _call_step(self, n: Any, slot_of: Any) -> _CallStep | _MatmulStep | _ViewStep:
        ins = list(map(slot_of, n.inputs))
        if n.op.name == "matmul":
            return _MatmulStep(ins, slot_of(n.out), n.out.aval.shape, n.out.aval.dtype)
        if n.op.name in VIEW_ARG:
            return _ViewStep(n.op.name, VIEW_ARG[n.op.name](n.params), ins, slot_of(n.out))
        return _CallStep(n.op.impl, n.params, ins, slot_of(n.out), n.out.aval.dtype)

    def _generate(self, index: int, loop: Loop, parallel: bool) -> KernelSource:
        source = self.generated.get((index, parallel))
        if source is None:
            # (once per structure: an unrolled loop's steps share theirs, codegen.memo)
            source = generated(loop, parallel, VECTOR_MATH, self.constants)
            self.generated[index, parallel] = source
        return source

    def _kernel_step(self, loop: Loop, slot_of: Any, index: int, stored: Any = None) -> _KernelStep:
        size = math.prod(loop.shape)  # np.prod: ~4 us, per loop of a plan
        parallel = size >= PARALLEL_THRESHOLD and numba_threads() > 1 and not short_rows(loop)
        source = self._generate(index, loop, parallel)
        # Sync mode too: its first call waits for the final kernel on the compile thread,
        # under the watchdog (an overdue compile leaves the loop on NumPy, never a hang).
        # In background mode the serial variant comes first: it compiles ~1.2 s faster.
        serial = [self._generate(index, loop, False)] if parallel else []
        ins, outs = list(map(slot_of, source.inputs)), list(map(slot_of, source.outputs))
        numpy = NumpyLoop(loop, slot_of, stored, ins + outs)
        tier = KernelTier(numpy, [*serial, source], loop.shape)
        if DEBUG:
            print(f"# fastgrad: kernel for loop over {loop.shape}\n{source.source}")
        sizes = (size,) if source.flat else tuple(loop.shape)
        outer = [a for a in range(len(sizes)) if source.flat or a not in loop.reduce_axes]
        first = sizes[outer[0]] if outer else 1
        return _KernelStep(
            loop=loop,
            source=source,
            ins=ins,
            outs=outs,
            sizes=sizes,
            nchunks=_chunks(source, first, parallel, size),
            parallel=parallel,
            # NumPy scalars, so Numba types each by its dtype (float32 stays float32).
            scalars=tuple(self.constants[id(v)].reshape(())[()] for v in source.scalars),
            checks=tuple(slot_of(v) for v in source.index_checks),
            tier=tier,
        )

    def __call__(self, args: Sequence[Any]) -> list[np.ndarray]:
        # As the kernels do, library calls give inf and nan rather than warn or raise: one
        # errstate for the whole plan, loop bodies included, rather than one per call.
        # A plan whose matmuls are all small runs them on one BLAS thread, as loops do
        # (control_flow.SMALL_MATMUL): waking BLAS's threads costs more than they save.
        # So does a plan whose parallel kernels would share the cores with BLAS's threads
        # (thread_budget.shares_cores). A plan the interpreter runs alone sets both itself
        # (runtime.plan_table).
        if self.arena.bare and self._lock.acquire(blocking=False):
            try:
                return self.arena.run(args)
            finally:
                self._lock.release()
        with np.errstate(all="ignore"), OneThread() if self.one_blas_thread else nullcontext():
            return self.run(args)

    @property
    def lowered(self) -> bool:
        """Whether the arena's calls are final (kernels settled, and lowered for "vm")."""
        return self.arena.settled and not self.arena.lowering

    def small_call(self, key: Sequence[Any], args: Sequence[Any], tree: Any) -> SmallCall | None:
        """The plan as one function (runtime.small_call) for arguments of layouts `key`
        (api.jit's fast key, of `args`), returning the structure `tree`; or None."""
        if self._small is None and self.arena.bare and len(args) == self.arity:
            self._small = build_small_call(self.arena.calls, self.outputs, args, self._lock)
        return function(self._small, key, tree)

    def run(self, args: Sequence[Any]) -> list[np.ndarray]:
        """A call without setting NumPy's errstate: for loop bodies, whose loop did. A call
        that meets another one running (another thread) gets an arena of its own."""
        if self._lock.acquire(blocking=False):
            try:
                return self.arena.run(args)
            finally:
                self._lock.release()
        return self.arena.fresh(once=True).run(args)

    def iterations(self) -> Callable[[Sequence[Any]], list[Any]]:
        """For a loop body: a run whose outputs are preallocated too, in one of two arenas
        used in turn, so that an iteration allocates nothing and reads the previous
        one's outputs (its carry) while it writes its own. What a call returns is
        overwritten two calls later: the loop copies what it keeps (its stacked
        outputs at once, its final carry at the end). One loop at a time: the caller
        holds `iterating`. Only for a plan built with `looped`."""
        if not self._alternating:
            raise ValueError("iterations() needs a plan built for a loop body (looped=True)")
        return partial(_run_next, itertools.cycle(self._alternating))

    def settle(self) -> None:
        """Make the next call wait for every kernel rather than run NumPy meanwhile (and
        for the plan interpreter's adapters, with config.runtime "vm")."""
        self.waits = True
        for arena in (self.arena, *self._alternating):
            arena.waits = True
        for step in self.plan:
            if isinstance(step, _KernelStep) and step.tier is not None:
                step.tier.wait = True
            elif isinstance(step, LoopStep):
                for body in step.bodies:  # a loop body's plan is an Executable too
                    body.settle()

    @property
    def compiled(self) -> bool:
        """Whether every loop runs its final kernel (no NumPy tier left), loop bodies'
        kernels included."""
        return all(
            s.tier is None
            if isinstance(s, _KernelStep)
            else all(body.compiled for body in s.bodies)
            if isinstance(s, LoopStep)
            else True
            for s in self.plan
        )

    @property
    def kernels(self) -> list[KernelSource]:
        """The plan's kernels, then those of the loop bodies it runs."""
        own = [s.source for s in self.plan if isinstance(s, _KernelStep)]
        return own + [k for s in self.plan if isinstance(s, LoopStep) for k in s.kernels]


class StoredBuild(StoredExecutable, Executable):
    """An executable built from its stored steps alone (runtime.stored_plan): its graph,
    partition and kernel sources are read from the stored plan when asked for."""

    @classmethod
    def stored(cls, tables: Tables, traced: Graph, consts: Any, read_plan: Any) -> StoredBuild:
        """See runtime.stored_plan's `build` (raises build_tables.Stale)."""
        return build(cls, tables, traced, consts, read_plan)


def _numbering(slot: dict[Any, int]) -> Callable[[Any], int]:
    """The slot of a value: the one in `slot`, or the next, recorded there."""

    def slot_of(v: Any) -> int:
        k = slot.get(v)
        if k is None:
            k = slot[v] = len(slot)
        return k

    return slot_of


def _run_next(arenas: Iterator[Arena], args: Sequence[Any]) -> list[Any]:
    return next(arenas).run(args)


def compile_graph(graph: Graph, looped: bool = False) -> Executable:
    """A loop body's or a branch's plan: simplified, partitioned and compiled like a
    whole function; with `looped`, also laid out to run as a loop's iterations."""
    graph = simplify(graph)
    return Executable(graph, partition(graph), looped)


def short_rows(loop: Loop) -> bool:
    """Whether `loop` reduces, and has an axis after its first longer than 1 and shorter
    than codegen's SHORT_ROW (bench M4's (N, 8, 2) and (N, 8) loops): such loops get no
    parallel variant. Their serial kernels have those lengths written in as constants
    (codegen.rowblocks, codegen.lanecolumns), which a prange variant passes on to its
    threads as variables; measured on the 2-core machine (float64, N = 1e6, load 3-6,
    best of 15 alternating): M4's four such kernels ran 0.40-0.47x, 0.93-0.95x, 1.00x
    (one run 1.77x) and 1.01-1.03x as fast as their serial kernel at 2 threads, and
    their parallel variants took 11.2 s of compile CPU against 7-8 s for the serial
    ones (3.76 against 2.34 s for the (N, 8) logsumexp's, 0.98 against 0.17 s for the
    first (N, 8, 2) loop's), half of M4's time to steady state from an empty cache."""
    return bool(loop.reduce_axes) and any(1 < n < SHORT_ROW for n in loop.shape[1:])


def _chunks(source: KernelSource, first: int, parallel: bool, size: int) -> int:
    """Chunks of the first outer axis. A column kernel's results do not depend on their
    count: one per thread, each walking whole rows. Elsewhere a count set by the loop's
    `size` alone (MIN_CHUNK elements each at least, MAX_CHUNKS at most), since full
    reductions keep one partial per chunk."""
    if source.column:
        threads = numba_threads() if parallel else 1
        return max(1, min(first, threads))
    return max(1, min(first, MAX_CHUNKS, size // MIN_CHUNK))


def _arena(
    plan: list[PlanStep],
    template: list[Any],
    outputs: list[int],
    from_args: set[int],
    bound: bool = False,
    one_blas_thread: bool = False,
    tables: Tables | None = None,
) -> Arena:
    """Give every intermediate that kernels and matmuls write a preallocated buffer, bind
    the steps to them, and set apart the views of buffers (made once per arena).
    `from_args`: the slots of the arguments and of views of them (runtime.ownership).

    What the caller receives must be fresh at every call: the outputs, and what they may
    be views of (the inputs of a view, of a library call or of a loop that may return
    one). A reshape copies where its input is not contiguous, so only a reshape of a
    buffer itself (or of a constant) is made once; other views of views run per call.
    With `tables`: the layout they hold (stored_plan.layout_tables), bound to `plan`'s steps."""
    # The interpreter runs BLAS on one thread where the step runner would.
    lower = (
        partial(_lower, one_thread=one_blas_thread, private=frozenset(from_args))
        if config.runtime == "vm"
        else None
    )
    if tables is not None:
        return stored_arena(plan, template, outputs, lower, tables.arena)
    fresh = set() if bound else fresh_slots(plan, outputs)  # bound: the loop copies
    template = list(template)
    buffers: list[Buffer] = []
    # Slots whose value never changes identity during a call, and among them the ones
    # holding a whole buffer or a constant (a reshape of those is a view or a constant).
    plain = {k for k, v in enumerate(template) if v is not None} - from_args
    static = set(plain)
    static_views: list[_ViewStep] = []
    steps: list[PlanStep] = []
    for step in plan:
        if isinstance(step, _KernelStep):
            slots: list[int | None] = []
            for out, (shape, dtype), view in zip(
                step.outs, step.allocations, step._views, strict=True
            ):
                if out in fresh:
                    slots.append(None)
                    continue
                slot = out if view is None else len(template)
                if view is not None:
                    template.append(None)
                buffers.append(Buffer(slot, shape, dtype, out, shape if view is None else view))
                slots.append(slot)
                plain.update((slot, out))
                static.update((slot, out))
            step.bind(slots)
        elif isinstance(step, _MatmulStep):
            step.buffer = None if step.out in fresh else step.out
            if step.buffer is not None and not step.accumulate:  # one buffer per sum
                buffers.append(Buffer(step.out, step.shape, step.dtype, step.out, step.shape))
                plain.add(step.out)
                static.add(step.out)
        elif isinstance(step, _ViewStep) and (
            step.ins[0] in plain or (step.op != "reshape" and step.ins[0] in static)
        ):
            static_views.append(step)
            static.add(step.out)
            if step.op == "reshape":
                plain.add(step.out)
            continue
        steps.append(step)
    _spans(plan, buffers, outputs)
    # Outside a loop body what the caller receives is fresh: constants, arguments (and
    # views of either) are copied (runtime.ownership).
    owned = static | from_args
    copied = [] if bound else [k for k, slot in enumerate(outputs) if slot in owned]
    return Arena(template, buffers, static_views, steps, outputs, static, lower, copied)


def _stored_matmul(step: _MatmulStep, stored: tuple[int, bool] | None) -> None:
    """fold_accumulations' result for `step`, as stored tables give it: its output slot
    and whether it adds into it (the adds it replaced were never built)."""
    if stored is None:
        raise Stale("a matmul the tables do not know")
    step.out, step.accumulate = stored


def _lower(*args: Any, one_thread: bool, private: frozenset[int]) -> Any:
    """runtime.plan_table's `lower`, imported when a plan is first lowered (its kernels
    compiled): the interpreter imports Numba, which a first call does not wait for."""
    from fastgrad.runtime.plan_table import lower

    return lower(*args, one_thread=one_thread, private=private)


def fresh_slots(
    plan: Sequence[PlanStep], outputs: Sequence[int], stacked_inputs: bool = True
) -> set[int]:
    """The slots whose arrays a call must allocate afresh: the outputs, and what they may
    be views of (the inputs of a view, of a library call or of a loop that may return
    one). Without `stacked_inputs`: not a scan's stacked inputs, which it never returns
    (what the caller may see: LoopStep.publish)."""
    fresh = set(outputs)
    for step in reversed(plan):
        if isinstance(step, _ViewStep | _CallStep) and step.out in fresh:
            fresh.update(step.ins)
        elif isinstance(step, LoopStep) and any(slot in fresh for _, slot in step.outs):
            fresh.update(step.ins if stacked_inputs else step.returnable)
    return fresh


def _spans(plan: list[PlanStep], buffers: list[Buffer], outputs: Sequence[int]) -> None:
    """Set each buffer's span: the step that writes it, and the last that reads it or a
    value that may be a view of it (through views, library calls and loops)."""
    aliases: dict[int, set[int]] = {}  # slot -> buffers whose memory it may be
    for k, b in enumerate(buffers):
        aliases[b.slot] = aliases[b.view_slot] = {k}
    writes: dict[int, list[int]] = {}  # slot -> the buffers a step writes into it
    written: set[int] = set()
    for k, b in enumerate(buffers):
        writes.setdefault(b.view_slot, []).append(k)
    for i, step in enumerate(plan):
        reads = [*step.ins, *getattr(step, "checks", ())]
        for slot in reads:
            for k in aliases.get(slot, ()):
                buffers[k].last = i
        if isinstance(step, _KernelStep | _MatmulStep):
            for slot in step.outs if isinstance(step, _KernelStep) else [step.out]:
                for k in writes.get(slot, ()):
                    if k not in written:  # a sum of matmuls: written by several steps
                        written.add(k)
                        buffers[k].first = i
                    buffers[k].last = i
        else:
            outs = [slot for _, slot in step.outs] if isinstance(step, LoopStep) else [step.out]
            seen = set().union(*(aliases.get(slot, ()) for slot in reads))
            for slot in outs:
                aliases.setdefault(slot, set()).update(seen)
    for slot in outputs:  # read by the caller: preallocated outputs (a loop body's) too
        for k in aliases.get(slot, ()):
            buffers[k].last = len(plan)
    _pair_spans(plan, buffers, aliases)


def _pair_spans(plan: list[PlanStep], buffers: list[Buffer], aliases: dict[int, set[int]]) -> None:
    """Two products with only views between may run at once (runtime.gemm_split.pair):
    what the first reads lives until the second is written, so that the second never
    writes where the first reads (a backward pass's g @ v.T and p.T @ g wrote dv over v,
    and ran one after the other). A product handed to the worker and waited for later
    (runtime.plan_posts) keeps no buffer alive: its wait goes before the first step that
    writes bytes it reads, by the buffers' addresses. (Keeping what every big product
    reads alive until its output's first reader, so that more work could run beside it,
    made arenas ~1.7x larger: a 6-layer MLP's gradient 3.67 -> 6.30 MB.)"""
    after = len(plan)  # the next step that is not a view
    for i in range(len(plan) - 1, -1, -1):
        step = plan[i]
        if isinstance(step, _MatmulStep) and after < len(plan):
            if isinstance(plan[after], _MatmulStep):
                for slot in step.ins:
                    for k in aliases.get(slot, ()):
                        buffers[k].last = max(buffers[k].last, after)
        if not isinstance(step, _ViewStep):
            after = i
