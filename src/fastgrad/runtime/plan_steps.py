"""A plan's steps other than matmuls and loops: a fused kernel (with its NumPy tier until
the kernel is ready), a view, and a library call, each reading and filling slots of a
flat list of values (runtime.executable builds them from a partitioned graph)."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.adapter import ADAPTED
from fastgrad.compiler.codegen.loops import KernelSource
from fastgrad.compiler.fusion import Loop
from fastgrad.compiler.kernel_cache import call_writable, first_call, load_kernel
from fastgrad.runtime import adapters, background
from fastgrad.runtime.arena import staggered_empty
from fastgrad.runtime.background import KernelTier, layout
from fastgrad.runtime.control_flow import LoopStep
from fastgrad.runtime.matmul import MatmulStep as _MatmulStep
from fastgrad.runtime.plan_rows import view as view_of


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
        self._form = form = _form(self.source)
        self._reshape_in = form.reshape_in
        self._any_reshape = form.any_reshape
        self._head = (*self.sizes, self.nchunks, *self.scalars)
        self.allocations = form.allocations
        self._views = form.views
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

    def adapter_signature(self) -> tuple[int, list[str], list[tuple[int, str]]] | None:
        """How the plan interpreter calls this kernel (compiler.codegen.adapter's
        `adapter_source` arguments): its sizes, its scalars' dtypes, its operands' ranks
        and dtypes as it sees them (inputs, then outputs); None for a dtype adapters do
        not take."""
        operands = self._form.adapted  # (worked out once for the steps of one form)
        scalars = [
            dtype_name(s.dtype if isinstance(s, np.generic) else np.asarray(s).dtype)
            for s in self.scalars
        ]
        if operands is None or any(d not in ADAPTED for d in scalars):
            return None
        return len(self.sizes), scalars, list(operands)

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

    def layouts(self, env: list[Any]) -> tuple[Any, ...]:
        """The layouts (background.layout) of `arguments(env)`, without allocating its fresh
        outputs: what the compile thread's jobs are keyed by, asked by every kernel step of
        a first call (599 in the T=200 RNN's, which share 6 jobs)."""
        kinds = tuple(map(type, self._head))  # ints, and NumPy scalars: a layout by type
        head = _HEADS.get(kinds)
        if head is None:
            head = _HEADS[kinds] = tuple(map(layout, self._head))
        if self._any_reshape:  # (0-d operands, flat loops: their raveled arrays)
            ins = tuple(
                [
                    layout(np.ascontiguousarray(env[slot]).reshape(-1) if reshape else env[slot])
                    for slot, reshape in zip(self.ins, self._reshape_in, strict=True)
                ]
            )
        else:
            ins = tuple([layout(env[slot]) for slot in self.ins])
        # An output's buffer, preallocated (Arena) or fresh, is a C-contiguous, aligned,
        # writeable array of the form's shape and dtype: its layout is the form's.
        return head + ins + self._form.out_layouts

    def prepare(self, env: list[Any], static: AbstractSet[int]) -> Callable[[], None] | None:
        """This step as a call with its arguments bound: the buffers, constants and views in
        `static` slots of `env` once and for all, the other slots read at each call. None
        while its kernel is not settled (not loaded yet, or compiling in the background)."""
        tier = self.tier
        if tier is not None and _loaded(tier, self, env):
            tier = None  # (settled by its kernel loaded meanwhile: runtime.native_plan)
        kernel = self.kernel
        if kernel is None or tier is not None:
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
        first = tier.jobs is None
        if first and "numba" not in sys.modules and _settles_natively(tier, self, env):
            return False  # its final kernel loaded without Numba: settled (runtime.native_plan)
        answered = tier.answer(self, env, bound)
        if first and tier.jobs is not None:  # its kernel just handed to the compile thread
            adapters.ahead(self)
        if not answered:
            return False
        for slot, buffer in bound:
            if env[slot] is not buffer:  # (not written there by the tier: NumpyLoop.run)
                np.copyto(buffer, env[slot])
                env[slot] = buffer
        return True


@dataclass(frozen=True)
class _Form:
    """What a kernel step derives from its operands' shapes and dtypes alone, worked out
    once for the steps that share them (the T=200 RNN's 599 kernel steps: a handful).

    `reshape_in`: which inputs the kernel sees in another shape (0-d as (1,), all raveled
    in a flat loop); per output, the shape and dtype the kernel writes (`allocations`)
    and the shape the graph sees (`views`, None when equal); `operands`: the ranks and
    dtype names the kernel sees, inputs then outputs (`adapter_signature`)."""

    reshape_in: tuple[bool, ...]
    any_reshape: bool
    allocations: tuple[tuple[tuple[int, ...], np.dtype], ...]
    views: tuple[tuple[int, ...] | None, ...]
    operands: tuple[tuple[int, str], ...]

    @functools.cached_property
    def adapted(self) -> tuple[tuple[int, str], ...] | None:
        """`operands`, or None where a dtype is one adapters do not take."""
        return self.operands if all(d in ADAPTED for _, d in self.operands) else None

    @functools.cached_property
    def out_layouts(self) -> tuple[Any, ...]:
        """The outputs' layouts (background.layout), as `_KernelStep.layouts` gives them."""
        return tuple([_fresh_layout(shape, dtype) for shape, dtype in self.allocations])


def _form(source: KernelSource) -> _Form:
    """The `_Form` of `source`'s operands."""
    ins = tuple([(v.aval.shape, v.aval.dtype) for v in source.inputs])
    outs = tuple([(v.aval.shape, v.aval.dtype) for v in source.outputs])
    return _form_of(source.flat, ins, outs)


@functools.lru_cache(maxsize=4096)  # by value: freshly traced plans have avals of their own
def _form_of(flat: bool, ins: tuple[Any, ...], outs: tuple[Any, ...]) -> _Form:
    """The `_Form` of a kernel's inputs' and outputs' (shape, dtype) pairs."""
    reshape_in = tuple([not (n := len(shape)) or (flat and n > 1) for shape, _ in ins])
    allocations = []
    views = []
    for shape, dtype in outs:
        kernel_shape = (math.prod(shape),) if (flat or not shape) and len(shape) != 1 else shape
        allocations.append((kernel_shape, dtype))
        views.append(None if kernel_shape == shape else shape)
    operands = [
        (1 if reshape else len(shape), dtype_name(dtype))
        for (shape, dtype), reshape in zip(ins, reshape_in, strict=True)
    ]
    operands += [(len(shape), dtype_name(dtype)) for shape, dtype in allocations]
    return _Form(reshape_in, any(reshape_in), tuple(allocations), tuple(views), tuple(operands))


@functools.cache
def dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, remembered: NumPy works it out in Python (~2.5 us), asked for each
    operand of each kernel step of a first call (the T=200 RNN's 599 steps: ~3,200)."""
    return dtype.name


# The layouts of kernels' leading arguments (sizes, chunks, scalars), by their types.
_HEADS: dict[tuple[type, ...], tuple[Any, ...]] = {}


def _settles_natively(tier: KernelTier, step: _KernelStep, env: list[Any]) -> bool:
    """runtime.native_plan's `settle`, imported (without Numba) when first asked and kept
    (an import statement per call cost ~2 us of each of the T=200 RNN's 599 kernel
    steps); False at once where that path is off (FASTGRAD_NATIVE=0: ~4 ms of the T=200
    RNN's first call asked each of its 599 kernel steps)."""
    if not _NATIVE_PLAN:
        from fastgrad.runtime import native_code, native_plan

        _NATIVE_PLAN[:] = native_code, native_plan
    native_code, native_plan = _NATIVE_PLAN
    return bool(native_code.ENABLED) and native_plan.settle(tier, step, env)


# runtime.native_code and runtime.native_plan, once imported (they load no Numba).
_NATIVE_PLAN: list[Any] = []


def _loaded(tier: KernelTier, step: _KernelStep, env: list[Any]) -> bool:
    """Whether `step`, whose kernel the compile thread has loaded without Numba since
    the step last ran (`native_plan.Load`), settles on it now, with this run's values in
    `env`: the arena then lowers its plan at the end of this run rather than running
    the steps one by one through their loaded kernels first (a warm T=200 RNN's 599:
    ~15 ms of CPU and a call more to its steady state). Not at a first call's end: the
    next call's run settles them, as the first call's is not to pay for it."""
    loading = tier.loading
    if loading is None or not loading.settled.is_set() or background._batches.open:
        return False  # (in a first call, whose plan is lowered at the next call anyway)
    from fastgrad.runtime import native_code

    if not native_code.contiguous(step, env):  # (not this run's values: a fresh arena's)
        return False
    return loading.answer(tier, step, env, ()) is False


@functools.lru_cache(maxsize=256)
def _fresh_layout(shape: tuple[int, ...], dtype: np.dtype) -> tuple[Any, ...]:
    """The layout of an output `arguments` allocates afresh (its offset apart, all alike)."""
    return layout(staggered_empty(shape, dtype, 0))


@dataclass
class _ViewStep:
    """reshape, transpose, slice or broadcast_to: a NumPy view (a copy only where NumPy's
    reshape needs one), with its arguments prepared once."""

    op: str
    arg: Any
    ins: list[int]
    out: int

    def run(self, env: list[Any]) -> None:
        env[self.out] = view_of(self.op, env[self.ins[0]], self.arg)


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
