"""The first tier: a fused loop run with whole-array NumPy while its kernel compiles.

`NumpyLoop` evaluates a loop's nodes in order with each op's NumPy reference on whole
arrays (one vectorized NumPy call per op, not an interpretation per element), writing an
elementwise result into a dead operand's buffer where it can; a large loop runs the same
calls over blocks of rows that stay in cache (runtime.numpy_blocks). It reads and fills the
same slots as the kernel would, so a plan can switch between the two at any step.
Results agree with the compiled kernels within the tolerance `tests/test_tiers.py`
states: NumPy's libm and summation order against fastgrad's vector math and chunked sums.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from fastgrad.compiler.fusion import REDUCTIONS, Loop
from fastgrad.runtime.arena import staggered_empty
from fastgrad.runtime.numpy_blocks import BlockedLoop
from fastgrad.runtime.numpy_reductions import tier_impl
from fastgrad.runtime.recycling import MIN_BYTES, Pool

# (impl, params, inputs as (is_slot, slot or local index), dtype, reusable local index)
_Op = tuple[Callable[..., Any], dict[str, Any], list[tuple[bool, int]], np.dtype, int]


class NumpyLoop:
    """One fused loop as a sequence of whole-array NumPy calls over the plan's slots."""

    def __init__(
        self,
        loop: Loop,
        slot_of: Callable[[Any], int],
        stored: Any = None,
        base: Sequence[int] = (),
    ):
        """`stored`: what `tables()` gave for this loop in another process (the plan read
        from disk, runtime.build_tables), used instead of working it out again. The ops
        name the slots they read and fill by their place in `self.slots`, which starts
        with `base` (the kernel step's inputs and outputs): steps alike but for their
        slots share the rest (runtime.stored_plan)."""
        nodes = loop.nodes
        if stored is not None:
            ins_of, reuse_of, outputs, dead, into, passed, self.slots = stored
            self.ops = [
                (tier_impl(n.op.name, n.op.impl), n.params, ins, n.out.aval.dtype, reuse)
                for n, ins, reuse in zip(nodes, ins_of, reuse_of, strict=True)
            ]
            self.outputs = list(outputs)
            self.size = len(self.ops)
            if len(dead) != self.size or len(into) != self.size:
                raise ValueError("the stored tier is for another loop")
            self._pass(passed)
            # (stored too: ~10 us a loop, 599 loops in the T=200 RNN's warm first call)
            self.dead, self.into, self.pooled = dead, into, any(into)
            self.blocked = BlockedLoop.plan(loop, slot_of)
            return
        self.slots = list(base)
        places = {slot: k for k, slot in reversed(list(enumerate(base)))}

        def place(v: Any) -> int:
            slot = slot_of(v)
            k = places.get(slot)
            if k is None:
                k = places[slot] = len(self.slots)
                self.slots.append(slot)
            return k

        local = {id(node.out): i for i, node in enumerate(nodes)}
        outputs = {local[id(v)] for v in loop.outputs}
        # A ufunc's result is fresh memory, and one read only by ufuncs and reductions
        # (whose results are fresh too) is never aliased by a view: the last of those
        # ufuncs may write its own result into it. (W2's whole loop: 3 fresh temporaries
        # of 4096 x 1000 instead of 4; faulting in fresh pages was most of its first run.)
        ufunc = [n.op.impl is n.op.ufunc and isinstance(n.op.ufunc, np.ufunc) for n in nodes]
        fresh = [u or n.op.name in REDUCTIONS for u, n in zip(ufunc, nodes, strict=True)]
        readers: dict[int, list[int]] = {}
        inputs: list[list[tuple[bool, int]]] = []
        for i, node in enumerate(nodes):
            ins: list[tuple[bool, int]] = []
            for v in node.inputs:
                k = local.get(id(v))
                if k is None:
                    ins.append((True, place(v)))
                else:
                    ins.append((False, k))
                    readers.setdefault(k, []).append(i)
            inputs.append(ins)
        self.ops: list[_Op] = []
        for i, (node, ins) in enumerate(zip(nodes, inputs, strict=True)):
            reuse = -1
            for v in node.inputs if ufunc[i] else ():
                k = local.get(id(v))
                if (
                    k is not None
                    and ufunc[k]
                    and k not in outputs
                    and all(fresh[r] for r in readers[k])
                    and readers[k][-1] == i
                    and v.aval.shape == node.out.aval.shape
                    and v.aval.dtype == node.out.aval.dtype
                ):
                    reuse = k
                    break
            impl = tier_impl(node.op.name, node.op.impl)  # (short reductions: by slices)
            self.ops.append((impl, node.params, ins, node.out.aval.dtype, reuse))
        self.outputs = [(local[id(v)], place(v)) for v in loop.outputs]
        self.size = len(self.ops)
        self._dead_buffers(nodes)
        self._pass(_passed(nodes, inputs, outputs, readers, ufunc))
        # A large loop runs a block of rows at a time, in cache (runtime.numpy_blocks).
        self.blocked = BlockedLoop.plan(loop, slot_of)

    @classmethod
    def like(cls, other: NumpyLoop, slots: list[int]) -> NumpyLoop:
        """A loop whose ops are `other`'s (shared), on slots `slots` in their places
        (runtime.stored_plan); run by blocks where `other` is (a loop of its own)."""
        if len(slots) != len(other.slots):
            raise ValueError("the stored tier is for another loop")
        loop = cls.__new__(cls)
        loop.__dict__.update(other.__dict__)
        loop.slots = slots
        return loop

    @classmethod
    def stored(
        cls, ops: list[tuple[Any, dict[str, Any], np.dtype]], stored: Any, slots: int
    ) -> NumpyLoop:
        """The loop `program()` gave (`stored`) for ops given as (impl, params, dtype),
        with no loop's nodes (runtime.stored_plan), on `slots` slots not given yet (`like`
        gives a step's); not run by blocks unless its `blocked` is set."""
        loop = cls.__new__(cls)
        ins_of, reuse_of, outputs, dead, into, passed = stored
        size = len(ops)
        if not (len(ins_of) == len(reuse_of) == len(dead) == len(into) == size):
            raise ValueError("the stored tier is for another loop")
        if any(p >= slots for ins in ins_of for is_slot, p in ins if is_slot) or any(
            p >= slots for _, p in outputs
        ):
            raise ValueError("the stored tier reads slots it is not given")
        loop.ops = [
            (impl, params, list(ins), dtype, reuse)
            for (impl, params, dtype), ins, reuse in zip(ops, ins_of, reuse_of, strict=True)
        ]
        loop.outputs, loop.size, loop.slots = list(outputs), size, [0] * slots
        loop.dead, loop.into, loop.pooled = dead, into, any(into)
        loop._pass(passed)
        loop.blocked = None
        return loop

    def _pass(self, passed: Sequence[int]) -> None:
        """Leave the broadcasts `passed` (ops' places, `_passed`) to the ufuncs reading
        them: each gives its input as it is."""
        broadcast = _BROADCAST()
        for i in passed:
            if not 0 <= i < self.size or self.ops[i][0] is not broadcast:
                raise ValueError("the stored tier passes on an op that is not a broadcast")
            _, params, ins, dtype, reuse = self.ops[i]
            self.ops[i] = (_given, params, ins, dtype, reuse)
        self.passed = tuple(passed)

    def _dead_buffers(self, nodes: list[Any]) -> None:
        """Which values to let go of after each op (those it read last, and what nothing
        reads), and which large results to write into memory nobody holds any more (an
        earlier value of the run let go of: runtime.recycling's rule, in a pool of the
        run's own) rather than into fresh pages: W2's first call faulted in four fresh
        4096 x 1000 arrays, one of them scatter_add's zeroed target."""
        last = list(range(self.size))
        for i, (_, _, ins, _, _) in enumerate(self.ops):
            for is_slot, k in ins:
                if not is_slot:
                    last[k] = i
        kept = {k for k, _ in self.outputs}
        self.dead: list[list[int]] = [[] for _ in range(self.size)]
        for k, i in enumerate(last):
            if k not in kept:
                self.dead[i].append(k)
        # (shape, whether a ufunc) of the results written into recycled memory
        self.into: list[tuple[tuple[int, ...], bool] | None] = []
        for node, (impl, _, _, dtype, reuse) in zip(nodes, self.ops, strict=True):
            ufunc = isinstance(impl, np.ufunc) and impl is node.op.ufunc
            shape = node.out.aval.shape
            large = math.prod(shape) * dtype.itemsize >= MIN_BYTES
            into = reuse < 0 and large and (ufunc or node.op.name == "scatter_add")
            self.into.append((shape, ufunc) if into else None)
        self.pooled = any(self.into)

    def tables(self) -> tuple[Any, ...]:
        """The loop's plan as plain data, for `stored` (runtime.build_tables)."""
        return (*self.program(), tuple(self.slots))

    def program(self) -> tuple[Any, ...]:
        """The loop's plan but for its slots, as plain data (runtime.stored_plan)."""
        ins = tuple(tuple(op[2]) for op in self.ops)
        dead = tuple(map(tuple, self.dead))
        reuse, outputs, into = (
            tuple(op[4] for op in self.ops),
            tuple(self.outputs),
            tuple(self.into),
        )
        return ins, reuse, outputs, dead, into, self.passed

    def run(self, env: list[Any], bound: Sequence[tuple[int, np.ndarray]] = ()) -> None:
        """Run the loop on `env`'s slots; `bound`: (slot, array) of outputs that have
        memory of their own (the arena's buffers, overlapping none of the loop's inputs,
        as a kernel's outputs), which a ufunc computing one, or a blocked loop computing
        it a block at a time, writes into rather than into fresh memory copied there
        afterwards (plan_steps' `_numpy_answers` copies what is not written so; bench
        M4's first call copied 96 MB in float32, 192 MB in float64: 12-370 ms of CPU)."""
        if self.blocked is not None:
            self.blocked.run(env, dict(bound) if bound else None)
            return
        values: list[Any] = [None] * self.size
        slots = self.slots
        dests = _destinations(self.outputs, slots, bound) if bound else {}
        # Temporaries' memory is this run's own: kept past it (in runtime.recycling's
        # pool), blocks of one size waited while other steps allocated other sizes (M4's
        # first call peaked at 349 MB against 243).
        take = Pool().take if self.pooled else None
        with np.errstate(all="ignore"):  # as the kernels: inf and nan, never an exception
            for i, (impl, params, ins, dtype, reuse) in enumerate(self.ops):
                args = [env[slots[k]] if is_slot else values[k] for is_slot, k in ins]
                into = self.into[i]
                dest = dests.get(i) if dests else None
                if dest is not None and type(impl) is np.ufunc and impl.nout == 1:
                    # (the arena keeps a kernel's outputs apart from its inputs)
                    values[i] = impl(*args, out=dest, casting="unsafe", **params)
                elif reuse >= 0 and values[reuse].ndim:
                    values[i] = impl(*args, out=values[reuse], **params)
                elif into is not None:
                    out = staggered_empty(into[0], dtype, i, take)
                    cast = {"casting": "unsafe"} if into[1] else {}  # as np.asarray's
                    values[i] = impl(*args, out=out, **cast, **params)
                else:
                    values[i] = np.asarray(impl(*args, **params), dtype=dtype)
                for k in self.dead[i]:
                    values[k] = None  # (its memory may serve a later op's result)
        for k, place in self.outputs:
            env[slots[place]] = values[k]


