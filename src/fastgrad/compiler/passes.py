"""Graph passes run before fusion: inline calls, erase stop_gradient, fold a broadcast of
a broadcast (or a reshape of a reshape) into one, merge duplicates (and scans another scan
repeats), drop dead nodes, give each elementwise reader of a broadcast constant or
argument a copy of its own (so it fuses where its reader does), and fold transposes of
transposes and of products (`fold_transposes`).

Differentiation is over by the time these run, so stop_gradient has done its work and is
the identity, and a custom_vjp call is just its forward graph. Common-subexpression
elimination matters after autodiff, which re-emits forward values (a `vjp` recomputes its
forward pass, a custom rule its residuals) and builds equal cotangent terms.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from fastgrad.core.config import config
from fastgrad.core.ir import Aval, Graph, Node, Var, live_nodes
from fastgrad.core.primitive import REGISTRY
from fastgrad.transforms.scan import merge_extended


def _param_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        # Constants are merged by value only when small; large ones by identity.
        if value.size <= 16:
            return ("array", value.dtype.str, value.shape, value.tobytes())
        return ("array-id", id(value))
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    return value


def inline_calls(graph: Graph) -> Graph:
    """Replace every node that stands for a subgraph (a custom_vjp call, whose op names it in
    `extra["inline"]`) by that subgraph's nodes, recursively; other nodes are kept as is."""
    if not any("inline" in node.op.extra for node in graph.nodes):
        return graph
    nodes: list[Node] = []

    def emit(node: Node, inputs: tuple[Var, ...], fresh: bool) -> Var:
        inline = node.op.extra.get("inline")
        if inline is None:
            # A subgraph may be inlined many times: each copy gets its own vars.
            out = Var(node.out.aval, node.out.hint) if fresh else node.out
            nodes.append(Node(node.op, inputs, node.params, out))
            return out
        sub, index = inline(node.params)
        local = {id(v): x for v, x in zip(sub.inputs, inputs, strict=True)}
        for inner in sub.nodes:
            local[id(inner.out)] = emit(inner, tuple(local[id(v)] for v in inner.inputs), True)
        return local[id(sub.outputs[index])]

    rename: dict[int, Var] = {}
    for node in graph.nodes:
        out = emit(node, tuple(rename.get(id(v), v) for v in node.inputs), False)
        if out is not node.out:
            rename[id(node.out)] = out
    return Graph(graph.inputs, nodes, [rename.get(id(v), v) for v in graph.outputs])


_CHAINED = ("broadcast_to", "reshape")


def simplify(graph: Graph) -> Graph:
    """Inline calls, erase stop_gradient, fold chained broadcasts and reshapes, merge
    structurally equal nodes, prune dead ones, copy broadcast constants and arguments per
    elementwise reader, fold transposes (`fold_transposes`)."""
    graph = inline_calls(graph)
    rename: dict[int, Var] = {}
    seen: dict[Any, Var] = {}
    nodes: list[Node] = []
    made_by: dict[int, Node] = {}
    for node in graph.nodes:
        inputs = tuple(rename.get(id(v), v) for v in node.inputs)
        if node.op.name == "stop_gradient":
            rename[id(node.out)] = inputs[0]
            continue
        inner = made_by.get(id(inputs[0])) if inputs else None
        if inner is not None and node.op.name in _CHAINED and inner.op.name == node.op.name:
            # broadcast_to(broadcast_to(x, a), b) is broadcast_to(x, b), and likewise for
            # reshape: one step, so that a value vmap broadcast twice (once for the
            # example, once for the batch) still fuses into the loop that reads it.
            inputs = inner.inputs
        if node.op.name == "reshape" and inputs[0].aval.shape == node.out.aval.shape:
            rename[id(node.out)] = inputs[0]
            continue
        if node.op.effect:  # each one runs, even when two look alike
            nodes.append(Node(node.op, inputs, node.params, node.out))
            continue
        key = (
            node.op.name,
            tuple(id(v) for v in inputs),
            tuple(sorted((k, _param_key(v)) for k, v in node.params.items())),
            node.out.aval,
        )
        if key in seen:
            rename[id(node.out)] = seen[key]
            continue
        seen[key] = node.out
        nodes.append(Node(node.op, inputs, node.params, node.out))
        made_by[id(node.out)] = nodes[-1]
    outputs = [rename.get(id(v), v) for v in graph.outputs]
    nodes = live_nodes(merge_extended(nodes), outputs)
    return fold_transposes(Graph(graph.inputs, broadcast_per_use(nodes, outputs), outputs))


def _swap(ndim: int) -> tuple[int, ...]:
    """The axes of a transpose that swaps the last two of `ndim` (a matrix's `.T`)."""
    return (*range(ndim - 2), ndim - 1, ndim - 2)


