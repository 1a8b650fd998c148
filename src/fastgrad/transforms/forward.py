"""Forward mode: turn a graph into one that also computes a Jacobian-vector product.

`jvp_graph` re-emits the forward nodes into a new trace and, after each one, applies its
primitive's JVP rule to the tangents of its inputs, which emits the tangent nodes next to
the primal ones (so an elementwise chain and its tangent fuse into one loop). Only values
that depend on an input tangent get one: a missing tangent is a symbolic zero (absent from
the map), never a zero array, and stop_gradient's rule gives none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastgrad.core.ir import Graph, Node
from fastgrad.core.tracing import CONST, Trace, Tracer, aval_of, bind
from fastgrad.ops.base import astype
from fastgrad.ops.shape import zeros_like


def push_tangents(
    graph: Graph, ins: Sequence[Any], tangents: dict[int, Any], trace: Trace
) -> tuple[dict[int, Any], dict[int, Any]]:
    """Emit `graph`'s nodes on `ins` into `trace`, each followed by its tangent.

    `tangents` maps ids of input vars to their tangents. Returns the value of every var
    and the tangent of every var that has one (both keyed by the var's id in `graph`).
    """
    env: dict[int, Any] = {id(v): x for v, x in zip(graph.inputs, ins, strict=True)}
    tenv = dict(tangents)
    # A multi-output call (custom_vjp: one node per output) gives all its tangents at once.
    calls: dict[Any, list[Any]] = {}
    for node in graph.nodes:
        if node.op is CONST:
            value = trace.const(node.params["value"], node.out.aval.weak)
            env[id(node.out)] = Tracer(trace, value)
            continue
        args = [env[id(v)] for v in node.inputs]
        out = bind(node.op, *args, **node.params)
        env[id(node.out)] = out
        ts = tuple(tenv.get(id(v)) for v in node.inputs)
        if all(t is None for t in ts) or not node.out.aval.is_float:
            continue
        if "call_jvp" in node.op.extra:
            key = (id(node.params["call"]), tuple(id(v) for v in node.inputs))
            if key not in calls:
                calls[key] = node.op.extra["call_jvp"](ts, *args, call=node.params["call"])
            t_out = _checked(node, calls[key][node.params["index"]])
        else:
            t_out = _apply_rule(node, ts, out, args)
        if t_out is not None:
            tenv[id(node.out)] = t_out
    return env, tenv


def _apply_rule(node: Node, ts: tuple[Any, ...], out: Any, args: list[Any]) -> Any:
    if node.op.jvp is None:
        if node.op.vjp is None:  # integer or boolean results: never differentiated
            return None
        raise NotImplementedError(
            f"forward mode: primitive {node.op.name} has a VJP rule but no JVP rule"
        )
    return _checked(node, node.op.jvp(ts, out, *args, **node.params))


def _checked(node: Node, t_out: Any) -> Any:
    if t_out is not None:
        got, want = aval_of(t_out), node.out.aval
        if got.shape != want.shape or got.dtype != want.dtype:
            raise AssertionError(
                f"JVP of {node.op.name} gave a tangent {got} for an output of type {want}"
            )
    return t_out


def jvp_graph(graph: Graph, wrt: Sequence[int], outputs: Sequence[int] | None = None) -> Graph:
    """A graph that computes `graph`'s outputs and a Jacobian-vector product.

    Inputs: `graph.inputs`, then one tangent (of the input's type) for each input index in
    `wrt`; the other inputs are held constant. Outputs: `graph.outputs`, then the tangent of
    each output index in `outputs` (default: all), with the output's dtype (zeros where no
    tangent flows).
    """
    wrt_vars = [graph.inputs[i] for i in wrt]
    out_vars = list(graph.outputs) if outputs is None else [graph.outputs[i] for i in outputs]
    with Trace() as trace:
        ins = [trace.new_input(v.aval, v.hint) for v in graph.inputs]
        tangent_ins = [trace.new_input(v.aval, f"d{v.hint or 'x'}") for v in wrt_vars]
        seeds: dict[int, Any] = {id(v): t for v, t in zip(wrt_vars, tangent_ins, strict=True)}
        env, tenv = push_tangents(graph, ins, seeds, trace)
        tangents_out = []
        for v in out_vars:
            t = tenv.get(id(v))
            if t is None:
                t = zeros_like(env[id(v)])
            tangents_out.append(astype(t, v.aval.dtype))
        outs = [env[id(v)] for v in graph.outputs] + tangents_out
    return trace.to_graph(outs)