def _passed(
    nodes: Sequence[Any],
    inputs: Sequence[Sequence[tuple[bool, int]]],
    outputs: AbstractSet[int],
    readers: dict[int, list[int]],
    ufunc: Sequence[bool],
) -> list[int]:
    """The broadcasts (by place among `nodes`) that the tier may leave to the ufuncs
    reading them: not an output of the loop, read only by single-output ufuncs whose
    result keeps its shape when that operand (and any other so left) is given as it is.
    A ufunc broadcasts an operand by strides of 0 as np.broadcast_to's view has them:
    the same inner loop, the same bits. (The T=200 RNN's first call: 600 of its 800
    np.broadcast_to calls, ~4 us each, gone.)"""
    shapes = [n.out.aval.shape for n in nodes]
    passed: list[int] = []
    broadcast = _BROADCAST()
    for i, node in enumerate(nodes):
        if tier_impl(node.op.name, node.op.impl) is not broadcast or i in outputs:
            continue
        kept, shapes[i] = shapes[i], node.inputs[0].aval.shape
        alike = [
            ufunc[r]
            and nodes[r].op.ufunc.nout == 1
            and _result_shape(inputs[r], shapes, nodes[r]) == nodes[r].out.aval.shape
            for r in readers.get(i, ())
        ]
        if alike and all(alike):
            passed.append(i)
        else:
            shapes[i] = kept
    return passed


