"""Run a partitioned graph: fused kernels and library calls over a flat list of buffers.

Every value has a slot; graph inputs and constants are filled in first, then each step
reads its slots and fills its own. Kernel outputs are allocated with NumPy (which asks for
huge pages) and passed in. A loop's kernel is generated, and compiled, on its first run:
the serial variant for small sizes, the parallel one (prange) above a threshold. In
background mode a kernel step asks its tier (runtime.background) at each run whether its
kernel is ready; until then the tier runs the loop with NumPy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numba
import numpy as np

from fastgrad.compiler.codegen.loops import KernelSource, generate
from fastgrad.compiler.codegen.vecmath import FUNCTIONS
from fastgrad.compiler.fusion import Call, Loop, Step, partition
from fastgrad.compiler.kernel_cache import first_call, load_kernel
from fastgrad.compiler.passes import simplify
from fastgrad.core.config import config
from fastgrad.core.ir import Graph
from fastgrad.runtime.background import KernelTier
from fastgrad.runtime.control_flow import OPS as LOOP_OPS
from fastgrad.runtime.control_flow import LoopPlanner, LoopStep
from fastgrad.runtime.numpy_tier import NumpyLoop

# Below this many iterations a parallel loop costs more than it saves: thread wake-up, and
# contention with BLAS threads still spinning after a matmul (measured on the MLP
# benchmark: a 256x512 elementwise loop took 4.3 ms parallel, 0.8 ms serial).
PARALLEL_THRESHOLD = 1 << 18
# Full reductions keep one partial per chunk: a fixed count makes results independent of
# the thread count and of the serial/parallel choice.
MAX_CHUNKS = 64
VECTOR_MATH = frozenset(FUNCTIONS)
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
    tier: KernelTier | None = None  # background mode: NumPy, then kernels as they are ready

    def __post_init__(self) -> None:
        # Which operands the kernel sees in another shape: 0-d as (1,), and all raveled in a
        # flat loop. Decided once here, so a call does no more than it must.
        flat = self.source.flat
        self._reshape_in = [
            v.aval.ndim == 0 or (flat and v.aval.ndim > 1) for v in self.source.inputs
        ]
        self._any_reshape = any(self._reshape_in)
        self._allocations = []
        self._views: list[tuple[int, ...] | None] = []
        for v in self.source.outputs:
            shape = v.aval.shape
            kernel_shape = (v.aval.size,) if (flat or not shape) and len(shape) != 1 else shape
            self._allocations.append((kernel_shape, v.aval.dtype))
            self._views.append(None if kernel_shape == shape else shape)

    def run(self, env: list[Any]) -> None:
        for slot in self.checks:  # kernels do not bounds-check; NumPy would raise here
            columns = env[slot]
            k = self.sizes[1]
            if columns.size and (columns.min() < -k or columns.max() >= k):
                bad = columns[(columns < -k) | (columns >= k)][0]
                raise IndexError(f"index {bad} is out of bounds for axis 1 with size {k}")
        if self.tier is not None and self.tier.answer(self, env):
            return  # computed with NumPy: the kernel is still compiling in the background
        kernel = self.kernel
        if kernel is None:
            loaded = load_kernel(self.source.source, self.source.name)
            kernel = partial(first_call, loaded, self.source.source)
        args, outs = self.arguments(env)
        kernel(*args)
        if self.kernel is None:
            self.kernel = loaded
        for slot, buf, view in zip(self.outs, outs, self._views, strict=False):
            env[slot] = buf if view is None else buf.reshape(view)

    def arguments(self, env: list[Any]) -> tuple[list[Any], list[np.ndarray]]:
        """The kernel's arguments for the values in `env`, and its fresh output arrays."""
        if self._any_reshape:
            arrays = [
                np.ascontiguousarray(env[slot]).reshape(-1) if reshape else env[slot]
                for slot, reshape in zip(self.ins, self._reshape_in, strict=False)
            ]
        else:
            arrays = [env[slot] for slot in self.ins]
        outs = [np.empty(s, d) for s, d in self._allocations]
        return [*self.sizes, self.nchunks, *self.scalars, *arrays, *outs], outs


