"""Graph passes run before fusion: inline calls, erase stop_gradient, fold a broadcast of
a broadcast (or a reshape of a reshape) into one, merge duplicates (and scans another scan
repeats), drop dead nodes, and give each elementwise reader of a broadcast constant or
argument a copy of its own (so it fuses where its reader does).

Differentiation is over by the time these run, so stop_gradient has done its work and is
the identity, and a custom_vjp call is just its forward graph. Common-subexpression
elimination matters after autodiff, which re-emits forward values (a `vjp` recomputes its
forward pass, a custom rule its residuals) and builds equal cotangent terms.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastgrad.core.ir import Graph, Node, Var, live_nodes
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
    elementwise reader."""
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
    return Graph(graph.inputs, broadcast_per_use(nodes, outputs), outputs)


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
