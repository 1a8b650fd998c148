"""Buffers for a plan's values: one block of preallocated intermediates per arena (buffers
whose lifetimes within a call do not meet share memory), and fresh outputs, both laid out
so that neighbouring large buffers start at different offsets modulo 4 KiB.

Loads and stores whose addresses agree in their low 12 bits look alike to the CPU's
store-to-load check ("4K aliasing"): a loop streaming through such arrays ran 3-6x slower
here (a 2^20-element loop: 45 ms against 8 ms with the buffers staggered by 320 bytes).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np

from fastgrad.core.collector import no_full_collections
from fastgrad.core.config import config
from fastgrad.runtime import recycling

# Every buffer starts on a cache line; successive large ones are pushed a few lines further
# apart, so that a loop reading and writing a dozen of them finds them all at different
# offsets within a page.
ALIGN = 64
STAGGER = 320
PAGE = 4096


def staggered_empty(
    shape: tuple[int, ...], dtype: np.dtype, k: int, take: Callable[[int], np.ndarray] | None = None
) -> np.ndarray:
    """A fresh array for the `k`-th output of a loop, starting `(k + 1) * 320` bytes (modulo
    4 KiB) past a page boundary, where NumPy's large allocations sit. Fresh: it shares
    memory with nothing anyone holds (a large one may be memory an earlier call's output
    had, which nobody holds any more: runtime.recycling; or from `take`, another pool's).

    >>> a = staggered_empty((1000,), np.dtype(np.float64), 0)
    >>> a.ctypes.data % 64, a.shape
    (0, (1000,))
    """
    nbytes = math.prod(shape) * dtype.itemsize  # np.prod costs ~4 us, a third of a small call
    if nbytes < PAGE:
        return np.empty(shape, dtype)
    raw = (take or recycling.take)(nbytes + PAGE + ALIGN)  # large: memory nobody holds
    address = raw.ctypes.data
    start = -address % ALIGN + ((k + 1) * STAGGER - (address + -address % ALIGN)) % PAGE
    return raw[start : start + nbytes].view(dtype).reshape(shape)


@dataclass
class Buffer:
    """A preallocated intermediate: kept in `slot` in the kernel's shape, and in `view_slot`
    in the graph's shape (the same slot when they agree)."""

    slot: int
    shape: tuple[int, ...]
    dtype: np.dtype
    view_slot: int
    view_shape: tuple[int, ...]
    # The steps that write it and last read it (directly or through a view): outside
    # that span its memory may hold another buffer.
    first: int = 0
    last: int = 1 << 62

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def plan_offsets(spans: Sequence[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Byte offsets for buffers given as (size, first step, last step), in order of their
    first step: each goes in the lowest gap left by buffers still live at its first
    step, so buffers whose spans do not meet share memory. Large buffers are followed by
    a few spare cache lines (STAGGER), so neighbours start at different page offsets.
    Returns the offsets and the total size.

    >>> plan_offsets([(4096, 0, 1), (4096, 1, 2), (4096, 2, 3)])
    ([0, 4416, 0], 8832)
    """
    # The free gaps below `top` (the end of the highest live buffer), sorted and never
    # touching one another, and a heap of when each live buffer dies: a buffer looks at
    # the gaps alone, not at every live buffer (T=200 RNN, 1995 buffers, ~1000 live at
    # once: 150 ms of CPU on the loaded machine scanning live buffers, a few ms now).
    gaps: list[tuple[int, int]] = []  # (start, end)
    top = 0
    deaths: list[tuple[int, int, int]] = []  # heap of (last step, offset, extent)
    offsets = []
    total = 0
    for nbytes, first, last in spans:
        extent = nbytes + (STAGGER if nbytes >= PAGE else 0)
        extent += -extent % ALIGN
        while deaths and deaths[0][0] < first:
            _, start, size = heapq.heappop(deaths)
            top = _free(gaps, top, start, start + size)
        for k, (start, end) in enumerate(gaps):
            if end - start >= extent:
                offset = start
                if end - start == extent:
                    del gaps[k]
                else:
                    gaps[k] = (start + extent, end)
                break
        else:
            offset, top = top, top + extent
        heapq.heappush(deaths, (last, offset, extent))
        offsets.append(offset)
        total = max(total, offset + extent)
    return offsets, total


def _free(gaps: list[tuple[int, int]], top: int, start: int, end: int) -> int:
    """Return [start, end) to `gaps`, merged with the gaps it touches; the new top."""
    if end == top:  # the highest buffer: the space above the next one is all free
        if gaps and gaps[-1][1] == start:
            start = gaps.pop()[0]
        return start
    k = bisect.bisect_left(gaps, (start,))
    if k < len(gaps) and gaps[k][0] == end:
        end = gaps.pop(k)[1]
    if k and gaps[k - 1][1] == start:
        start = gaps[k - 1][0]
        gaps[k - 1] = (start, end)
    else:
        gaps.insert(k, (start, end))
    return top


class Step(Protocol):
    """A plan step: runs on the slots of `env`; `prepare` binds it to one arena's slots."""

    def run(self, env: list[Any]) -> None: ...


#: (steps, their prepared calls, env holding a run's values, static slots, output slots,
#: whether to wait for what it compiles) -> calls doing the same work, or something whose
#: `ready()` says when to ask again
Lowering = Callable[
    [Sequence[Any], Sequence[Callable[[], None]], list[Any], AbstractSet[int], Sequence[int], bool],
    Any,
]


class Arena:
    """The values of one call in flight: the slots (constants, preallocated buffers, and the
    views of them that never change, filled on the first run; the others filled by each
    call and emptied after it), and the steps bound to them.

    A step with a `prepare(env, static)` method gives a call with its fixed arguments
    bound once (a kernel's buffers, a matmul's operands); None while it is not settled
    (its kernel still compiling), and then it runs step by step until it is. Once all
    are settled, `lower` (runtime.plan_table) makes the calls fewer at the end of a run,
    from the values that run left in the slots; `waits` makes it wait for what it
    compiles rather than keep the calls meanwhile.
    """

    def __init__(
        self,
        template: list[Any],
        buffers: Sequence[Buffer],
        static_views: Sequence[Step],
        steps: Sequence[Step],
        outputs: Sequence[int],
        static: AbstractSet[int],
        lower: Lowering | None = None,
        copied: Sequence[int] = (),
    ):
        self.lower = lower  # makes settled steps' calls fewer (runtime.plan_table)
        # Outputs that are constants (or views of one): copied at each call, as what the
        # caller receives is always fresh (a caller writing into one changed later calls).
        self.copied = list(copied)
        self.buffers = list(buffers)
        self.static_views = list(static_views)
        self.steps = list(steps)
        self.outputs = list(outputs)
        self.static = frozenset(static)
        self.base = template
        # Slots a call fills, emptied after it so the arena keeps no caller's array alive.
        self.dynamic = [k for k in range(len(template)) if k not in self.static]
        self.env: list[Any] | None = None  # filled on first run
        self.calls: list[Callable[[], None]] = []
        self.unsettled: list[int] | None = None  # steps whose `prepare` gave None
        self.settled = False
        self.lowering = False  # settled, and `lower` has not replaced the calls yet
        self.lower_when: Any = None  # what lowering waits for (its `ready()`), or None
        self.waits = False
        # Every call is one into the interpreter (a Segment of runtime.plan_table), which
        # computes nothing with NumPy: Executable.__call__ skips NumPy's errstate.
        self.bare = False
        # Where each buffer starts in the block, and the block's size (`layout`).
        self.layout_offsets: tuple[list[int], int] | None = None

    def layout(self) -> tuple[list[int], int]:
        """The buffers' offsets in one block (`plan_offsets`) and the block's size."""
        if self.layout_offsets is None:
            spans = [(b.nbytes, b.first, b.last) for b in self.buffers]
            self.layout_offsets = plan_offsets(spans)
        return self.layout_offsets

    def _fill(self) -> list[Any]:
        env = list(self.base)
        buffers = self.buffers
        offsets, end = self.layout()
        block = np.empty(end + ALIGN, np.uint8)
        shift = -block.ctypes.data % ALIGN
        for b, start in zip(buffers, offsets, strict=True):
            # One constructor call per buffer, not a slice, a view and a reshape (~2,000
            # buffers in the T=200 RNN's arena).
            array = np.ndarray(b.shape, b.dtype, block, shift + start)
            env[b.slot] = array
            if b.view_slot != b.slot:
                env[b.view_slot] = array.reshape(b.view_shape)
        for step in self.static_views:
            step.run(env)
        return env

    def _prepare(self, env: list[Any]) -> None:
        """Bind each step's call; after the first time, only those of the steps that were
        not settled then (a step once prepared stays so): rebinding all 2,600 steps of
        the T=200 RNN after each run until its kernels were ready cost ~20-50 ms a run."""
        first = self.unsettled is None
        indices = range(len(self.steps)) if self.unsettled is None else self.unsettled
        calls: list[Callable[[], None]] = [] if first else self.calls
        steps, static = self.steps, self.static
        unsettled = []
        later = self.lower_when is _NOT_YET  # (a first call: see `binds_later`)
        for k in indices:
            step = steps[k]
            prepare = getattr(step, "prepare", None)
            if later and getattr(step, "binds_later", False):
                prepare = _later  # (run step by step, bound at the next call's end)
            call = prepare(env, static) if prepare is not None else None
            if call is None and prepare is not None:
                unsettled.append(k)
            if first:  # a call per step: its prepared one, else step by step
                calls.append(partial(step.run, env) if call is None else call)
            elif call is not None:
                calls[k] = call
        self.calls = calls
        self.unsettled = unsettled
        self.settled = not unsettled
        self.lowering = self.settled and self.lower is not None

    def _lower(self, env: list[Any]) -> None:
        """Replace the calls by `lower`'s, built from the values of the run just made."""
        assert self.lower is not None
        if self.lower_when is not None and not self.lower_when.ready():
            return
        lowered = self.lower(self.steps, self.calls, env, self.static, self.outputs, self.waits)
        if isinstance(lowered, list):
            self.calls, self.lowering, self.lower_when = lowered, False, None
            self.bare = all(getattr(call, "interpreted", False) for call in lowered)
        else:
            self.lower_when = lowered

    def fresh(self, once: bool = False) -> Arena:
        """An arena with buffers of its own, for calls that run alongside this one's (for
        one call: `once`, which lowering would not pay back)."""
        arena = Arena(
            self.base,
            self.buffers,
            self.static_views,
            self.steps,
            self.outputs,
            self.static,
            None if once else self.lower,
            self.copied,
        )
        arena.waits = self.waits
        arena.layout_offsets = self.layout_offsets
        return arena

    def run(self, args: Sequence[Any]) -> list[Any]:
        if self.env is None:
            # The first run builds what the plan keeps (buffers, bound calls, the compile
            # thread's jobs): preparation, where the collector makes no full collection
            # (core.collector; ~60 ms of a warm T=200 RNN's first call walked the objects
            # preparing it had just made).
            with no_full_collections():
                self.env = self._fill()
                # Steps that settle in this call (runtime.native_plan) are lowered at the
                # next one: a first call does not pay for lowering as well, nor for
                # binding the steps whose bound calls only later calls use.
                if not self.waits and config.compile != "sync":
                    self.lower_when = _NOT_YET
                self._prepare(self.env)
                try:
                    return self._run(self.env, args)
                finally:
                    if self.lower_when is _NOT_YET:
                        self.lower_when = None
        return self._run(self.env, args)

    def _run(self, env: list[Any], args: Sequence[Any]) -> list[Any]:
        env[: len(args)] = args
        done = False
        try:  # under the errstate of Executable.__call__ (or of the loop running this body)
            for call in self.calls:
                call()
            done = True
            outs = [env[i] for i in self.outputs]
            for k in self.copied:
                outs[k] = np.array(outs[k], copy=True)
            return outs
        finally:
            if not self.settled:
                self._prepare(env)
            if done and self.lowering:  # env holds this run's values: their layouts
                self._lower(env)
            for slot in self.dynamic:
                env[slot] = None


class _NotYet:
    """What lowering waits for in an arena's first run: the next run."""

    def ready(self) -> bool:
        return False


_NOT_YET = _NotYet()


def _later(env: list[Any], static: AbstractSet[int]) -> None:
    """The `prepare` of a step that `binds_later` in a first call: not bound (None).

    Such a step (runtime.matmul's: binding the T=200 RNN's 999 products took ~5-10 ms of
    its warm first call, ctypes' conversions for the 198 that accumulate among them)
    runs by its `run` in the first call, where binding would cost as much as it saves,
    and is bound at the end of the next call, with the kernel steps settling then: the
    arena is lowered there as before (runtime.native_plan) or runs the bound calls."""
    return None
