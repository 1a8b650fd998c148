"""Batching (vmap): turn a graph of one example into a graph of a batch of them.

`batch_graph` re-emits each node into a new trace. A node none of whose inputs carries the
batch is emitted as it is, computed once for the whole batch; otherwise its primitive's
batching rule (`Primitive.batch`, or `extra["call_batch"]` for a call with graphs in its
params) emits the batched form. A batched value always has the batch as its leading axis,
and an unbatched one is only broadcast when an op needs it batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastgrad.core.ir import Aval, Graph
from fastgrad.core.tracing import CONST, Trace, Tracer, aval_of, bind, current_trace
from fastgrad.ops.base import with_batch


def batch_values(
    graph: Graph, ins: Sequence[Any], batched: Sequence[bool], size: int
) -> tuple[dict[int, Any], set[int]]:
    """Emit `graph`'s nodes on `ins` into the current trace, batched where an input is.

    Returns the value of every var (keyed by its id in `graph`) and the ids of the vars
    whose values carry the batch (leading axis of `size`).
    """
    trace = current_trace()
    assert trace is not None, "batching emits into a trace"
    env: dict[int, Any] = {id(v): x for v, x in zip(graph.inputs, ins, strict=True)}
    has_batch = {id(v) for v, b in zip(graph.inputs, batched, strict=True) if b}
    calls: dict[Any, list[Any]] = {}  # a call with several outputs is batched once
    for node in graph.nodes:
        if node.op is CONST:
            env[id(node.out)] = Tracer(trace, trace.const(node.params["value"], node.out.aval.weak))
            continue
        args = [env[id(v)] for v in node.inputs]
        flags = tuple(id(v) in has_batch for v in node.inputs)
        if not any(flags):
            env[id(node.out)] = bind(node.op, *args, **node.params)
            continue
        if "call_batch" in node.op.extra:
            key = (id(node.params["call"]), tuple(id(v) for v in node.inputs))
            if key not in calls:
                calls[key] = node.op.extra["call_batch"](flags, *args, call=node.params["call"])
            out = calls[key][node.params["index"]]
        elif node.op.batch is None:
            raise NotImplementedError(
                f"vmap: primitive {node.op.name} has no batching rule, so a function that "
                "uses it cannot be vmapped; call it once per example instead"
            )
        else:
            out = node.op.batch(flags, *args, **node.params)
        env[id(node.out)] = out
        if node.op.effect:
            continue  # an effect's output is its token, the same for the whole batch
        got, want = aval_of(out), node.out.aval
        if got.shape != (size, *want.shape) or got.dtype != want.dtype:
            raise AssertionError(
                f"the batching rule of {node.op.name} gave {got} for a batch of {size} "
                f"outputs of type {want}"
            )
        has_batch.add(id(node.out))
    return env, has_batch


def batched_aval(aval: Aval, size: int) -> Aval:
    return Aval((size, *aval.shape), aval.dtype, aval.weak)


def batch_graph(
    graph: Graph, batched: Sequence[bool], size: int, force: bool = False
) -> tuple[Graph, list[bool]]:
    """`graph` on a batch of `size`: the inputs flagged in `batched` get a leading batch
    axis. Returns the batched graph and, per output, whether it carries the batch; with
    `force`, every output does (the unbatched ones are broadcast)."""
    with Trace() as trace:
        ins = [
            trace.new_input(batched_aval(v.aval, size) if b else v.aval, v.hint)
            for v, b in zip(graph.inputs, batched, strict=True)
        ]
        env, has_batch = batch_values(graph, ins, batched, size)
        outs, flags = [], []
        for v in graph.outputs:
            out, b = env[id(v)], id(v) in has_batch
            if force and not b:
                out, b = with_batch(out, size), True
            outs.append(out)
            flags.append(b)
    return trace.to_graph(outs).verify(), flags
