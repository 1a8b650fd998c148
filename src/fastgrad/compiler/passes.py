"""Graph passes run before fusion: inline calls, erase stop_gradient, merge duplicates (and
scans another scan repeats), drop dead nodes.

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


def simplify(graph: Graph) -> Graph:
    """Inline calls, erase stop_gradient, merge structurally equal nodes, prune dead ones."""
    graph = inline_calls(graph)
    rename: dict[int, Var] = {}
    seen: dict[Any, Var] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        inputs = tuple(rename.get(id(v), v) for v in node.inputs)
        if node.op.name == "stop_gradient":
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
    outputs = [rename.get(id(v), v) for v in graph.outputs]
    return Graph(graph.inputs, live_nodes(merge_extended(nodes), outputs), outputs)