def _result_shape(
    ins: Sequence[tuple[bool, int]], shapes: Sequence[tuple[int, ...]], node: Any
) -> tuple[int, ...] | None:
    """The shape a ufunc gives for operands of `shapes` (locals) or of their avals' (slots)."""
    operands = [
        v.aval.shape if is_slot else shapes[k]
        for (is_slot, k), v in zip(ins, node.inputs, strict=True)
    ]
    try:
        return np.broadcast_shapes(*operands)
    except ValueError:
        return None


def _given(x: Any, **params: Any) -> Any:
    """A broadcast the ufuncs reading it do themselves (`_passed`): its operand."""
    return x


@functools.cache
def _BROADCAST() -> Any:  # noqa: N802
    """What the tier calls for broadcast_to (the ops' registry is full by a first call)."""
    from fastgrad.core.primitive import REGISTRY

    return tier_impl("broadcast_to", REGISTRY["broadcast_to"].impl)


def _destinations(
    outputs: list[tuple[int, int]], slots: list[int], bound: Sequence[tuple[int, np.ndarray]]
) -> dict[int, np.ndarray]:
    """The arrays `bound` gives for outputs' slots, by the op computing each."""
    by_slot = dict(bound)
    return {k: by_slot[slots[p]] for k, p in outputs if slots[p] in by_slot}
