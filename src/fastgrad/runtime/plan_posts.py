"""Which of a plan's products the interpreter hands to the product cut's worker without
waiting, and where it waits for them (runtime.vm's POST and JOIN rows).

The plan interpreter runs a call's serial kernels (softmax, layer norm, GELU and their
backward passes, small products) on the calling thread; the worker of runtime.gemm_split
helps only with big products, and sleeps meanwhile. A big product whose result is not
read at once (a weight's gradient, which nothing reads until the call returns) can run
on the worker while this thread goes on: its GEMM row becomes a POST row, and a JOIN row
waits for it just before the first row that reads what it writes or writes what it
reads, or that may touch anything (a loop, a library call's row), else at the segment's
end. The worker computes it exactly as the caller would (one gemm call, whole): the
results keep the step runner's bits.

Whether two rows touch the same bytes is decided here, when the table is laid out, from
the slots each row reads and writes (`Effect`) and the values the lowering run left in
them: a buffer or constant of the arena (and views of it) lives at a fixed address, so
its bytes are known; an array a segment allocates at each call shares no byte with
anything but views of it; an argument (or a view of one) shares none with the arena's
buffers; anything else read from outside the segment may be anywhere. The arena keeps a
product's operands alive until the first step that reads what it writes
(runtime.executable._posted_until), so that the steps between do not write there.

A product is posted only where the work the caller has before the join is at least
about half the product's (else cutting it into bands, or pairing it with the next, is
faster), and one at a time (the cut's state holds one job).
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from fastgrad.runtime.vm_rows import GEMM, JOIN, POST

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # NumPy 1.x
    from numpy import byte_bounds  # type: ignore[attr-defined,no-redef]

# A kernel's work, in a product's multiply-adds, per element it reads or writes: the
# serial kernels of bench M2 (layer norm, softmax, GELU; float32, 2-core machine) take
# some 0.5-2 ns an element where one core's gemm does 30-60 multiply-adds a ns.
KERNEL_COST = 32
# A product is posted where the caller's work before its join is this share of its own.
LEAST_SHARE = 0.5


@dataclass
class Effect:
    """The slots a row reads and writes, and its work (multiply-adds, or KERNEL_COST per
    element of a kernel's operands)."""

    reads: list[int]
    writes: list[int]
    work: int


def place(table: Any, segments: Sequence[Any], private: AbstractSet[int]) -> None:
    """Make the GEMM rows worth posting POST rows and add JOIN rows (each segment's
    steps' starts, its first and count, and those of the segments after it, moved)."""
    shift = 0
    for segment in segments:
        segment.first += shift
        lo, count = segment.first, segment.count
        memory = _Memory(table, segment, private)
        order = _segment(table, table.starts[lo : lo + count], memory)
        table.starts[lo : lo + count] = order
        segment.count = len(order)
        shift += len(order) - count


def _segment(table: Any, order: list[int], memory: _Memory) -> list[int]:
    """The segment's rows (their starts in `table.code`) with posted products and the
    JOIN rows that wait for them."""
    code, effects = table.code, table.effects
    order = list(order)
    joins: set[int] = set()
    free, posted = 0, -1  # the last product posted, and where it is waited for
    for i in range(len(order)):
        if not _big(code, order[i]):
            continue
        if i < free:  # one is outstanding: wait for it here if it had its share of work
            if _between(order, posted, i, effects) < LEAST_SHARE * effects[order[posted]].work:
                continue  # (this one runs whole: the cut's state holds one job)
            joins.discard(free)
            joins.add(i)
            free = i
        end = _join(order, i, effects, memory)
        if i + 1 < end and _big(code, order[i + 1]):  # a pair: post the one read later
            order[i], order[i + 1] = order[i + 1], order[i]
            other = _join(order, i, effects, memory)
            if other > end:
                end = other
            else:
                order[i], order[i + 1] = order[i + 1], order[i]
        if _between(order, i, end, effects) < LEAST_SHARE * effects[order[i]].work:
            continue
        code[order[i]] = POST
        if end < len(order):
            joins.add(end)
        free, posted = end, i
    out: list[int] = []
    for i, start in enumerate(order):
        if i in joins:
            out.append(_row(table, [JOIN]))
        out.append(start)
    return out


def _between(order: list[int], i: int, end: int, effects: dict[int, Effect | None]) -> int:
    """The work of the rows after row i, before row `end`."""
    return sum(work.work for k in range(i + 1, end) if (work := effects[order[k]]) is not None)


def _big(code: list[int], start: int) -> bool:
    """Whether the row at `start` is a product the worker may take (its `split` set)."""
    return code[start] == GEMM and code[start + 3] >= 0


def _row(table: Any, row: list[int]) -> int:
    """Append `row` to the table's code (not to its steps' order); where it starts."""
    start = len(table.code)
    table.code += row
    table.effects[start] = None
    return start


def _join(order: list[int], i: int, effects: dict[int, Effect | None], memory: _Memory) -> int:
    """The place of the first row after row i that must wait for it (len(order): none)."""
    posted = effects[order[i]]
    assert posted is not None
    touched = [*posted.reads, *posted.writes]
    for k in range(i + 1, len(order)):
        later = effects[order[k]]
        if later is None:
            return k
        if any(memory.overlap(w, t) for w in later.writes for t in touched) or any(
            memory.overlap(r, w) for r in later.reads for w in posted.writes
        ):
            return k
    return len(order)


class _Memory:
    """Where a segment's slots may be, as far as the lowering run says (module doc)."""

    def __init__(self, table: Any, segment: Any, private: AbstractSet[int]) -> None:
        self.env, self.static, self.private = table.env, table.static, private
        self.views = segment.views
        self.fresh = {entry[4] for entry in segment.fresh}
        self.places: dict[int, tuple[Any, ...]] = {}

    def place(self, slot: int) -> tuple[Any, ...]:
        """("fresh", root slot), ("static", first byte, end byte), ("private", slot) or
        ("outside", slot)."""
        if slot not in self.places:
            root = slot
            while root in self.views:  # a view: its input's memory
                root = self.views[root][0]
            value = self.env[root]
            if root in self.fresh:
                place: tuple[Any, ...] = ("fresh", root)
            elif root in self.static and hasattr(value, "__array_interface__"):
                place = ("static", *byte_bounds(value))  # [first, end)
            else:
                place = ("private" if root in self.private else "outside", root)
            self.places[slot] = place
        return self.places[slot]

    def overlap(self, one: int, other: int) -> bool:
        """Whether slots `one` and `other` may share a byte in a call."""
        a, b = self.place(one), self.place(other)
        if a[0] == "fresh" or b[0] == "fresh":
            return a == b
        if a[0] == "static" and b[0] == "static":
            return a[1] < b[2] and b[1] < a[2]
        return {a[0], b[0]} != {"static", "private"}
