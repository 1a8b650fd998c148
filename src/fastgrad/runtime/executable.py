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
from collections.abc import Set as AbstractSet
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.loops import KernelSource, generate
from fastgrad.compiler.codegen.math_names import VECTOR_MATH
from fastgrad.compiler.fusion import Call, Loop, Step, partition
from fastgrad.compiler.kernel_cache import call_writable, first_call, load_kernel
from fastgrad.compiler.passes import simplify
from fastgrad.core.config import config
from fastgrad.core.ir import Graph
from fastgrad.ops.shape import _as_slices as as_slices
from fastgrad.runtime import threading_layer  # noqa: F401  (before any parallel kernel)
from fastgrad.runtime.arena import Arena, Buffer, staggered_empty
from fastgrad.runtime.background import KernelTier
from fastgrad.runtime.blas import OneThread
from fastgrad.runtime.control_flow import OPS as LOOP_OPS
from fastgrad.runtime.control_flow import SMALL_MATMUL, LoopPlanner, LoopStep
from fastgrad.runtime.matmul import MatmulStep as _MatmulStep
from fastgrad.runtime.matmul import fold_accumulations
from fastgrad.runtime.numpy_tier import NumpyLoop
from fastgrad.runtime.ownership import borrowed
from fastgrad.runtime.small_call import SmallCall, function
from fastgrad.runtime.small_call import build as build_small_call
from fastgrad.runtime.thread_budget import largest_gemm, numba_threads, shares_cores

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


