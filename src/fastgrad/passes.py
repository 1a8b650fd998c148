"""Graph passes run before fusion: erase stop_gradient, merge duplicates, drop dead nodes.

Differentiation is over by the time these run, so stop_gradient has done its work and is
the identity. Common-subexpression elimination matters after autodiff, which re-emits
forward values (a `vjp` recomputes its forward pass) and builds equal cotangent terms.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastgrad.ir import Graph, Node, Var, live_nodes


def _param_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        # Constants are merged by value only when small; large ones by identity.
        if value.size <= 16:
            return ("array", value.dtype.str, value.shape, value.tobytes())
        return ("array-id", id(value))
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    return value


def simplify(graph: Graph) -> Graph:
    """Erase stop_gradient, merge structurally equal nodes, and prune dead ones."""
    rename: dict[int, Var] = {}
    seen: dict[Any, Var] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        inputs = tuple(rename.get(id(v), v) for v in node.inputs)
        if node.op.name == "stop_gradient":
            rename[id(node.out)] = inputs[0]
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
    return Graph(graph.inputs, live_nodes(nodes, outputs), outputs)
