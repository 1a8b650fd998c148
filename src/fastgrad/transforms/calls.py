"""What the control-flow primitives share: a call whose params hold graphs, one node per
output leaf.

A `scan`, `while_loop`, `switch` or `checkpoint` in a graph is a group of nodes, one per
output leaf, all with the same inputs and the same `call` param (the loop or branch
graphs) and their own `index`; the group runs once (`group_impl` remembers the last run),
and reverse and forward mode run their rules once per group (`extra["call_vjp"]`,
`extra["call_jvp"]`, as for custom_vjp).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.core.interpreter import run_graph
from fastgrad.core.ir import Aval, Graph, live_nodes
from fastgrad.core.primitive import Primitive
from fastgrad.core.tracing import Tracer, bind, current_trace
from fastgrad.ops.base import broadcast_to


class GroupCall:
    """Base of the `call` param of a control-flow node: identity-hashed, with a one-entry
    memo so that the nodes of one group, evaluated on the same arrays, run it once."""

    name = "call"

    def __init__(self) -> None:
        self._memo: tuple[tuple[Any, ...], list[np.ndarray]] | None = None
        self.derived: dict[Any, Any] = {}  # rules' results, built once per call

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """All outputs of the call on concrete `arrays` (the reference implementation)."""
        raise NotImplementedError

    def output_avals(self) -> list[Aval]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.name}>"


def group_impl(*arrays: Any, call: GroupCall, index: int) -> np.ndarray:
    """Output `index` of `call` on `arrays`, running the call once for all its nodes."""
    memo = call._memo
    if memo is not None and len(memo[0]) == len(arrays):
        if all(a is b for a, b in zip(memo[0], arrays, strict=True)):
            return memo[1][index]
    outs = call.run([np.asarray(a) for a in arrays])
    call._memo = (tuple(arrays), outs)  # holds the inputs, so their ids stay unique
    return outs[index]


def group_eval(*avals: Aval, call: GroupCall, index: int) -> Aval:
    return call.output_avals()[index]


def bind_outputs(
    op: Primitive, call: GroupCall, args: Sequence[Any], indices: Sequence[int]
) -> list[Any]:
    """Apply `call` to `args`, returning the outputs `indices` only (one node each)."""
    return [bind(op, *args, call=call, index=k) for k in indices]


def run_body(graph: Graph, args: Sequence[Any]) -> list[np.ndarray]:
    """A body graph on concrete arrays, by the reference interpreter."""
    return run_graph(graph, [np.asarray(a) for a in args])


def zeros_of(aval: Aval) -> Any:
    """Zeros of `aval`'s type: a broadcast constant in the current trace, else an array."""
    trace = current_trace()
    if trace is None:
        return np.zeros(aval.shape, aval.dtype)
    zero = Tracer(trace, trace.const(np.zeros((), aval.dtype)))
    return broadcast_to(zero, aval.shape) if aval.shape else zero


def reorder(graph: Graph, inputs: Sequence[int], outputs: Sequence[int]) -> Graph:
    """`graph` with its inputs and outputs listed in another order (or a subset of its
    outputs); the nodes are shared, pruned to what the outputs need."""
    outs = [graph.outputs[i] for i in outputs]
    return Graph([graph.inputs[i] for i in inputs], live_nodes(graph.nodes, outs), outs)


def format_call(kind: str, describe: Callable[[Any], str]) -> Any:
    """A graph printer for the nodes of a group: `scan[length=5](a, b)[1]`."""

    def fmt(args: list[str], params: dict[str, Any]) -> str:
        call = params["call"]
        return f"{kind}[{describe(call)}]({', '.join(args)})[{params['index']}]"

    return fmt