@dataclass
class _KernelStep:
    loop: Loop
    source: KernelSource
    ins: list[int]
    outs: list[int]
    sizes: tuple[int, ...]
    nchunks: int
    parallel: bool
    scalars: tuple[Any, ...] = ()
    checks: tuple[int, ...] = ()
    kernel: Any = None
    tier: KernelTier | None = None  # NumPy, then kernels as they are ready (None: settled)

    def __post_init__(self) -> None:
        # Which operands the kernel sees in another shape: 0-d as (1,), and all raveled in a
        # flat loop. Decided once here, so a call does no more than it must.
        flat = self.source.flat
        self._reshape_in = [
            v.aval.ndim == 0 or (flat and v.aval.ndim > 1) for v in self.source.inputs
        ]
        self._any_reshape = any(self._reshape_in)
        self._head = (*self.sizes, self.nchunks, *self.scalars)
        # Per output: the shape and dtype the kernel writes, and the shape the graph sees
        # (None when equal).
        self.allocations: list[tuple[tuple[int, ...], np.dtype]] = []
        self._views: list[tuple[int, ...] | None] = []
        for v in self.source.outputs:
            shape = v.aval.shape
            kernel_shape = (v.aval.size,) if (flat or not shape) and len(shape) != 1 else shape
            self.allocations.append((kernel_shape, v.aval.dtype))
            self._views.append(None if kernel_shape == shape else shape)
        self.bind([None] * len(self.outs))

    def bind(self, buffers: list[int | None]) -> None:
        """Outputs written into preallocated buffers: `buffers[k]` is the slot holding output
        k's buffer in the kernel's shape (its graph-shaped view sits in its own slot), or
        None for an output allocated afresh at every call."""
        self._buffers = buffers
        self._fresh = [
            (k, *self.allocations[k], self._views[k], self.outs[k])
            for k, b in enumerate(buffers)
            if b is None
        ]

    def check_indices(self, env: list[Any]) -> None:
        """Raise NumPy's IndexError for an index out of bounds: kernels do not check."""
        for slot in self.checks:
            columns = env[slot]
            k = self.sizes[1]
            if columns.size and (columns.min() < -k or columns.max() >= k):
                bad = columns[(columns < -k) | (columns >= k)][0]
                raise IndexError(f"index {bad} is out of bounds for axis 1 with size {k}")

    def run(self, env: list[Any]) -> None:
        self.check_indices(env)
        if self.tier is not None and self._numpy_answers(env):
            return  # computed with NumPy: the kernel is still compiling in the background
        kernel = self.kernel
        if kernel is None:
            loaded = load_kernel(self.source.source, self.source.name)
            kernel = partial(first_call, loaded)
        call_writable(kernel, self.arguments(env))
        if self.kernel is None:
            self.kernel = loaded

    def arguments(self, env: list[Any]) -> list[Any]:
        """The kernel's arguments for the values in `env`. Outputs without a preallocated
        buffer are allocated here and put in their slots."""
        if self._any_reshape:
            arrays = [
                np.ascontiguousarray(env[slot]).reshape(-1) if reshape else env[slot]
                for slot, reshape in zip(self.ins, self._reshape_in, strict=False)
            ]
        else:
            arrays = [env[slot] for slot in self.ins]
        outs = [None if b is None else env[b] for b in self._buffers]
        for k, shape, dtype, view, slot in self._fresh:
            buf = outs[k] = staggered_empty(shape, dtype, k)
            env[slot] = buf if view is None else buf.reshape(view)
        return [*self._head, *arrays, *outs]

    def prepare(self, env: list[Any], static: AbstractSet[int]) -> Callable[[], None] | None:
        """This step as a call with its arguments bound: the buffers, constants and views in
        `static` slots of `env` once and for all, the other slots read at each call. None
        while its kernel is not settled (not loaded yet, or compiling in the background)."""
        kernel = self.kernel
        if kernel is None or self.tier is not None:
            return None
        if self.checks:
            return partial(self.run, env)
        args = list(self._head)
        dynamic = []  # (position, slot, raveled)
        for slot, reshape in zip(self.ins, self._reshape_in, strict=True):
            value = env[slot] if slot in static else None
            if value is not None and reshape:
                raveled = np.ascontiguousarray(value).reshape(-1)
                value = raveled if np.may_share_memory(raveled, value) else None  # no copy
            if value is None:
                dynamic.append((len(args), slot, reshape))
            args.append(value)
        args.extend(None if buffer is None else env[buffer] for buffer in self._buffers)
        fresh = []  # (position, output index, shape, dtype, graph shape, slot)
        for k, shape, dtype, view, slot in self._fresh:
            fresh.append((len(self._head) + len(self.ins) + k, k, shape, dtype, view, slot))
        if not dynamic and not fresh:
            return partial(kernel, *args)

        def call() -> None:
            for position, slot, reshape in dynamic:
                value = env[slot]
                args[position] = np.ascontiguousarray(value).reshape(-1) if reshape else value
            for position, k, shape, dtype, view, slot in fresh:
                buf = args[position] = staggered_empty(shape, dtype, k)
                env[slot] = buf if view is None else buf.reshape(view)
            call_writable(kernel, args)
            # Hold no array of this call past it: a scan's stacked output read here would
            # otherwise stay referenced, and its StackPool could never hand it out again.
            for position in cleared:
                args[position] = None

        cleared = [position for position, *_ in dynamic] + [position for position, *_ in fresh]
        return call

    def _numpy_answers(self, env: list[Any]) -> bool:
        """Ask the tier; when NumPy computed the loop, its results go into the preallocated
        buffers, which views made once per arena still look at."""
        tier = self.tier  # read once: a call in another thread may settle it meanwhile
        if tier is None:
            return False
        bound = [
            (out, env[out])
            for out, b in zip(self.outs, self._buffers, strict=True)
            if b is not None
        ]
        if not tier.answer(self, env):
            return False
        for slot, buffer in bound:
            np.copyto(buffer, env[slot])
            env[slot] = buffer
        return True


@dataclass
class _ViewStep:
    """reshape, transpose, slice or broadcast_to: a NumPy view (a copy only where NumPy's
    reshape needs one), with its arguments prepared once."""

    op: str
    arg: Any
    ins: list[int]
    out: int

    def run(self, env: list[Any]) -> None:
        env[self.out] = view(self.op, env[self.ins[0]], self.arg)


