"""Fusion: partition a graph into fused loops and library calls.

A `Loop` runs over an iteration shape S. Its reductions all reduce the same axes R (the
"inner" axes; the others are "outer"), or reduce everything to a scalar. So each value in
a loop has a level:
  - "elem": shape S, computed inside the inner loops;
  - "row": S with the R axes reduced (kept as 1 or dropped), one value per outer index;
  - "scalar": a full reduction, or arithmetic on those, accumulated across the whole loop.
Elem values may read row values (a softmax divides by its row sum): the loop then makes
several passes over each row, recomputing elem values a later pass needs rather than
storing them. Scalars cannot feed back into the loop that makes them.

Convexity rule: a node joins a loop only if every input it takes from outside the loop is
produced by a step that runs before the loop. So no path leaves a loop and comes back into
it, and the steps stay in a valid order (pinned by test_fusion.py::test_convexity).

One indexing pattern fuses: picking one element per row, `z[arange(n), labels]` (a row
value read at column labels[i]), and its VJP, the scatter of a row value into that column
(an elem value: g[i] where j == labels[i], else 0). Everything else (matmul, other gathers,
slices, concatenation, general reshapes) is a `Call` of the op's NumPy implementation:
BLAS for matmul, views for reshape and transpose.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator

import numpy as np

from fastgrad.compiler.readonce import read_once
from fastgrad.compiler.row_loads import is_load, recomputed, store_rows_for
from fastgrad.compiler.steps import REDUCTIONS, Call, Loop, Step, row_drop, row_keep  # noqa: F401
from fastgrad.core.ir import Graph, Node, Var, consumers


def is_fusible(node: Node, constants: dict[int, np.ndarray]) -> bool:
    kind = node.op.kind
    return (
        (kind == "elementwise" and node.op.name != "const")
        or node.op.name in REDUCTIONS
        or node.op.name in ("broadcast_to", "reshape")
        or is_row_pick(node, constants)
    )


def is_row_pick(node: Node, constants: dict[int, np.ndarray]) -> bool:
    """`x[arange(n), labels]` on a 2-D x (gather), or its VJP (scatter_add)."""
    if node.op.name not in ("gather", "scatter_add") or len(node.inputs) != 3:
        return False
    if node.params["index"] != (("array", 0), ("array", 1)):
        return False
    full = node.inputs[0].aval.shape if node.op.name == "gather" else node.params["shape"]
    rows, cols = node.inputs[1], node.inputs[2]
    n = full[0] if len(full) == 2 else -1
    first = constants.get(id(rows))
    return (
        first is not None
        and first.shape == (n,)
        and bool(np.array_equal(first, np.arange(n)))
        and cols.aval.shape == (n,)
        and cols.aval.dtype.kind in "iu"
    )


def _placement(
    loop: Loop, node: Node, position_of: dict[int, int]
) -> tuple[str, tuple[int, ...]] | None:
    """(level, reduce axes) that `node` would have in `loop`, or None if it cannot join."""
    levels = [loop.level.get(id(v)) for v in node.inputs]
    for v, lv in zip(node.inputs, levels, strict=True):
        if lv is None and position_of.get(id(v), -1) > loop.position:
            return None  # the convexity rule
    out_shape = node.out.aval.shape
    name = node.op.name
    axes = loop.reduce_axes
    if name in ("gather", "scatter_add"):
        # A row pick: the loop must run over the full (n, k) array with the columns inner.
        full = node.inputs[0].aval.shape if name == "gather" else node.params["shape"]
        if loop.shape != full or levels[2] is not None:
            return None
        if axes != (1,) and (axes or loop.has_row_values()):
            return None
        source = levels[0] or (
            "elem" if name == "gather" and node.inputs[0].aval.shape == full else "row"
        )
        if (name == "gather") != (source == "elem"):
            return None
        return ("row" if name == "gather" else "elem"), (1,)
    if name in REDUCTIONS:
        x = node.inputs[0]
        reduced = node.params["axis"]
        # An input from outside is read at elem level: it must span the whole loop.
        lv = levels[0] or ("elem" if x.aval.shape == loop.shape else None)
        if not reduced:
            return (lv, axes) if lv and lv == loop.level_of_shape(out_shape) else None
        if lv == "elem":
            if len(reduced) == x.aval.ndim:
                return "scalar", axes
            if reduced == axes:
                return "row", axes
            if not axes and not loop.has_row_values():
                return "row", reduced
            return None
        if lv == "row" and len(reduced) == x.aval.ndim:
            return "scalar", axes
        return None
    if name == "broadcast_to":
        lv = levels[0]
        if lv is None:
            target = loop.level_of_shape(out_shape)
            return (target, axes) if target in ("elem", "row") else None
        if (
            lv == "row"
            and out_shape == loop.shape
            and node.inputs[0].aval.shape == loop.row_shapes()[0]
        ):
            return "elem", axes
        return None
    if name == "reshape":
        lv = levels[0]
        rows = loop.row_shapes()
        if lv == "row" and node.inputs[0].aval.shape in rows and out_shape in rows:
            return "row", axes
        return None
    if node.op.extra.get("positional"):
        # A random sample's value depends on its element's flat index: it joins a loop only
        # over exactly its shape, at elem level, reading its key and base from outside.
        if any(lv is not None for lv in levels) or out_shape != loop.shape:
            return None
        return "elem", axes
    # Elementwise: operands have the output's shape, so the level follows from it.
    internal = {lv for lv in levels if lv is not None}
    target = internal.pop() if len(internal) == 1 else None
    if len(internal) > 0:
        return None
    if target is None:
        target = loop.level_of_shape(out_shape)
    if target is None:
        return None
    if target == "elem" and out_shape != loop.shape:
        return None
    if target == "row" and out_shape not in loop.row_shapes():
        return None
    if target == "scalar" and out_shape != ():
        return None
    return target, axes


def _new_loop(node: Node, position: int) -> Loop:
    if node.op.name in REDUCTIONS or node.op.name == "gather":
        return Loop(node.inputs[0].aval.shape, position)
    if node.op.name == "scatter_add":
        return Loop(tuple(node.params["shape"]), position)
    return Loop(node.out.aval.shape, position)


def partition(graph: Graph) -> list[Step]:
    """Split `graph` (after passes.simplify) into loops and calls, in execution order."""
    steps: list[Step] = []
    constants = {id(n.out): n.params["value"] for n in graph.nodes if n.op.name == "const"}
    position_of: dict[int, int] = {}  # var id -> position of the step that makes it
    loops = _LoopIndex(steps)
    for node in graph.nodes:
        if node.op.name == "const":
            continue
        if not is_fusible(node, constants):
            steps.append(Call(node, len(steps)))
            position_of[id(node.out)] = len(steps) - 1
            continue
        chosen = None
        for loop in loops.candidates(node, position_of):
            placed = _placement(loop, node, position_of)
            if placed is not None:
                chosen = loop, placed
                break
        if chosen is None:
            loop = _new_loop(node, len(steps))
            placed = _placement(loop, node, position_of)
            if placed is None:  # e.g. a reshape that is not a unit-axis change
                steps.append(Call(node, len(steps)))
                position_of[id(node.out)] = len(steps) - 1
                continue
            steps.append(loop)
            loops.add(loop)
            chosen = loop, placed
        loop, (level, axes) = chosen
        if axes != loop.reduce_axes:
            loop.reduce_axes = axes
            loops.add_rows(loop)
        loop.nodes.append(node)
        loop.level[id(node.out)] = level
        position_of[id(node.out)] = loop.position
    _sink(graph, steps, position_of)
    _copy_cheap_outputs(graph, steps)
    return read_once(graph, [s for s in steps if not isinstance(s, Loop) or s.nodes])


class _LoopIndex:
    """The loops made so far, found by the shapes that let them take a node.

    A node tries its latest producer's loop first (vertical fusion), then the loops after
    it, latest first (siblings that read the same inputs). A loop before the latest
    producer's step cannot take it (the convexity rule: that producer is outside the loop
    and runs after it). A loop after it holds none of the node's inputs, and `_placement`
    then takes the node only into a loop whose shape is the node's output's or an input's
    (or the scatter's), or whose row shape is the output's, or any loop for an elementwise
    scalar. So only loops filed under those shapes are tried: the work per node does not
    grow with the length of the program."""

    def __init__(self, steps: list[Step]):
        self.steps = steps
        self.everywhere: list[int] = []  # positions of all loops, ascending
        self.by_shape: dict[tuple[int, ...], list[int]] = {}
        self.by_row: dict[tuple[int, ...], list[int]] = {}

    def add(self, loop: Loop) -> None:
        self.everywhere.append(loop.position)
        self.by_shape.setdefault(loop.shape, []).append(loop.position)
        self.add_rows(loop)

    def add_rows(self, loop: Loop) -> None:
        """File `loop` under its row shapes (its reduce axes are set, or have changed)."""
        for shape in loop.row_shapes():
            filed = self.by_row.setdefault(shape, [])
            at = bisect.bisect_left(filed, loop.position)
            if at == len(filed) or filed[at] != loop.position:
                filed.insert(at, loop.position)

    def candidates(self, node: Node, position_of: dict[int, int]) -> Iterator[Loop]:
        """The loops that may take `node`, in the order they are tried."""
        last = max((position_of.get(id(v), -1) for v in node.inputs), default=-1)
        if last >= 0 and isinstance(self.steps[last], Loop):
            yield self.steps[last]  # type: ignore[misc]
        out = node.out.aval.shape
        if out == () and node.op.kind == "elementwise":
            lists = [self.everywhere]
        else:
            shapes = {out, *(v.aval.shape for v in node.inputs)}
            if node.op.name == "scatter_add":
                shapes.add(tuple(node.params["shape"]))
            lists = [self.by_shape.get(shape, []) for shape in shapes]
            lists.append(self.by_row.get(out, []))
        after = [_latest_first(filed, last) for filed in lists if filed and filed[-1] > last]
        previous = None
        for position in heapq.merge(*after, reverse=True):
            if position != previous:
                previous = position
                yield self.steps[position]  # type: ignore[misc]


def _latest_first(positions: list[int], last: int) -> Iterator[int]:
    """The positions after `last` in an ascending list, latest first."""
    for i in range(len(positions) - 1, bisect.bisect_right(positions, last) - 1, -1):
        yield positions[i]


class _Graphs:
    """What sinking asks of the graph, computed once: each value's readers, the values
    returned, the one-element constants, and (kept up to date) the step making each value."""

    def __init__(self, graph: Graph, steps: list[Step]):
        self.users = consumers(graph)
        self.returned = {id(v) for v in graph.outputs}
        self.scalars = {
            id(n.out) for n in graph.nodes if n.op.name == "const" and n.params["value"].size == 1
        }
        self.step_of: dict[int, Step] = {}
        # Target position -> loops that could not sink into it only because it would read
        # one more array: looked at again when that loop reads more.
        self.blocked: dict[int, set[int]] = {}
        # Loop position -> the values it reads or makes (kept by `_connect`, `_prepend`).
        self.known: dict[int, set[int]] = {}
        self.stale: set[int] = set()  # loops whose inputs `_connect` must list again
        for step in steps:
            for n in step.nodes if isinstance(step, Loop) else [step.node]:
                self.step_of[id(n.out)] = step

    def loops_making(self, values: Iterable[Var]) -> Iterator[Loop]:
        for v in values:
            step = self.step_of.get(id(v))
            if isinstance(step, Loop):
                yield step


def _sink(graph: Graph, steps: list[Step], position_of: dict[int, int]) -> None:
    """Move cheap elementwise work that a loop stores only for one later loop into that
    loop, when this moves fewer bytes (the stored array is written and read once; the
    later loop then reads at most one array it did not read before). So a backward loop
    recomputes `1 - h*h` from `h` rather than reading it back from memory.

    One move at a time, always in the earliest loop that has one. A move changes what only
    a few loops see, so only those are looked at again (linear in the graph, not
    quadratic): the two loops, those making values the moved nodes read (their readers
    moved), and those that could not sink into the target only because of what it reads
    (it now reads more). The source loop reads less after the move, which makes no move
    into it possible that was not before."""
    facts = _Graphs(graph, steps)
    for step in steps:
        if isinstance(step, Loop):
            _connect(step, facts)
    waiting = [step.position for step in steps if isinstance(step, Loop)]  # sorted: a heap
    queued = set(waiting)
    while waiting:
        position = heapq.heappop(waiting)
        queued.discard(position)
        loop = steps[position]
        assert isinstance(loop, Loop)
        move = _sinkable(loop, facts)
        if move is None:
            continue
        cone, target = move
        changed = [loop, target]
        changed.extend(steps[p] for p in facts.blocked.pop(target.position, ()))  # type: ignore[misc]
        members = {id(n.out) for n in cone}
        order = {id(n.out): i for i, n in enumerate(loop.nodes)}
        cone.sort(key=lambda n: order[id(n.out)])
        loop.nodes = [n for n in loop.nodes if id(n.out) not in members]
        for n in cone:
            del loop.level[id(n.out)]
            target.level[id(n.out)] = "elem"
            position_of[id(n.out)] = target.position
            facts.step_of[id(n.out)] = target
        target.nodes[0:0] = cone
        _connect(loop, facts)
        _prepend(target, cone, facts)
        changed.extend(facts.loops_making(u for n in cone for u in n.inputs))
        for step in changed:
            if step.position not in queued:
                queued.add(step.position)
                heapq.heappush(waiting, step.position)
    for position in sorted(facts.stale):
        _connect(steps[position], facts)  # type: ignore[arg-type]


def _sinkable(loop: Loop, facts: _Graphs) -> tuple[list[Node], Loop] | None:
    """The first of `loop`'s outputs that can move into the one later loop reading it:
    the nodes to move (the output and what it alone needs from `loop`), and that loop."""
    users, step_of = facts.users, facts.step_of
    made_here = {id(n.out): n for n in loop.nodes}
    kept = {id(v) for v in loop.outputs}
    for v in loop.outputs:
        if id(v) in facts.returned or loop.level[id(v)] != "elem":
            continue
        if any(u.op.extra.get("positional") for u in users[id(v)]):
            continue  # a key is read from outside the loop that samples with it
        targets = {id(step_of[id(u.out)]): step_of[id(u.out)] for u in users[id(v)]}
        if len(targets) != 1:
            continue
        (target,) = targets.values()
        if not isinstance(target, Loop) or target.position <= loop.position:
            continue
        if target.shape != loop.shape:
            continue
        cone = _cheap_cone(made_here[id(v)], made_here, kept, target.shape)
        in_cone = {id(n.out) for n in cone}
        if not cone:
            continue
        if any(
            id(u.out) not in in_cone and step_of[id(u.out)] is not target
            for n in cone
            for u in users.get(id(n.out), [])
        ):
            continue
        reads = {id(u) for n in cone for u in n.inputs if id(u) not in in_cone}
        if len(reads - facts.known[target.position] - facts.scalars) > 1:
            facts.blocked.setdefault(target.position, set()).add(loop.position)
            continue
        return cone, target
    return None


def _connect(loop: Loop, facts: _Graphs) -> None:
    """Fill the loop's inputs (read from outside) and outputs (read outside, or returned)."""
    inside = {id(n.out) for n in loop.nodes}
    loop.inputs = []
    seen: set[int] = set()
    for node in loop.nodes:
        for v in node.inputs:
            if id(v) not in inside and id(v) not in seen:
                seen.add(id(v))
                loop.inputs.append(v)
    loop.outputs = [
        n.out
        for n in loop.nodes
        if id(n.out) in facts.returned
        or any(id(u.out) not in inside for u in facts.users.get(id(n.out), []))
    ]
    facts.known[loop.position] = inside | seen


def _prepend(loop: Loop, cone: list[Node], facts: _Graphs) -> None:
    """What sinking needs of `loop` after `cone` has been put at the front of its nodes, in
    time of the cone's size: the values it reads or makes, and its outputs. The cone reads
    no value of this loop (it comes from an earlier one), and its values are read only
    here (or returned): so the loop's outputs stay outputs, and the cone's are those
    returned. Its list of inputs is left for `_connect` when sinking is over."""
    facts.known[loop.position].update(id(v) for n in cone for v in (n.out, *n.inputs))
    loop.outputs = [n.out for n in cone if id(n.out) in facts.returned] + loop.outputs
    facts.stale.add(loop.position)


def _copy_cheap_outputs(graph: Graph, steps: list[Step]) -> None:
    """Give each later loop over the same shape that reads a loop's stored output its own
    copy of the cheap work making it (broadcast loads and cheap elementwise ops), where
    the copy reads fewer elements than the stored array: the loop then no longer stores
    it, and a loop left storing nothing is dropped. Sinking (`_sink`) moves work that one
    loop reads; this copies work that several loops read, or that the loop making it
    reads too: the mixture likelihood (bench M4) stored `x[:, None] - means` and
    `exp(-log_scales)` broadcast to (N, 8, 2) for its backward loop, 64 MB each in
    float32 at N = 10^6, where recomputing them reads x once. Reads a target makes anyway
    are not counted."""
    users = consumers(graph)
    returned = {id(v) for v in graph.outputs}
    step_of = {id(n.out): s for s in steps for n in (s.nodes if isinstance(s, Loop) else [s.node])}
    changed: set[int] = set()
    for loop in [s for s in steps if isinstance(s, Loop)]:
        made_here = {id(n.out): n for n in loop.nodes}
        for v in list(loop.outputs):
            targets = _later_readers(loop, v, users, step_of, returned)
            if targets is None:
                continue
            stop = {id(u) for u in loop.outputs if u is not v}  # read back, not recomputed
            cone = _cheap_cone(made_here[id(v)], made_here, stop, loop.shape)
            if not cone or _new_reads(cone, targets, None) * 2 > v.aval.size:
                continue
            for target in targets:
                _paste(cone, v, target, users, step_of)
                changed.add(target.position)
            store_rows_for(loop.outputs, v, cone, made_here)
            changed.add(loop.position)
        _store_roots(loop, made_here, users, step_of, returned, changed)
        if not loop.outputs:
            loop.nodes = []  # nothing it makes is read any more
    for s in steps:
        if isinstance(s, Loop) and s.position in changed:
            inside = {id(n.out) for n in s.nodes}
            ins = {id(u): u for n in s.nodes for u in n.inputs if id(u) not in inside}
            s.inputs = list(ins.values())


def _later_readers(
    loop: Loop, v: Var, users: dict[int, list[Node]], step_of: dict[int, Step], returned: set[int]
) -> list[Loop] | None:
    """The loops reading elem output `v` (not returned), if all later, over loop's shape."""
    if id(v) in returned or loop.level[id(v)] != "elem":
        return None
    readers = [u for u in users[id(v)] if step_of[id(u.out)] is not loop]
    targets = list({id(step_of[id(u.out)]): step_of[id(u.out)] for u in readers}.values())
    if not all(
        isinstance(t, Loop) and t.position > loop.position and t.shape == loop.shape
        for t in targets
    ) or any(u.op.extra.get("positional") for u in readers):
        return None
    return targets  # type: ignore[return-value]


def _new_reads(cone: list[Node], targets: list[Loop], root: Var | None) -> int:
    """Elements `cone` reads that not all targets read anyway, `root` aside: a GELU's
    backward loop reads x, so its forward loop stores no 0.5 * x for it."""
    inside = {id(n.out) for n in cone}
    reads = {id(u): u for n in cone for u in n.inputs if id(u) not in inside and u is not root}
    known = [{id(u) for u in t.inputs} for t in targets]
    return sum(u.aval.size for k, u in reads.items() if any(k not in seen for seen in known))


def _store_roots(
    loop: Loop, made_here: dict[int, Node], users: dict[int, list[Node]],
    step_of: dict[int, Step], returned: set[int], changed: set[int],
) -> None:  # fmt: skip
    """Store one costly value for later loops to recompute two or more cheap functions of it
    they read (as `_copy_cheap_outputs` copies them): bench M2's GELU forward loop stored
    `1 + t` and `t * t` of t = tanh(...) for its backward loop, now t alone."""
    stored = {id(u) for u in loop.outputs}
    groups: dict[int, list[tuple[Var, list[Node], list[Loop]]]] = {}
    for v in loop.outputs:
        targets = _later_readers(loop, v, users, step_of, returned)
        if targets is None:
            continue
        roots: dict[int, Var] = {}
        cone = _cheap_cone(made_here[id(v)], made_here, stored - {id(v)}, loop.shape, roots)
        reread = any(id(u) in stored for n in cone for u in n.inputs)  # moved, maybe
        if len(roots) != 1 or not cone or reread:
            continue
        (root,) = roots.values()
        if loop.level.get(id(root)) != "elem":
            continue
        if _new_reads(cone, targets, root) * 2 <= v.aval.size:
            groups.setdefault(id(root), []).append((v, cone, targets))
    for key, moved in groups.items():
        if len(moved) < 2:
            continue
        for v, cone, targets in moved:
            for target in targets:
                _paste(cone, v, target, users, step_of)
                changed.add(target.position)
            store_rows_for(loop.outputs, v, cone, made_here)
        loop.outputs.append(made_here[key].out)
        changed.add(loop.position)


def _cheap_cone(
    node: Node, made_here: dict[int, Node], stop: set[int], shape: tuple[int, ...],
    roots: dict[int, Var] | None = None,
) -> list[Node]:  # fmt: skip
    """`node` and what it needs of its loop, in order, when all of it is broadcast loads (row
    values too: row_loads) and cheap elementwise ops over `shape` (stopping at the loop's other
    stored outputs, `stop`); else []. With `roots`, a costly value over `shape` is a stop too."""
    cone: dict[int, Node] = {}
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n.out) in cone:
            continue
        load = is_load(n, made_here, shape)
        cheap = n.op.kind == "elementwise" and not (n.op.loop or "").startswith("call:")
        costly = not (load or cheap) or n.out.aval.shape != shape
        if costly and roots is not None and n is not node and n.out.aval.shape == shape:
            roots[id(n.out)] = n.out  # stored, not recomputed
            continue
        if costly:
            return []
        cone[id(n.out)] = n
        stack.extend(m for m in recomputed(n, made_here, shape) if id(m.out) not in stop)
    order = {id(n.out): i for i, n in enumerate(made_here.values())}
    return sorted(cone.values(), key=lambda n: order[id(n.out)])


def _paste(
    cone: list[Node], v: Var, target: Loop, users: dict[int, list[Node]], step_of: dict[int, Step]
) -> None:
    """Put a copy of `cone` (which makes `v`) at the front of `target`, and make the target's
    readers of `v` read the copy (`users` and `step_of` kept up to date). A reader in `users`
    stands for its op and its output, which the rewritten reader keeps: the lists of the
    values it reads stay as they are (rewriting them per paste was quadratic in a program
    whose every step reads one constant)."""
    fresh: dict[int, Var] = {}
    copies = []
    for n in cone:
        out = fresh[id(n.out)] = Var(n.out.aval, n.out.hint)
        copies.append(Node(n.op, [fresh.get(id(u), u) for u in n.inputs], n.params, out))
        target.level[id(out)] = "elem"
        step_of[id(out)] = target
    for k, n in enumerate(target.nodes):
        if any(u is v for u in n.inputs):
            target.nodes[k] = Node(n.op, [fresh.get(id(u), u) for u in n.inputs], n.params, n.out)
    for c in copies:
        for u in c.inputs:
            users.setdefault(id(u), []).append(c)
    target.nodes[0:0] = copies
