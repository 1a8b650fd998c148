"""The first tier over blocks: a large fused loop run with NumPy a block of rows at a time.

Whole-array NumPy over a loop of 10^7 elements makes every op a pass through main memory
(W1's 39 ops: 80 MB temporaries each, fresh pages for each, 2.5-2.7 s of CPU in a first
call). `BlockedLoop` runs the same NumPy calls over blocks of about `BLOCK` elements
along the loop's first axis, each op writing into a buffer reused by every block (and by
later ops once its value is dead), so a block's values stay in the L2 cache. Ops that read
no blocked value run once, before the blocks. A reduction over the first axis gives one
partial result per block, and the partials are reduced the same way at the end (NumPy's
pairwise sum within a block, then over the blocks' sums): the order differs from the
whole-array sum's, within the tolerance tests/test_tiers.py states for the tiers.

A loop is blocked only where each value's first axis is either the loop's first axis or
absent (broadcast): loops whose values the first axis does not map onto plainly (a row
pick, a random op whose values depend on the flat index, a reshape across the first axis,
a value reduced over the first axis that the loop reads again with blocked values) run
whole. Values made only of such reductions (and whole values) are made after the blocks.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.compiler.fusion import REDUCTIONS, Loop, row_drop
from fastgrad.runtime.numpy_reductions import tier_impl
from fastgrad.runtime.thread_budget import numba_threads

# Elements per block: 2^15 float64 values are 256 KB, so the few live at once stay in L2.
# W1's loop (10^7 float64, 39 ops) in a fresh process, CPU time of its one run: 2.5-2.7 s
# whole; blocks of 2^14 0.50-0.56 s, 2^15 0.48-0.52 s, 2^16 0.57-0.78 s (2 runs each).
BLOCK = 1 << 15
# Blocks of a loop, at least, for half of them to run on a second thread: bench M3's
# first call (one loop of 93 ops over 10^6 float32, 31 blocks) spent 150 ms of CPU there,
# JAX's whole first call ~140 ms of wall time.
TWO_THREADS = 8

# Kinds of value: read whole (INVARIANT), one block at a time (BLOCKED), a reduction
# over the first axis made of one partial result per block (PARTIAL), or made whole after
# the blocks from such reductions (AFTER: M4's gradient of its (8, 2) means, a sum over
# 10^6 rows times a constant, had kept its (10^6, 8, 2) loop whole: 0.25-0.5 s of CPU).
INVARIANT, BLOCKED, PARTIAL, AFTER = 0, 1, 2, 3
_COMBINE: dict[str, Callable[..., Any]] = {
    "sum": np.sum,
    "max": np.max,
    "min": np.min,
    "prod": np.prod,
}


class _Unblockable(Exception):
    """The loop's values do not all map onto blocks of its first axis."""