@dataclass
class _CallStep:
    impl: Any
    params: dict[str, Any]
    ins: list[int]
    out: int
    dtype: np.dtype

    def run(self, env: list[Any]) -> None:
        with np.errstate(all="ignore"):
            value = self.impl(*(env[i] for i in self.ins), **self.params)
        env[self.out] = np.asarray(value, dtype=self.dtype)


class Executable:
    """A graph ready to run: call it with the graph's input arrays."""

    def __init__(self, graph: Graph, steps: Sequence[Step]):
        self.graph = graph
        self.steps = list(steps)
        slot: dict[int, int] = {}

        def slot_of(v: Any) -> int:
            if id(v) not in slot:
                slot[id(v)] = len(slot)
            return slot[id(v)]

        for v in graph.inputs:
            slot_of(v)
        constants: dict[int, np.ndarray] = {}
        for node in graph.nodes:
            if node.op.name == "const":
                constants[id(node.out)] = node.params["value"]
        self.constants = constants
        self.plan: list[_KernelStep | _CallStep | LoopStep] = []
        loops = LoopPlanner(graph, compile_graph)
        for step in self.steps:
            if isinstance(step, Call) and step.node.op.name in LOOP_OPS:
                loop = loops.step(step.node, slot_of)  # one step for all of a loop's nodes
                if loop is not None:
                    self.plan.append(loop)
            elif isinstance(step, Call):
                n = step.node
                self.plan.append(
                    _CallStep(
                        n.op.impl,
                        n.params,
                        [slot_of(v) for v in n.inputs],
                        slot_of(n.out),
                        n.out.aval.dtype,
                    )
                )
            else:
                self.plan.append(self._kernel_step(step, slot_of))
        self.outputs = [slot_of(v) for v in graph.outputs]
        self.waits = False  # set by settle()
        self.template: list[Any] = [None] * len(slot)
        for key, value in constants.items():
            if key in slot:
                self.template[slot[key]] = value

    def _kernel_step(self, loop: Loop, slot_of: Any) -> _KernelStep:
        size = int(np.prod(loop.shape))
        parallel = size >= PARALLEL_THRESHOLD and numba.config.NUMBA_NUM_THREADS > 1  # type: ignore[attr-defined]
        source = generate(loop, parallel, VECTOR_MATH, self.constants)
        tier = None
        if config.compile == "background":
            # the serial variant first, which compiles ~1.2 s faster than the parallel one
            serial = [generate(loop, False, VECTOR_MATH, self.constants)] if parallel else []
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
            nchunks=max(1, min(first, MAX_CHUNKS)),
            parallel=parallel,
            # NumPy scalars, so Numba types each by its dtype (float32 stays float32).
            scalars=tuple(self.constants[id(v)].reshape(())[()] for v in source.scalars),
            checks=tuple(slot_of(v) for v in source.index_checks),
            tier=tier,
        )

    def __call__(self, args: Sequence[Any]) -> list[np.ndarray]:
        env = self.template.copy()
        env[: len(args)] = args
        for step in self.plan:
            step.run(env)
        return [env[i] for i in self.outputs]

    def settle(self) -> None:
        """Make the next call wait for every kernel rather than run NumPy meanwhile."""
        self.waits = True
        for step in self.plan:
            if isinstance(step, _KernelStep) and step.tier is not None:
                step.tier.wait = True

    @property
    def compiled(self) -> bool:
        """Whether every loop runs its final kernel (no NumPy tier left)."""
        return all(s.tier is None for s in self.plan if isinstance(s, _KernelStep))

    @property
    def kernels(self) -> list[KernelSource]:
        """The plan's kernels, then those of the loop bodies it runs."""
        own = [s.source for s in self.plan if isinstance(s, _KernelStep)]
        return own + [k for s in self.plan if isinstance(s, LoopStep) for k in s.kernels]


def compile_graph(graph: Graph) -> Executable:
    """A loop body's plan: simplified, partitioned and compiled like a whole function."""
    graph = simplify(graph)
    return Executable(graph, partition(graph))
