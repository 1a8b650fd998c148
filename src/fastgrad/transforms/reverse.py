"""Reverse mode: turn a graph into one that also computes its vector-Jacobian product.

`vjp_graph` re-emits the forward nodes into a new trace, then walks them backwards applying
each primitive's VJP rule, which emits the backward nodes. Only "active" values get
cotangents: those that depend on a differentiated input by a path with no stop_gradient,
so nothing is built for what only a stop_gradient would have needed. A missing cotangent is
a symbolic zero (absent from the map), never a zero array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastgrad.core.interpreter import eval_nodes
from fastgrad.core.ir import Graph, Node, Var
from fastgrad.core.primitive import NoDerivative
from fastgrad.core.tracing import Trace, aval_of
from fastgrad.ops.base import astype
from fastgrad.ops.elementwise import STOP_GRADIENT
from fastgrad.ops.shape import zeros_like


def active_vars(graph: Graph, wrt: Sequence[Var]) -> set[int]:
    """Ids of the vars that carry a gradient from `wrt`: stop_gradient cuts the flow."""
    active = {id(v) for v in wrt}
    for node in graph.nodes:
        if (
            node.op.vjp is not None
            and node.op is not STOP_GRADIENT
            and node.out.aval.is_float
            and any(id(v) in active for v in node.inputs)
        ):
            active.add(id(node.out))
    return active


def _call_groups(graph: Graph) -> dict[int, tuple[Any, Node]]:
    """For nodes that are outputs of one multi-output call (ops with `extra["call_vjp"]`,
    params `call` and `index`, one node per output): id(node) -> (group key, first node)."""
    groups: dict[int, tuple[Any, Node]] = {}
    first: dict[Any, Node] = {}
    for node in graph.nodes:
        if "call_vjp" in node.op.extra:
            key = (id(node.params["call"]), tuple(id(v) for v in node.inputs))
            groups[id(node)] = (key, first.setdefault(key, node))
    return groups


def backpropagate(
    graph: Graph, env: dict[int, Any], seeds: dict[int, Any], wrt: Sequence[Var]
) -> list[Any]:
    """Cotangents of `wrt` (None where none flows), given cotangents `seeds` of outputs."""
    active = active_vars(graph, wrt)
    cts = {k: g for k, g in seeds.items() if k in active}
    # A multi-output call gets one VJP for all its outputs, run at the first of its nodes:
    # every node of the call, and every use of its outputs, comes after that one, so by
    # then all their cotangents are complete
    # (test_custom_vjp.py::test_a_call_with_several_outputs_runs_its_rule_once).
    groups = _call_groups(graph)
    pending: dict[Any, dict[int, Any]] = {}
    for node in reversed(graph.nodes):
        g = cts.pop(id(node.out), None)
        if id(node) in groups:
            key, head = groups[id(node)]
            if g is not None:
                gs = pending.setdefault(key, {})
                k = node.params["index"]
                gs[k] = g if k not in gs else gs[k] + g
            if node is not head or key not in pending:
                continue
            ins = [env[id(v)] for v in node.inputs]
            kw: dict[str, Any] = {"call": node.params["call"]}
            if node.op.extra.get("vjp_active"):  # a loop skips cotangents nothing reads
                kw["active"] = tuple(id(v) in active for v in node.inputs)
            grads = node.op.extra["call_vjp"](pending.pop(key), *ins, **kw)
        elif g is None:
            continue
        else:
            ins = [env[id(v)] for v in node.inputs]
            grads = node.op.vjp(g, env[id(node.out)], *ins, **node.params)  # type: ignore[misc]
        for v, gv in zip(node.inputs, grads, strict=True):
            if gv is None or id(v) not in active:
                continue
            if isinstance(gv, NoDerivative):
                raise gv.error()
            if aval_of(gv).shape != v.aval.shape:
                raise AssertionError(
                    f"VJP of {node.op.name} gave shape {aval_of(gv).shape} for an input of "
                    f"shape {v.aval.shape}"
                )
            cts[id(v)] = gv if id(v) not in cts else cts[id(v)] + gv
    return [cts.get(id(v)) for v in wrt]


def vjp_graph(graph: Graph, wrt: Sequence[int], seeds: Sequence[int]) -> Graph:
    """A graph that computes `graph`'s outputs and a vector-Jacobian product.

    Inputs: `graph.inputs`, then one cotangent for each output index in `seeds`.
    Outputs: `graph.outputs`, then the gradient of each input index in `wrt` (zeros where no
    gradient flows), with the input's dtype.
    """
    with Trace() as trace:
        ins = [trace.new_input(v.aval, v.hint) for v in graph.inputs]
        seed_tracers = [
            trace.new_input(graph.outputs[i].aval, f"ct_{graph.outputs[i].hint or 'out'}")
            for i in seeds
        ]
        env = eval_nodes(graph, ins)
        seed_map: dict[int, Any] = {}
        for i, ct in zip(seeds, seed_tracers, strict=True):
            key = id(graph.outputs[i])
            seed_map[key] = ct if key not in seed_map else seed_map[key] + ct
        wrt_vars = [graph.inputs[i] for i in wrt]
        grads = backpropagate(graph, env, seed_map, wrt_vars)
        results = []
        for v, g in zip(wrt_vars, grads, strict=True):
            if g is None:
                g = zeros_like(env[id(v)])
            results.append(astype(g, v.aval.dtype))
        outs = [env[id(v)] for v in graph.outputs] + results
    return trace.to_graph(outs)