def fold_transposes(graph: Graph) -> Graph:
    """`graph` with each transpose of a transpose one transpose of the first one's input,
    or that input itself where the two undo each other, and each transpose swapping the
    last two axes of a product read nowhere else (both operands at least 2-D) the product
    of the operands so transposed, `(A @ B).T` as `B.T @ A.T` (an output stays a node:
    the identity transpose of the first one's input where the two undo each other);
    `graph` itself when it has none. Products take transposed operands as they are (BLAS
    transpose flags), but a transposed product is a strided array that a reshape copies.
    The VJP of `h @ w.T` reads `g @ w.T.T` and adds `(h.T @ g).T` to `w`'s gradient:
    folded, its product reads `w` itself and its kernel a product's own array `g.T @ h`,
    not transposed views (in a scan's body each iteration copied them: a host step, and
    no LOOP, runtime.loop_hoisting). Likewise attention's `q @ swapaxes(k)`: the gradient
    of k is `swapaxes(q.T @ ds)`, which its reshape to rows for the weight products
    copied (bench M2, 0.12 ms of f32 a call); folded it is `ds.T @ q`, written in k's
    layout."""
    folded = {id(n.out) for n in graph.nodes if n.op.name in ("transpose", "matmul")}
    if not any(n.op.name == "transpose" and id(n.inputs[0]) in folded for n in graph.nodes):
        return graph  # nothing to fold (one quick pass: the unrolled RNN at T=200 has 5,402)
    made: dict[int, Node] = {}
    rename: dict[int, Var] = {}
    nodes: list[Node] = []
    uses = Counter(id(v) for n in graph.nodes for v in n.inputs)
    uses.update(id(v) for v in graph.outputs)
    kept = {id(v) for v in graph.outputs}

    def transposed(v: Var) -> Var:
        inner = made.get(id(v))
        swap = _swap(v.aval.ndim)
        # not the identity transpose left where two that undo each other make an output
        if inner is not None and inner.op.name == "transpose":
            if tuple(inner.params["axes"]) == swap:
                return inner.inputs[0]
        shape = v.aval.shape
        out = Var(Aval((*shape[:-2], shape[-1], shape[-2]), v.aval.dtype))
        nodes.append(Node(REGISTRY["transpose"], [v], {"axes": swap}, out))
        made[id(out)] = nodes[-1]
        return out

    for node in graph.nodes:
        inputs = [rename.get(id(v), v) for v in node.inputs]
        inner = made.get(id(inputs[0])) if inputs else None
        if node.op.name == "transpose" and inner is not None and inner.op.name == "transpose":
            axes = tuple(inner.params["axes"][a] for a in node.params["axes"])
            if axes == tuple(range(len(axes))) and id(node.out) not in kept:
                rename[id(node.out)] = inner.inputs[0]
                continue
            node = Node(node.op, [inner.inputs[0]], {**node.params, "axes": axes}, node.out)
        elif (
            node.op.name == "transpose"
            and inner is not None
            and inner.op.name == "matmul"
            and uses[id(inner.out)] == 1
            and node.out.aval.ndim >= 2
            and tuple(node.params["axes"]) == _swap(node.out.aval.ndim)
            and all(v.aval.ndim >= 2 for v in inner.inputs)
        ):
            a, b = inner.inputs
            node = Node(inner.op, [transposed(b), transposed(a)], inner.params, node.out)
        elif any(a is not b for a, b in zip(inputs, node.inputs, strict=True)):
            node = Node(node.op, inputs, node.params, node.out)
        made[id(node.out)] = node
        nodes.append(node)
    if nodes == list(graph.nodes):  # the same nodes (Node compares by identity)
        return graph
    folded = Graph(graph.inputs, live_nodes(nodes, graph.outputs), graph.outputs)
    return folded.verify(types=config.check_graphs)  # (types: ~8 ms at T=200, as tracing)


def broadcast_per_use(nodes: list[Node], outputs: list[Var]) -> list[Node]:
    """Give each elementwise reader of a broadcast constant its own copy of the broadcast,
    just before it. Merged into one, the broadcast lands in the loop of its first reader,
    and the loops of all its other readers must then run after that one (the convexity
    rule of compiler.fusion): in a long unrolled program one loop gathered a term of every
    step's backward pass, so its source, and its compile time, grew with the trip count.
    A copy costs a load in its reader's loop. Broadcast arguments keep one node: copying
    them too split layer norm + GELU's gradient into one more loop (1.4x slower), and
    gained nothing measurable on the unrolled RNN."""
    free = {id(n.out) for n in nodes if n.op.name == "const"}
    shared = {
        id(n.out): n for n in nodes if n.op.name == "broadcast_to" and id(n.inputs[0]) in free
    }
    if not shared:
        return nodes
    out: list[Node] = []
    for node in nodes:
        if node.op.kind != "elementwise" or not any(id(v) in shared for v in node.inputs):
            out.append(node)
            continue
        copies: dict[int, Var] = {}  # `x * x` of a broadcast x reads one copy
        for v in node.inputs:
            made = shared.get(id(v))
            if made is not None and id(v) not in copies:
                copies[id(v)] = Var(v.aval, v.hint)
                out.append(Node(made.op, made.inputs, made.params, copies[id(v)]))
        reads = [copies.get(id(v), v) for v in node.inputs]
        out.append(Node(node.op, reads, node.params, node.out))
    return live_nodes(out, outputs)  # a broadcast that every reader copied is dead