class BlockedLoop:
    """One fused loop run block by block (see the module's docstring)."""

    def __init__(self, loop: Loop, slot_of: Callable[[Any], int]):
        self.shape = loop.shape
        rank, first = len(loop.shape), loop.shape[0]
        reduced = loop.reduce_axes

        def spans(shape: tuple[int, ...]) -> bool:
            """Whether a value of `shape` has the loop's first axis as its own first."""
            if len(shape) == rank and shape[0] == first:
                return True
            # a row value of a reduction over later axes
            return bool(reduced) and 0 not in reduced and shape == row_drop(loop.shape, reduced)

        nodes = loop.nodes
        local = {id(node.out): i for i, node in enumerate(nodes)}
        kinds: list[int] = []
        # (impl, params, inputs as (is_slot, index, blocked), kind, name)
        self.ops: list[tuple[Any, dict[str, Any], list[tuple[bool, int, bool]], int, str]] = []
        for node in nodes:
            ins = []
            after = False  # reads a reduction over the first axis (or a value made of one)
            for v in node.inputs:
                if id(v) in local:
                    k = local[id(v)]
                    after = after or kinds[k] in (PARTIAL, AFTER)
                    ins.append((False, k, kinds[k] == BLOCKED))
                else:
                    ins.append((True, slot_of(v), spans(v.aval.shape)))
            if after and any(b for _, _, b in ins):
                raise _Unblockable  # read with blocks before all blocks have reduced it
            kind = AFTER if after else _kind_of(node, [b for _, _, b in ins], spans)
            kinds.append(kind)
            impl = tier_impl(node.op.name, node.op.impl)
            self.ops.append((impl, node.params, ins, kind, node.op.name))
        self.kinds = kinds
        self.rows = max(1, BLOCK // math.prod(loop.shape[1:]))
        self.ufuncs = [node.op.ufunc for node in nodes]
        self.dtypes = [node.out.aval.dtype for node in nodes]
        self.out_shapes = [node.out.aval.shape for node in nodes]
        self.outputs = [(local[id(v)], slot_of(v)) for v in loop.outputs]
        self.buffers = _share_buffers(loop, local, kinds, {k for k, _ in self.outputs})

    @classmethod
    def plan(cls, loop: Loop, slot_of: Callable[[Any], int]) -> BlockedLoop | None:
        """The blocked form of `loop`, or None where blocks would not pay (it fits in one
        block of `BLOCK` elements, or of one row where a row holds more) or its values do
        not map onto them."""
        shape = loop.shape
        if not shape or math.prod(shape) == 0:  # np.prod: ~3 us, per loop of a plan
            return None
        if max(1, BLOCK // math.prod(shape[1:])) >= shape[0]:
            return None  # one block would hold it all
        try:
            return cls(loop, slot_of)
        except _Unblockable:
            return None

    def run(self, env: list[Any], into: dict[int, np.ndarray] | None = None) -> None:
        """The loop over `env`; outputs computed a block at a time go into `into`'s array
        for their slot where it fits (the step's own buffer: see NumpyLoop.run)."""
        first, rows = self.shape[0], self.rows
        size = len(self.ops)
        values: list[Any] = [None] * size
        starts = range(0, first, rows)
        partials: list[list[Any]] = [[None] * len(starts) for _ in range(size)]
        full: dict[int, np.ndarray] = {
            k: _fitting((into or {}).get(slot), self.out_shapes[k], self.dtypes[k])
            for k, slot in self.outputs
            if self.kinds[k] == BLOCKED
        }
        with np.errstate(all="ignore"):  # as the kernels: inf and nan, never an exception
            for i, (impl, params, ins, kind, _) in enumerate(self.ops):
                if kind == INVARIANT:
                    args = [env[k] if is_slot else values[k] for is_slot, k, _ in ins]
                    values[i] = np.asarray(impl(*args, **params), dtype=self.dtypes[i])

        def blocks(which: range, errors: list[BaseException]) -> None:
            """Blocks `which` in order, with buffers and block values of their own."""
            mine, pool = list(values), {}  # (the invariant values shared, read only)
            try:
                with np.errstate(all="ignore"):
                    for b in which:
                        lo = starts[b]
                        hi = min(first, lo + rows)
                        for i, (_, _, ins, kind, _) in enumerate(self.ops):
                            if kind in (INVARIANT, AFTER):
                                continue
                            args = [
                                (env[k] if is_slot else mine[k])[lo:hi]
                                if blocked and is_slot
                                else (env[k] if is_slot else mine[k])
                                for is_slot, k, blocked in ins
                            ]
                            mine[i] = self._block_op(i, args, (lo, hi), full, pool)
                            if kind == PARTIAL:
                                partials[i][b] = mine[i]
            except BaseException as error:  # raised again on the calling thread
                errors.append(error)

        # Half the blocks on a second thread where the process may use two (NumPy's
        # loops let go of the GIL): each block is computed as alone and the partials are
        # combined in block order, so the bits do not depend on it.
        errors: list[BaseException] = []
        half = len(starts) // 2 if len(starts) >= TWO_THREADS and numba_threads() > 1 else 0
        helper = threading.Thread(target=blocks, args=(range(half, len(starts)), errors))
        if half:
            helper.start()
        blocks(range(half) if half else range(len(starts)), errors)
        if half:
            helper.join()
        if errors:
            raise errors[0]
        with np.errstate(all="ignore"):
            for i, (impl, params, ins, kind, name) in enumerate(self.ops):
                if kind == PARTIAL:
                    combined = _COMBINE[name](np.stack(partials[i]), axis=0)
                    values[i] = np.asarray(combined, self.dtypes[i])
                elif kind == AFTER:
                    args = [env[k] if is_slot else values[k] for is_slot, k, _ in ins]
                    values[i] = np.asarray(impl(*args, **params), dtype=self.dtypes[i])
        for k, slot in self.outputs:
            env[slot] = full[k] if self.kinds[k] == BLOCKED else values[k]

    def _block_op(
        self,
        i: int,
        args: list[Any],
        span: tuple[int, int],
        full: dict[int, np.ndarray],
        pool: dict[int, np.ndarray],
    ) -> Any:
        """Op `i` over the rows `span` of the first axis: into the loop's output, into a
        reused buffer, or fresh."""
        impl, params, _, kind, name = self.ops[i]
        lo, hi = span
        dtype, buffer = self.dtypes[i], self.buffers[i]
        if kind == BLOCKED and name in ("broadcast_to", "reshape"):
            params = {"shape": (hi - lo, *params["shape"][1:])}
        elif kind != BLOCKED or (buffer < 0 and i not in full):
            return np.asarray(impl(*args, **params), dtype=dtype)
        if i in full:
            out = full[i][lo:hi]
        elif buffer >= 0:
            if buffer not in pool:
                pool[buffer] = np.empty((self.rows, *self.out_shapes[i][1:]), dtype)
            out = pool[buffer][: hi - lo]
        else:
            return impl(*args, **params)  # a view of its operand, or fresh from a shape op
        if isinstance(impl, np.ufunc) and impl is self.ufuncs[i]:
            return impl(*args, out=out, casting="unsafe", **params)
        out[...] = impl(*args, **params)
        return out


def _fitting(buffer: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """`buffer` if an output of `shape` and `dtype` may be written into it as it is, else
    a fresh array."""
    if (
        buffer is not None
        and buffer.shape == shape
        and buffer.dtype == dtype
        and buffer.flags.c_contiguous
        and buffer.flags.writeable
    ):
        return buffer
    return np.empty(shape, dtype)


def _kind_of(node: Any, blocked: list[bool], spans: Callable[[tuple[int, ...]], bool]) -> int:
    """INVARIANT, BLOCKED or PARTIAL for `node`'s value, given which of its inputs are
    read a block at a time and which shapes have the loop's first axis first (`spans`);
    _Unblockable where its first axis is not the loop's."""
    name, out = node.op.name, node.out.aval.shape
    if node.op.extra.get("positional"):
        raise _Unblockable  # its values depend on the element's flat index
    if name in REDUCTIONS:
        if not blocked[0]:
            return INVARIANT
        return PARTIAL if 0 in node.params["axis"] else BLOCKED
    if name in ("broadcast_to", "reshape"):
        if not spans(out):
            if blocked[0]:
                raise _Unblockable
            return INVARIANT
        if name == "reshape" and not blocked[0]:
            raise _Unblockable  # folds the first axis in from elsewhere
        if name == "broadcast_to" and blocked[0] and len(node.inputs[0].aval.shape) != len(out):
            raise _Unblockable  # new leading axes would come before the first
        return BLOCKED
    if node.op.kind != "elementwise" or name == "const":
        raise _Unblockable
    if not any(blocked):
        return INVARIANT
    for v, b in zip(node.inputs, blocked, strict=True):
        if b and len(v.aval.shape) != len(out):
            raise _Unblockable  # broadcasting would align it with a later axis
        if not b and len(v.aval.shape) == len(out) and v.aval.shape[0] != 1:
            raise _Unblockable
    if not spans(out):
        raise _Unblockable
    return BLOCKED


def _share_buffers(
    loop: Loop, local: dict[int, int], kinds: list[int], outputs: set[int]
) -> list[int]:
    """A buffer index for each blocked value made by a ufunc (-1 for the others): a value
    read by ufuncs only gives its buffer back after its last reader, which may write into
    it (an exact overlap, which ufuncs allow), so a few buffers serve the whole loop."""
    nodes = loop.nodes
    ufunc = [isinstance(n.op.impl, np.ufunc) and n.op.impl is n.op.ufunc for n in nodes]
    last: dict[int, int] = {}
    readers_ufunc: dict[int, bool] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            k = local.get(id(v))
            if k is not None:
                last[k] = i
                readers_ufunc[k] = readers_ufunc.get(k, True) and ufunc[i]
    free: dict[tuple[Any, ...], list[int]] = {}
    buffers = [-1] * len(nodes)
    count = 0
    for i, node in enumerate(nodes):
        released = [
            k
            for k in {local[id(v)] for v in node.inputs if id(v) in local}
            if last[k] == i and buffers[k] >= 0 and readers_ufunc[k] and k not in outputs
        ]
        for k in released:
            free.setdefault(_buffer_key(nodes[k]), []).append(buffers[k])
        if kinds[i] != BLOCKED or not ufunc[i] or i in outputs:
            continue
        spare = free.get(_buffer_key(node))
        if spare:
            buffers[i] = spare.pop()
        else:
            buffers[i], count = count, count + 1
        if i not in last:  # never read: its buffer is free at once
            free.setdefault(_buffer_key(node), []).append(buffers[i])
    return buffers


def _buffer_key(node: Any) -> tuple[Any, ...]:
    return (node.out.aval.dtype.str, node.out.aval.shape[1:])
