"""The `custom_vjp_call` primitive: a call to a function whose gradient rule the user wrote.

A `CustomCall` holds the user's traced `fwd` graph (inputs to outputs and residuals) and
`bwd` graph (residuals and output cotangents to input cotangents). One node per output leaf
stands for the call: the reference interpreter runs `fwd`, reverse mode inlines `bwd`,
forward mode inlines the transpose of `bwd`, and compiler.passes.simplify inlines `fwd` after
differentiation, so fusion only ever sees plain primitives. fastgrad.api.custom_vjp builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastgrad.core.interpreter import eval_graph, run_graph
from fastgrad.core.ir import Aval, Graph
from fastgrad.core.primitive import Primitive
from fastgrad.core.tracing import Trace, Tracer, bind, current_trace
from fastgrad.ops.base import batch_size, broadcast_to, sum
from fastgrad.transforms.batching import batch_graph
from fastgrad.transforms.reverse import vjp_graph


@dataclass(eq=False)
class CustomCall:
    """One call of a custom_vjp function, traced at its argument types.

    `fwd`: inputs are the primal leaves; outputs are the `n_out` output leaves, then the
    residual leaves. `bwd`: inputs are the residual leaves, then one cotangent per float
    output leaf (in order); outputs are input cotangents, `ct_of_input[i]` naming the one of
    input leaf i (None: no cotangent, a symbolic zero).
    """

    name: str
    fwd: Graph
    bwd: Graph
    n_out: int
    ct_of_input: tuple[int | None, ...]
    _transposed: dict[tuple[int, ...], Graph] = field(default_factory=dict)
    _batched: dict[Any, CustomCall] = field(default_factory=dict)

    @property
    def float_outputs(self) -> list[int]:
        return [k for k in range(self.n_out) if self.fwd.outputs[k].aval.is_float]

    @property
    def n_residuals(self) -> int:
        return len(self.fwd.outputs) - self.n_out

    def transposed(self, inputs: tuple[int, ...]) -> Graph:
        """The transpose of `bwd` for tangents on the input leaves `inputs`.

        `bwd` is linear in the output cotangents g, bwd(r, g) = J^T g, so the gradient of
        <bwd(r, g), t> with respect to g is J t at any g: a JVP by the user's own rule.
        Inputs: `bwd.inputs`, then one tangent per entry of `inputs`. Outputs: `bwd.outputs`,
        then J t for each float output.
        """
        graph = self._transposed.get(inputs)
        if graph is None:
            wrt = range(self.n_residuals, len(self.bwd.inputs))
            # _call_jvp passes only inputs that bwd gives a cotangent.
            seeds = [j for i in inputs if (j := self.ct_of_input[i]) is not None]
            assert len(seeds) == len(inputs)
            graph = vjp_graph(self.bwd, wrt, seeds).verify()
            self._transposed[inputs] = graph
        return graph


def _zeros(aval: Aval) -> Any:
    # A zero cotangent for an output that gets none; a scalar constant, broadcast.
    trace = current_trace()
    assert trace is not None, "custom_vjp_call rules run while tracing"
    zero = Tracer(trace, trace.const(np.zeros((), aval.dtype)))
    return broadcast_to(zero, aval.shape)


def _residuals(call: CustomCall, xs: tuple[Any, ...]) -> list[Any]:
    # Recomputed by inlining fwd; once fwd is inlined for the call itself too, the two
    # copies are merged by passes.simplify.
    return eval_graph(call.fwd, xs)[call.n_out :]


def _call_eval(*avals: Aval, call: CustomCall, index: int) -> Aval:
    want = [v.aval for v in call.fwd.inputs]
    if len(avals) != len(want) or any(
        a.shape != w.shape or a.dtype != w.dtype for a, w in zip(avals, want, strict=False)
    ):
        raise TypeError(
            f"custom_vjp function {call.name} was traced for inputs "
            f"{[str(w) for w in want]}, got {[str(a) for a in avals]}"
        )
    return call.fwd.outputs[index].aval


def _call_impl(*xs: Any, call: CustomCall, index: int) -> Any:
    return run_graph(call.fwd, [np.asarray(x) for x in xs])[index]


def _call_vjp(gs: dict[int, Any], *xs: Any, call: CustomCall) -> tuple[Any, ...]:
    """The input cotangents for cotangents `gs` (output index -> g) of the call's outputs.

    autodiff gathers the cotangents of all the call's output nodes into one `gs`, so bwd
    runs once per call; outputs with none get zeros (bwd is linear in them).
    """
    g_in = [gs[k] if k in gs else _zeros(call.fwd.outputs[k].aval) for k in call.float_outputs]
    cts = eval_graph(call.bwd, [*_residuals(call, xs), *g_in])
    return tuple(None if j is None else cts[j] for j in call.ct_of_input)


def _call_jvp(t: tuple[Any, ...], *xs: Any, call: CustomCall) -> list[Any]:
    """The tangents of all the call's outputs (None: zero) for input tangents `t`.

    forward mode runs this once per call and hands each output node its tangent.
    """
    inputs = tuple(
        i for i, ti in enumerate(t) if ti is not None and call.ct_of_input[i] is not None
    )
    tangents: list[Any] = [None] * call.n_out
    if not inputs or not call.float_outputs:
        return tangents
    zeros = [_zeros(call.fwd.outputs[k].aval) for k in call.float_outputs]
    outs = eval_graph(
        call.transposed(inputs), [*_residuals(call, xs), *zeros, *(t[i] for i in inputs)]
    )
    for k, tk in zip(call.float_outputs, outs[len(call.bwd.outputs) :], strict=True):
        tangents[k] = tk
    return tangents


def _call_batch(batched: tuple[bool, ...], *xs: Any, call: CustomCall) -> list[Any]:
    """All the call's outputs for a batch: a call of the batched fwd and bwd, so the
    user's rule still gives the gradient. A shared input's cotangent is the sum of the
    examples' ones."""
    size = batch_size(batched, xs)
    bcall = call._batched.get((batched, size))
    if bcall is None:
        fwd, _ = batch_graph(call.fwd, batched, size, force=True)
        bwd, _ = batch_graph(call.bwd, [True] * len(call.bwd.inputs), size, force=True)
        with Trace() as trace:
            cts = eval_graph(bwd, [trace.new_input(v.aval, v.hint) for v in bwd.inputs])
            for i, j in enumerate(call.ct_of_input):
                if j is not None and not batched[i]:
                    cts[j] = sum(cts[j], axis=0)
        bwd = trace.to_graph(cts).verify()
        bcall = CustomCall(call.name, fwd, bwd, call.n_out, call.ct_of_input)
        call._batched[(batched, size)] = bcall
    return [bind(CUSTOM_VJP_CALL, *xs, call=bcall, index=k) for k in range(call.n_out)]


def _call_format(args: list[str], params: dict[str, Any]) -> str:
    call = params["call"]
    text = f"custom_vjp({call.name})({', '.join(args)})"
    return text + (f"[{params['index']}]" if call.n_out > 1 else "")


# Not in ops.REGISTRY: it has no NumPy kernel or loop of its own, and never reaches fusion.
CUSTOM_VJP_CALL = Primitive(
    "custom_vjp_call",
    _call_eval,
    _call_impl,
    lambda g, out, *xs, call, index: _call_vjp({index: g}, *xs, call=call),
    lambda t, out, *xs, call, index: _call_jvp(t, *xs, call=call)[index],
    kind="other",
    format=_call_format,
    extra={
        # passes.simplify replaces the node by this subgraph's output `index`.
        "inline": lambda params: (params["call"].fwd, params["index"]),
        # autodiff and forward mode run these once for all the output nodes of a call.
        "call_vjp": _call_vjp,
        "call_jvp": _call_jvp,
        "call_batch": _call_batch,
    },
)
