"""A row block's passes over its rows, laid out once written (codegen.rowblocks).

The block form writes each pass as its own loop over the block's rows, storing every row
value into the block's array and reading back, at the top of each later pass, every value
known so far (the reads no one uses vanish). Two things LLVM does not do for it, the
block's array being heap memory whose end it cannot see:
- merge a pass into the one before when nothing stands between them (a row's max, then
  its `where`; a row's sum over a short axis, then the values computed from it): one loop
  over the rows, the values kept in registers, a row's accumulator too;
- drop the stores of row values no later pass reads (a logsumexp's `log`, the values only
  its in-place last pass needed).
Each pass computes row r from row r's values only, in the same order: both keep every
bit. Only passes without a loop of their own or a vector-math call, and no wider values
than the pass before, are merged (`_folds`). M4's sum over the last axis of (1e6, 8, 2)
float32 took 0.86x the CPU time, its logsumexp loop level (0.99x; float64 level); one
process alternating, min of 80, load ~6. The generator tags the lines this reads (`Tag`);
the rest are left as written.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from fastgrad.compiler.codegen.math_names import BINARY_NAMES, DTYPES, NAMES

# A call of a vector-math helper (exp_f32(...)).
_MATH = re.compile(rf"\b({'|'.join(NAMES + BINARY_NAMES)})_({'|'.join(DTYPES.values())})\(")


class Tag(NamedTuple):
    """What a line of a block's body is: "head" (a pass's `for r in range(nr)`), "row" (its
    `i0 = rb + r`), "read" (value k read back from the block), "store" (value k stored
    into it), "acc" (row accumulator k stored from its register `racc{k}`) or "load"
    (value k taken from that accumulator's place `at`, in the block)."""

    kind: str
    k: int = -1
    size: int = 0  # the value's bytes
    at: str = ""


Line = tuple[str, Tag | None]


def lay_out(lines: list[str], tags: dict[int, Tag], offset: int) -> list[str]:
    """`lines` (the body from line `offset` of the kernel, `tags` by kernel line) with
    adjacent passes over the rows merged and dead stores dropped."""
    items: list[Line] = [(line, tags.get(offset + i)) for i, line in enumerate(lines)]
    items = _without_dead_stores(_merged(items))
    return [line for line, _ in items]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _passes(items: list[Line]) -> list[tuple[int, int]]:
    """(head, end) of each pass over the rows: its lines are items[head:end]."""
    spans = []
    for head, (line, tag) in enumerate(items):
        if tag is not None and tag.kind == "head":
            end = head + 1
            while end < len(items) and _indent(items[end][0]) > _indent(line):
                end += 1
            spans.append((head, end))
    return spans


def _merged(items: list[Line]) -> list[Line]:
    """Each pass that starts where the one before it ends, at the same depth, folded into
    it: its head and `i0` dropped, its reads of values the first pass already holds
    dropped, and a value taken from an accumulator the first pass stored taken from the
    register instead (the store then dropped)."""
    while True:
        spans = _passes(items)
        pairs = [
            (a, b)
            for a, b in zip(spans, spans[1:], strict=False)
            if b[0] == a[1]
            and _indent(items[a[0]][0]) == _indent(items[b[0]][0])
            and _folds(items[a[0] : a[1]], items[b[0] : b[1]])
        ]
        if not pairs:
            return items
        (h1, e1), (h2, e2) = pairs[0]
        first = items[h1:e1]
        held = {t.k for _, t in first if t is not None and t.kind in ("read", "store")}
        accs = {t.k: i for i, (_, t) in enumerate(first) if t is not None and t.kind == "acc"}
        handed: set[int] = set()
        second: list[Line] = []
        for line, t in items[h2 + 1 : e2]:
            if t is not None and (t.kind == "row" or t.kind == "read" and t.k in held):
                continue
            if t is not None and t.kind == "load" and t.k in accs:
                handed.add(accs[t.k])
                line, t = line.replace(t.at, f"racc{t.k}"), None
            second.append((line, t))
        first = [x for i, x in enumerate(first) if i not in handed]
        items = items[:h1] + first + second + items[e2:]


def _folds(first: list[Line], second: list[Line]) -> bool:
    """Whether pass `second` folds into `first`: one of them is plain (no loop of its own
    over the short axis, as a reduction's or an in-place pass's, and no vector-math call)
    and has no row value wider than the other's. LLVM picks a loop's vector width by its
    widest type: M4's float32 logsumexp with its float64 `where` folded into its exp-sum
    pass ran the exps on half the lanes (16 -> 21 ms of CPU); with its in-place last pass
    folded in, the float64 one, whose output that pass writes by a run-time stride, ran
    scalar (37 -> 85 ms); its float64 log folded into the exp-sum pass took 1.2x as long."""
    return (
        _plain(second)
        and _widest(second) <= _widest(first)
        or _plain(first)
        and _widest(first) <= _widest(second)
    )


def _plain(lines: list[Line]) -> bool:
    return not any(line.lstrip().startswith("for ") or _MATH.search(line) for line, _ in lines[1:])


def _widest(lines: list[Line]) -> int:
    """The bytes of the widest row value a pass computes or uses (it reads back every
    value known; those it does not use vanish)."""
    return max((t.size for line, t in lines if t is not None and _used(t, lines)), default=0)


def _used(tag: Tag, lines: list[Line]) -> bool:
    if tag.kind != "read":
        return True
    name = re.compile(rf"\bv{tag.k}\b")
    return any(name.search(line) for line, t in lines if t is not tag)


def _without_dead_stores(items: list[Line]) -> list[Line]:
    """The stores of row values no line after their pass names, by value or by place (but
    the value's own reads back), those reads, and passes left with nothing to do, dropped."""
    spans = _passes(items)
    dead: set[int] = set()
    for p, (_, tag) in enumerate(items):
        if tag is None or tag.kind != "store":
            continue
        end = next((e for h, e in spans if h < p < e), None)
        if end is None:
            continue
        # Its value or its place in the block (w{k}) named by any later line but its own
        # reads back keeps it: a line reading the block untagged is never left dangling.
        name = re.compile(rf"\b[vw]{tag.k}\b")
        if not any(
            name.search(line)
            for line, t in items[end:]
            if t is None or t.kind != "read" or t.k != tag.k
        ):
            dead.add(tag.k)
    items = [
        x for x in items if x[1] is None or x[1].kind not in ("store", "read") or x[1].k not in dead
    ]
    empty = set()
    for head, end in _passes(items):
        if all(t is not None and t.kind in ("row", "read") for _, t in items[head + 1 : end]):
            empty.update(range(head, end))
    return [x for i, x in enumerate(items) if i not in empty]
