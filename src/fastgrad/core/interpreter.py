"""The reference interpreter: run a graph node by node.

With concrete arrays it computes every node with the op's NumPy reference; this is the
oracle fused kernels are tested against. With tracers it re-emits the graph's nodes into
the current trace, which is how one traced function is inlined into another.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.config import config
from fastgrad.core.ir import Graph, Var, live_nodes
from fastgrad.core.tracing import CONST, Trace, Tracer, bind, current_trace


def eval_nodes(graph: Graph, args: Sequence[Any], every: bool = True) -> dict[int, Any]:
    """The value of every var of `graph` (keyed by id) for `args` given to `graph.inputs`;
    without `every`, the values of its outputs at least."""
    if len(args) != len(graph.inputs):
        raise TypeError(f"graph takes {len(graph.inputs)} inputs, got {len(args)}")
    # When inlining into a trace, concrete inputs and constants become constants of that
    # trace, so that what depends only on them stays symbolic (a scalar stays a scalar)
    # instead of being computed at trace time.
    trace = current_trace() if any(isinstance(a, Tracer) for a in args) else None
    if trace is not None:
        args = [
            a if isinstance(a, Tracer) else Tracer(trace, trace.const(a, v.aval.weak))
            for a, v in zip(args, graph.inputs, strict=True)
        ]
    env: dict[int, Any] = {id(v): a for v, a in zip(graph.inputs, args, strict=True)}
    # Inlined on tracers of the avals the graph was traced for, each node's result has the
    # aval the graph records: its type rule is not run again (jit(value_and_grad(f))
    # inlines f's forward and backward graphs, ~6,600 nodes for the T=200 RNN).
    known = trace is not None and all(
        a.aval == v.aval for a, v in zip(args, graph.inputs, strict=True)
    )
    if known and not every:
        assert trace is not None
        return _inline(trace, graph, args)
    for node in graph.nodes:
        if node.op is CONST and trace is not None:
            env[id(node.out)] = Tracer(trace, trace.const(node.params["value"], node.out.aval.weak))
        elif known:
            ins = [env[id(v)] for v in node.inputs]
            env[id(node.out)] = trace.emit(node.op, ins, dict(node.params), node.out.aval)
        else:
            env[id(node.out)] = bind(node.op, *(env[id(v)] for v in node.inputs), **node.params)
    return env


def _inline(trace: Trace, graph: Graph, args: Sequence[Tracer]) -> dict[int, Any]:
    """`graph`'s nodes re-emitted into `trace` on tracers of the avals it was traced for,
    var by var (no tracer per value, nor type rule run again: the T=200 RNN's forward
    and backward graphs inlined into the jitted one): tracers of its outputs, by id. A
    graph read from disk whose nodes were not made yet (compiler.plan_codec.StoredGraph)
    gives its rows instead: its values numbered by place, no node made for it."""
    rows = getattr(graph, "inline_rows", None)
    stream = rows() if rows is not None else None
    if stream is not None:
        values = [trace.to_var(a) for a in args]
        add, append = trace.add_node, values.append  # (~6,600 rows: no call but add_node)
        for op, ins, params, aval in stream:
            ins = list(map(values.__getitem__, ins))
            if op is CONST or op.effect:
                append(_emit(trace, op, ins, params, aval))
            else:
                append(add(op, ins, params, aval))
        places = graph.output_places  # type: ignore[attr-defined]
        outs = zip(graph.outputs, places, strict=True)
        return {id(v): Tracer(trace, values[k]) for v, k in outs}
    env: dict[int, Var] = {id(v): trace.to_var(a) for v, a in zip(graph.inputs, args, strict=True)}
    for node in graph.nodes:
        ins = list(map(env.__getitem__, map(id, node.inputs)))
        env[id(node.out)] = _emit(trace, node.op, ins, dict(node.params), node.out.aval)
    return {id(v): Tracer(trace, env[id(v)]) for v in graph.outputs}


def _emit(trace: Trace, op: Any, ins: list[Var], params: dict[str, Any], aval: Any) -> Var:
    """A node of a graph inlined into `trace` (`_inline`): its output's var there."""
    if op is CONST:
        return trace.const(params["value"], aval.weak)
    if op.effect:
        ins[0] = trace.effect_token()
    return trace.add_node(op, ins, params, aval)


def node_count(graph: Graph) -> int:
    """How many nodes `graph` has, without making them (a StoredGraph counts its rows)."""
    count = getattr(graph, "node_count", None)
    return count() if count is not None else len(graph.nodes)


def defer_inline(graph: Graph, args: Sequence[Any]) -> list[Any]:
    """`eval_graph(graph, args)` inside a trace, its nodes held back (`Deferred`): the
    outputs' tracers at once, the nodes recorded when anything else is; inlined at once
    when an input is not of the graph's aval or is another trace's tracer."""
    trace = current_trace()
    inputs = graph.inputs
    if trace is None or len(args) != len(inputs):
        return eval_graph(graph, args)
    tracers = []
    for a, v in zip(args, inputs, strict=True):
        if not isinstance(a, Tracer):
            a = Tracer(trace, trace.const(a, v.aval.weak))
        if a.trace is not trace or a.aval != v.aval:
            return eval_graph(graph, args)
        tracers.append(a)
    trace.settle()
    deferred = Deferred(trace, graph, tracers)
    trace.deferred = deferred
    return list(deferred.outs)