def view(op: str, x: np.ndarray, arg: Any) -> np.ndarray:
    if op == "slice":
        return x[arg]
    if op == "transpose":
        return x.transpose(arg)
    if op == "reshape":
        return x.reshape(arg)
    return np.broadcast_to(x, arg)


_VIEW_ARG = {
    "reshape": lambda params: params["shape"],
    "broadcast_to": lambda params: params["shape"],
    "transpose": lambda params: params["axes"],
    "slice": lambda params: as_slices(params["index"]),
}


@dataclass
class _CallStep:
    """Any other op: its NumPy implementation."""

    impl: Any
    params: dict[str, Any]
    ins: list[int]
    out: int
    dtype: np.dtype

    def run(self, env: list[Any]) -> None:
        value = self.impl(*(env[i] for i in self.ins), **self.params)  # under plan's errstate
        env[self.out] = np.asarray(value, dtype=self.dtype)


PlanStep = _KernelStep | _CallStep | _MatmulStep | _ViewStep | LoopStep


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
    ):
        self.graph = graph
        self.steps = list(steps)
        # Kernel sources by (index of the loop in `steps`, parallel): given (a plan loaded
        # from disk, compiler.plan_cache) or filled here, for the plan cache to store.
        self.generated = {} if generated is None else generated
        slot: dict[int, int] = {}

        def slot_of(v: Any) -> int:  # ~12,600 calls building the T=200 RNN's plan
            k = slot.get(id(v))
            if k is None:
                k = slot[id(v)] = len(slot)
            return k

        for v in graph.inputs:
            slot_of(v)
        constants: dict[int, np.ndarray] = {}
        for node in graph.nodes:
            if node.op.name == "const":
                constants[id(node.out)] = node.params["value"]
        self.constants = constants
        self.plan: list[PlanStep] = []
        loops = LoopPlanner(graph, compile_graph)
        for index, step in enumerate(self.steps):
            if isinstance(step, Call) and step.node.op.name in LOOP_OPS:
                loop = loops.step(step.node, slot_of)  # one step for all of a loop's nodes
                if loop is not None:
                    self.plan.append(loop)
            elif isinstance(step, Call):
                self.plan.append(self._call_step(step.node, slot_of))
            else:
                self.plan.append(self._kernel_step(step, slot_of, index))
        self.outputs = [slot_of(v) for v in graph.outputs]
        views = [(s.ins[0], s.out) for s in self.plan if isinstance(s, _ViewStep)]
        per_call = borrowed(views, len(graph.inputs))  # arguments, and views of them
        fresh = fresh_slots(self.plan, self.outputs)
        seen = fresh_slots(self.plan, self.outputs, stacked_inputs=False)
        for planned in self.plan:
            if isinstance(planned, LoopStep):
                planned.publish(seen)
        self.plan = fold_accumulations(self.plan, fresh, per_call)
        self.views_of = partial(fresh_slots, self.plan)  # (runtime.loop_table's carries)
        self.waits = False  # set by settle()
        self.template: list[Any] = [None] * len(slot)
        for key, value in constants.items():
            if key in slot:
                self.template[slot[key]] = value
        self._lock = threading.Lock()
        self._small: Any = None  # runtime.small_call's Plan, or False
        self.small_matmuls = 0 < largest_gemm(graph) <= SMALL_MATMUL
        self.one_blas_thread = one = self.small_matmuls or shares_cores(self.plan, graph)
        self._alternating: list[Arena] = []  # a loop body's two arenas (iterations)
        if looped:
            # The plan's own steps run the loop; copies of them (bound to buffers of
            # their own) serve `run`, for a loop that finds the two arenas in use.
            copies = [copy.copy(s) for s in self.plan]
            first = _arena(self.plan, self.template, self.outputs, per_call, True, one)
            self._alternating = [first, first.fresh()]
            self.arena = _arena(copies, self.template, self.outputs, per_call, False, one)
        else:
            self.arena = _arena(self.plan, self.template, self.outputs, per_call, False, one)

    def _call_step(self, n: Any, slot_of: Any) -> _CallStep | _MatmulStep | _ViewStep:
        ins = [slot_of(v) for v in n.inputs]
        if n.op.name == "matmul":
            return _MatmulStep(ins, slot_of(n.out), n.out.aval.shape, n.out.aval.dtype)
        if n.op.name in _VIEW_ARG:
            return _ViewStep(n.op.name, _VIEW_ARG[n.op.name](n.params), ins, slot_of(n.out))
        return _CallStep(n.op.impl, n.params, ins, slot_of(n.out), n.out.aval.dtype)

    def _generate(self, index: int, loop: Loop, parallel: bool) -> KernelSource:
        source = self.generated.get((index, parallel))
        if source is None:
            source = generate(loop, parallel, VECTOR_MATH, self.constants)
            self.generated[index, parallel] = source
        return source

    def _kernel_step(self, loop: Loop, slot_of: Any, index: int) -> _KernelStep:
        size = math.prod(loop.shape)  # np.prod: ~4 us, per loop of a plan
        parallel = size >= PARALLEL_THRESHOLD and numba_threads() > 1
        source = self._generate(index, loop, parallel)
        # Sync mode too: its first call waits for the final kernel on the compile thread,
        # under the watchdog (an overdue compile leaves the loop on NumPy, never a hang).
        # In background mode the serial variant comes first: it compiles ~1.2 s faster.
        serial = [self._generate(index, loop, False)] if parallel else []
        tier = KernelTier(NumpyLoop(loop, slot_of), [*serial, source], loop.shape)
        if DEBUG:
            print(f"# fastgrad: kernel for loop over {loop.shape}\n{source.source}")
        sizes = (size,) if source.flat else tuple(loop.shape)
        outer = [a for a in range(len(sizes)) if source.flat or a not in loop.reduce_axes]
        first = sizes[outer[0]] if outer else 1
        return _KernelStep(
            loop=loop,
            source=source,
            ins=[slot_of(v) for v in source.inputs],
            outs=[slot_of(v) for v in source.outputs],
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
        if self._small is None and self.arena.bare and len(args) == len(self.graph.inputs):
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


def _run_next(arenas: Iterator[Arena], args: Sequence[Any]) -> list[Any]:
    return next(arenas).run(args)


def compile_graph(graph: Graph, looped: bool = False) -> Executable:
    """A loop body's or a branch's plan: simplified, partitioned and compiled like a
    whole function; with `looped`, also laid out to run as a loop's iterations."""
    graph = simplify(graph)
    return Executable(graph, partition(graph), looped)


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
) -> Arena:
    """Give every intermediate that kernels and matmuls write a preallocated buffer, bind
    the steps to them, and set apart the views of buffers (made once per arena).
    `from_args`: the slots of the arguments and of views of them (runtime.ownership).

    What the caller receives must be fresh at every call: the outputs, and what they may
    be views of (the inputs of a view, of a library call or of a loop that may return
    one). A reshape copies where its input is not contiguous, so only a reshape of a
    buffer itself (or of a constant) is made once; other views of views run per call."""
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
    # The interpreter runs BLAS on one thread where the step runner would.
    lower = partial(_lower, one_thread=one_blas_thread) if config.runtime == "vm" else None
    # Outside a loop body what the caller receives is fresh: constants, arguments (and
    # views of either) are copied (runtime.ownership).
    owned = static | from_args
    copied = [] if bound else [k for k, slot in enumerate(outputs) if slot in owned]
    return Arena(template, buffers, static_views, steps, outputs, static, lower, copied)


def _lower(*args: Any, one_thread: bool) -> Any:
    """runtime.plan_table's `lower`, imported when a plan is first lowered (its kernels
    compiled): the interpreter imports Numba, which a first call does not wait for."""
    from fastgrad.runtime.plan_table import lower

    return lower(*args, one_thread=one_thread)


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