class Deferred:
    """A graph's inlining into `trace` held back (`defer_inline`): the outputs' tracers
    hold vars of their own until `run` records the nodes and points them at theirs."""

    def __init__(self, trace: Trace, graph: Graph, args: list[Tracer]) -> None:
        self.trace, self.source, self.args = trace, graph, args
        place = {id(v): k for k, v in enumerate(graph.inputs)}
        held: dict[int, Tracer] = {}
        self.outs: list[Tracer] = []
        for v in graph.outputs:
            k = place.get(id(v))
            if k is not None:  # an input given back: its tracer's var, as `_inline` gives
                self.outs.append(Tracer(trace, args[k]._var))
            else:
                tracer = held.get(id(v))
                if tracer is None:
                    tracer = held[id(v)] = Tracer(trace, Var(v.aval))
                self.outs.append(tracer)
        self.held = [(t, v) for v in graph.outputs if (t := held.get(id(v))) is not None]

    def run(self) -> None:
        """Record the nodes (`_inline`), each output's tracer then on its var there."""
        made = _inline(self.trace, self.source, self.args)
        for tracer, v in self.held:
            tracer._var = made[id(v)]._var

    def graph(self, outputs: Sequence[Any]) -> Graph | None:
        """The trace's graph held back, if `outputs` are some of this inlining's (in any
        order: `grad` returns the gradients alone) and nothing else reached the trace (no
        outer tracer captured)."""
        if self.trace.captured:
            return None
        place = {id(t): k for k, t in enumerate(self.outs)}
        chosen = [place.get(id(o)) for o in outputs]
        if None in chosen:
            return None
        return DeferredGraph(self, tuple(chosen))  # type: ignore[arg-type]


class DeferredGraph(Graph):
    """A traced graph that is a graph inlined and nothing else, its nodes (and outputs'
    vars) made when first asked for: a warm `jit(value_and_grad(f))` whose plan is on disk
    needs its inputs and its key alone (api.trace `_inlined`), not the ~6,600 nodes of
    the T=200 RNN's stored backward graph. Checked (Graph.verify) when its nodes are made;
    the graph inlined was checked where it was built. `source` is that graph, `chosen`
    which of its outputs (their places among them) are this graph's."""

    def __init__(self, deferred: Deferred, chosen: tuple[int, ...]) -> None:
        self.inputs = list(deferred.trace.inputs)
        self.chosen = chosen
        self.source = deferred.source
        self.deferred = deferred
        self._made: Graph | None = None
        self._lock = threading.Lock()

    def _graph(self) -> Graph:
        with self._lock:  # (two threads may ask at once: one inlining)
            if self._made is None:
                deferred = self.deferred
                trace = deferred.trace
                if trace.deferred is deferred:
                    trace.settle()
                outs = [deferred.outs[k]._var for k in self.chosen]
                graph = Graph(self.inputs, live_nodes(trace.nodes, outs), outs)
                self._made = graph.verify(types=config.check_graphs)
                # What the nodes were made from is let go: the trace (all it recorded) and
                # the stored graph would live as long as the jitted function (T=200 RNN:
                # 14,811 nodes kept against 9,607). A key is worked out before this.
                self.deferred = self.source = None  # type: ignore[assignment]
            return self._made

    @property  # type: ignore[override]
    def nodes(self) -> list[Any]:
        return self._graph().nodes

    @nodes.setter
    def nodes(self, nodes: list[Any]) -> None:
        self._graph().nodes = list(nodes)

    @property  # type: ignore[override]
    def outputs(self) -> list[Var]:
        return self._graph().outputs

    @outputs.setter
    def outputs(self, outputs: list[Var]) -> None:
        self._graph().outputs = list(outputs)

    def verify(self, types: bool = True) -> Graph:
        """Checked when its nodes are made (`_graph`), not before."""
        if self._made is not None:
            self._made.verify(types)
        return self

    @property
    def made(self) -> bool:
        """Whether its nodes were made."""
        return self._made is not None


def eval_graph(graph: Graph, args: Sequence[Any]) -> list[Any]:
    """Values of `graph.outputs` for `args` given to `graph.inputs`."""
    env = eval_nodes(graph, args, every=False)
    return [env[id(v)] for v in graph.outputs]


def run_graph(graph: Graph, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Evaluate `graph` on concrete arrays; outputs have exactly the dtypes the graph declares."""
    outs = eval_graph(graph, args)
    return [np.asarray(o, dtype=v.aval.dtype) for o, v in zip(outs, graph.outputs, strict=True)]
