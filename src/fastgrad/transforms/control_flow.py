"""The `while_loop`, `switch` and `checkpoint` primitives, their graphs held in params.

`WhileCall`: a cond graph and a body graph over a carry, run until the cond is false; its
forward mode is a while loop over primals and tangents, and reverse mode raises (the trip
count is unknown, so there is nowhere to keep the residuals). `SwitchCall`: one graph
per branch, the index picks one; its rules are switches over the branches' rules (the
backward branch recomputes its forward values). `RematCall`: a function whose backward
pass recomputes its values from its inputs (checkpoint); compiled code inlines it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.core.interpreter import eval_graph
from fastgrad.core.ir import Aval, Graph, Var
from fastgrad.core.primitive import Primitive
from fastgrad.core.tracing import Trace, aval_of
from fastgrad.ops.base import astype, batch_size, reshape, sum, with_batch
from fastgrad.ops.elementwise import maximum, minimum, where
from fastgrad.transforms.batching import batch_graph
from fastgrad.transforms.calls import (
    GroupCall,
    bind_outputs,
    format_call,
    group_eval,
    group_impl,
    reorder,
    run_body,
    zeros_of,
)
from fastgrad.transforms.forward import jvp_graph
from fastgrad.transforms.reverse import active_vars, vjp_graph

REVERSE_WHILE_ERROR = (
    "Reverse-mode differentiation does not work through while_loop (or fori_loop with "
    "traced bounds): its trip count is only known at run time, so the values the backward "
    "pass needs cannot be stored. Use fg.scan, or fg.fori_loop with static (Python int) "
    "bounds; forward mode (fg.jvp) works through while_loop."
)


def _float_with(ts: Sequence[Any], graph_inputs: Sequence[Var]) -> list[bool]:
    return [t is not None and v.aval.is_float for t, v in zip(ts, graph_inputs, strict=True)]


# ---- while_loop


class WhileCall(GroupCall):
    """`cond` (inputs: its consts, then the carry; output: a bool scalar) and `body`
    (inputs: its consts, then the carry; outputs: the carry). Node inputs: cond consts,
    body consts, initial carry; outputs: the final carry."""

    name = "while_loop"

    def __init__(self, cond: Graph, body: Graph, n_cond_consts: int, n_body_consts: int):
        super().__init__()
        self.cond, self.body = cond, body
        self.n_cond_consts, self.n_body_consts = n_cond_consts, n_body_consts

    def output_avals(self) -> list[Aval]:
        return [Aval(v.aval.shape, v.aval.dtype) for v in self.body.outputs]

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return while_loop_run(
            self, arrays, lambda a: run_body(self.cond, a), lambda a: run_body(self.body, a)
        )


def while_loop_run(call: WhileCall, arrays: Sequence[Any], cond: Any, body: Any) -> list[Any]:
    """Run `call` on concrete arrays with `cond(args)` and `body(args)` (reference or
    compiled graphs)."""
    kc, kb = call.n_cond_consts, call.n_body_consts
    cond_consts, body_consts = list(arrays[:kc]), list(arrays[kc : kc + kb])
    carry = [
        np.asarray(a, v.aval.dtype)
        for a, v in zip(arrays[kc + kb :], call.body.outputs, strict=True)
    ]
    while bool(cond([*cond_consts, *carry])[0]):
        carry = list(body([*body_consts, *carry]))
    return carry


def _while_jvp(ts: tuple[Any, ...], *ins: Any, call: WhileCall) -> list[Any]:
    kc, kb = call.n_cond_consts, call.n_body_consts
    n = len(call.body.outputs)
    body_ts = ts[kc:]
    has_t = _float_with(body_ts, call.body.inputs)
    carry = has_t[kb:]
    while True:  # the carries that get a tangent at some step
        wrt = [v for v, h in zip(call.body.inputs, [*has_t[:kb], *carry], strict=True) if h]
        active = active_vars(call.body, wrt)
        new = [
            c or (id(v) in active and v.aval.is_float)
            for c, v in zip(carry, call.body.outputs, strict=True)
        ]
        if new == carry:
            break
        carry = new
    const_t = [i for i in range(kb) if has_t[i]]
    carry_t = [k for k in range(n) if carry[k]]
    if not carry_t:
        return [None] * n
    key = ("jvp", tuple(const_t), tuple(carry_t))
    jcall = call.derived.get(key)
    if jcall is None:
        wrt_idx = [*const_t, *(kb + k for k in carry_t)]
        g = jvp_graph(call.body, wrt_idx, carry_t)
        nb = len(call.body.inputs)
        order = [*range(kb), *range(nb, nb + len(const_t)), *range(kb, nb)]
        order += range(nb + len(const_t), nb + len(wrt_idx))
        body = reorder(g, order, range(len(g.outputs)))
        # The cond reads the primal carry only; the tangents are extra unused inputs.
        extra = [Var(call.body.inputs[kb + k].aval) for k in carry_t]
        cond = Graph([*call.cond.inputs, *extra], call.cond.nodes, call.cond.outputs)
        jcall = WhileCall(cond, body, kc, kb + len(const_t))
        call.derived[key] = jcall
    args = [
        *ins[: kc + kb],
        *(ts[kc + i] for i in const_t),
        *ins[kc + kb :],
        *(
            ts[kc + kb + k] if has_t[kb + k] else zeros_of(call.body.outputs[k].aval)
            for k in carry_t
        ),
    ]
    outs = bind_outputs(WHILE, jcall, args, range(n, n + len(carry_t)))
    tangents: list[Any] = [None] * n
    for k, t in zip(carry_t, outs, strict=True):
        tangents[k] = t
    return tangents


def _while_vjp(gs: dict[int, Any], *ins: Any, call: WhileCall) -> tuple[Any, ...]:
    raise TypeError(REVERSE_WHILE_ERROR)


def _per_example(pred: Any, x: Any) -> Any:
    """A batched predicate shaped to select whole examples of `x`."""
    return reshape(pred, aval_of(pred).shape + (1,) * (aval_of(x).ndim - 1))


def _batched_loop(call: WhileCall, cond: Graph, body: Graph) -> WhileCall:
    """A loop that runs while any example's predicate holds; an example whose predicate
    no longer holds keeps its carry. Body consts: the cond's, then the body's."""
    kc, kb = call.n_cond_consts, call.n_body_consts
    with Trace() as trace:
        ins = [trace.new_input(v.aval, v.hint) for v in cond.inputs]
        (pred,) = eval_graph(cond, ins)
        any_left = sum(astype(pred, np.int64)) > 0
    any_cond = trace.to_graph([any_left])
    with Trace() as trace:
        cond_consts = [trace.new_input(v.aval, v.hint) for v in cond.inputs[:kc]]
        ins = [trace.new_input(v.aval, v.hint) for v in body.inputs]
        carry = ins[kb:]
        (pred,) = eval_graph(cond, [*cond_consts, *carry])
        new = eval_graph(body, ins)
        outs = [where(_per_example(pred, c), n, c) for n, c in zip(new, carry, strict=True)]
    return WhileCall(any_cond, trace.to_graph(outs), kc, kc + kb)


def _while_batch(batched: Sequence[bool], *ins: Any, call: WhileCall) -> list[Any]:
    """All the loop's outputs for a batch. Every carry is batched; if the predicate is
    too, the examples stop at their own step (the loop runs as long as the longest)."""
    kc, kb = call.n_cond_consts, call.n_body_consts
    size = batch_size(batched, ins)
    n = len(call.body.outputs)
    key = ("batch", tuple(batched[: kc + kb]), size)
    bcall = call.derived.get(key)
    if bcall is None:
        body, _ = batch_graph(call.body, [*batched[kc : kc + kb], *(True,) * n], size, True)
        cond, (per_example,) = batch_graph(call.cond, [*batched[:kc], *(True,) * n], size)
        if per_example:
            bcall = _batched_loop(call, cond, body)
        else:
            bcall = WhileCall(cond, body, kc, kb)
        call.derived[key] = bcall
    carry = [
        x if b else with_batch(x, size)
        for x, b in zip(ins[kc + kb :], batched[kc + kb :], strict=True)
    ]
    consts = [*ins[:kc], *ins[: kc + kb]] if bcall.n_body_consts > kb else list(ins[: kc + kb])
    return bind_outputs(WHILE, bcall, [*consts, *carry], range(n))


WHILE = Primitive(
    "while_loop",
    lambda *avals, call, index: group_eval(call=call, index=index),
    group_impl,
    lambda g, out, *xs, call, index: _while_vjp({index: g}, *xs, call=call),
    lambda t, out, *xs, call, index: _while_jvp(t, *xs, call=call)[index],
    kind="other",
    format=format_call("while_loop", lambda call: f"{len(call.body.outputs)} carries"),
    extra={"call_vjp": _while_vjp, "call_jvp": _while_jvp, "call_batch": _while_batch},
)


# ---- switch (and cond)


class SwitchCall(GroupCall):
    """One graph per branch, all with the same inputs (consts, then operands) and output
    types. Node inputs: the index (an integer scalar, clamped to the branches), then the
    branches' inputs; outputs: those of the branch taken."""

    name = "switch"

    def __init__(self, branches: Sequence[Graph]):
        super().__init__()
        self.branches = list(branches)

    def output_avals(self) -> list[Aval]:
        return [Aval(v.aval.shape, v.aval.dtype) for v in self.branches[0].outputs]

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return run_body(self.branches[branch_index(self, arrays[0])], arrays[1:])


def branch_index(call: SwitchCall, index: Any) -> int:
    """The branch an index picks: clamped into range, as in JAX."""
    return int(np.clip(int(index), 0, len(call.branches) - 1))


def _derived(
    call: SwitchCall, key: tuple[Any, ...], derive: Callable[[Graph], Graph]
) -> SwitchCall:
    """The switch whose branches are `derive(branch)` of `call`'s (a jvp or vjp graph: the
    branch's outputs, then what it adds), with the added outputs only; made once per `key`
    and kept in `call.derived`."""
    derived = call.derived.get(key)
    if derived is None:
        n_out = len(call.branches[0].outputs)
        branches = []
        for b in call.branches:
            g = derive(b)
            branches.append(reorder(g, range(len(g.inputs)), range(n_out, len(g.outputs))))
        derived = call.derived[key] = SwitchCall(branches)
    return derived


def _switch_jvp(ts: tuple[Any, ...], *ins: Any, call: SwitchCall) -> list[Any]:
    inputs = call.branches[0].inputs
    has_t = _float_with(ts[1:], inputs)
    wrt = [i for i, h in enumerate(has_t) if h]
    outs = [k for k, v in enumerate(call.branches[0].outputs) if v.aval.is_float]
    if not wrt or not outs:
        return [None] * len(outs)
    jcall = _derived(call, ("jvp", tuple(wrt)), lambda b: jvp_graph(b, wrt, outs))
    t_out = bind_outputs(SWITCH, jcall, [*ins, *(ts[1 + i] for i in wrt)], range(len(outs)))
    tangents: list[Any] = [None] * len(call.branches[0].outputs)
    for k, t in zip(outs, t_out, strict=True):
        tangents[k] = t
    return tangents


def _switch_vjp(
    gs: dict[int, Any], *ins: Any, call: SwitchCall, active: Sequence[bool] | None = None
) -> tuple[Any, ...]:
    inputs = call.branches[0].inputs
    wrt = [i for i, v in enumerate(inputs) if v.aval.is_float and (active is None or active[1 + i])]
    seeds = sorted(k for k in gs if call.branches[0].outputs[k].aval.is_float)
    if not wrt or not seeds:
        return (None,) * len(ins)
    vcall = _derived(call, ("vjp", tuple(wrt), tuple(seeds)), lambda b: vjp_graph(b, wrt, seeds))
    cts = bind_outputs(SWITCH, vcall, [*ins, *(gs[k] for k in seeds)], range(len(wrt)))
    out: list[Any] = [None] * len(ins)
    for i, ct in zip(wrt, cts, strict=True):
        out[1 + i] = ct
    return tuple(out)


def _switch_batch(batched: Sequence[bool], *ins: Any, call: SwitchCall) -> list[Any]:
    """All the switch's outputs for a batch. With a batched index every branch runs on
    the whole batch and each example takes its own branch's outputs (as in JAX)."""
    size = batch_size(batched, ins)
    key = ("batch", tuple(batched[1:]), size)
    bcall = call.derived.get(key)
    if bcall is None:
        bcall = SwitchCall(
            [batch_graph(b, batched[1:], size, force=True)[0] for b in call.branches]
        )
        call.derived[key] = bcall
    n = len(call.branches[0].outputs)
    if not batched[0]:
        return bind_outputs(SWITCH, bcall, ins, range(n))
    index = minimum(maximum(ins[0], 0), len(call.branches) - 1)
    outs = [eval_graph(b, ins[1:]) for b in bcall.branches]
    chosen = outs[-1]
    for k in range(len(outs) - 2, -1, -1):
        chosen = [
            where(_per_example(index == k, c), o, c) for o, c in zip(outs[k], chosen, strict=True)
        ]
    return chosen


SWITCH = Primitive(
    "switch",
    lambda *avals, call, index: group_eval(call=call, index=index),
    group_impl,
    lambda g, out, *xs, call, index: _switch_vjp({index: g}, *xs, call=call),
    lambda t, out, *xs, call, index: _switch_jvp(t, *xs, call=call)[index],
    kind="other",
    format=format_call("switch", lambda call: f"{len(call.branches)} branches"),
    extra={
        "call_vjp": _switch_vjp,
        "call_jvp": _switch_jvp,
        "call_batch": _switch_batch,
        "vjp_active": True,
    },
)


# ---- checkpoint (rematerialization)


class RematCall(GroupCall):
    """A function's graph whose backward pass recomputes it from its inputs."""

    name = "checkpoint"

    def __init__(self, graph: Graph, fun_name: str = "function"):
        super().__init__()
        self.graph = graph
        self.fun_name = fun_name

    def output_avals(self) -> list[Aval]:
        return [Aval(v.aval.shape, v.aval.dtype) for v in self.graph.outputs]

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return run_body(self.graph, arrays)


def _remat_jvp(ts: tuple[Any, ...], *ins: Any, call: RematCall) -> list[Any]:
    wrt = [i for i, h in enumerate(_float_with(ts, call.graph.inputs)) if h]
    outs = [k for k, v in enumerate(call.graph.outputs) if v.aval.is_float]
    tangents: list[Any] = [None] * len(call.graph.outputs)
    if not wrt or not outs:
        return tangents
    key = ("jvp", tuple(wrt))
    jcall = call.derived.get(key)
    if jcall is None:
        g = jvp_graph(call.graph, wrt, outs)
        n = len(call.graph.outputs)
        jcall = RematCall(reorder(g, range(len(g.inputs)), range(n, len(g.outputs))), call.fun_name)
        call.derived[key] = jcall
    t_out = bind_outputs(REMAT, jcall, [*ins, *(ts[i] for i in wrt)], range(len(outs)))
    for k, t in zip(outs, t_out, strict=True):
        tangents[k] = t
    return tangents


def _remat_vjp(
    gs: dict[int, Any], *ins: Any, call: RematCall, active: Sequence[bool] | None = None
) -> tuple[Any, ...]:
    graph = call.graph
    wrt = [
        i for i, v in enumerate(graph.inputs) if v.aval.is_float and (active is None or active[i])
    ]
    seeds = sorted(k for k in gs if graph.outputs[k].aval.is_float)
    if not wrt or not seeds:
        return (None,) * len(ins)
    key = ("vjp", tuple(wrt), tuple(seeds))
    vcall = call.derived.get(key)
    if vcall is None:
        # The backward call takes the inputs and recomputes everything from them.
        g = vjp_graph(graph, wrt, seeds)
        n = len(graph.outputs)
        vcall = RematCall(reorder(g, range(len(g.inputs)), range(n, len(g.outputs))), call.fun_name)
        call.derived[key] = vcall
    cts = bind_outputs(REMAT, vcall, [*ins, *(gs[k] for k in seeds)], range(len(wrt)))
    out: list[Any] = [None] * len(ins)
    for i, ct in zip(wrt, cts, strict=True):
        out[i] = ct
    return tuple(out)


def _remat_batch(batched: Sequence[bool], *ins: Any, call: RematCall) -> list[Any]:
    size = batch_size(batched, ins)
    key = ("batch", tuple(batched), size)
    bcall = call.derived.get(key)
    if bcall is None:
        bcall = RematCall(batch_graph(call.graph, batched, size, force=True)[0], call.fun_name)
        call.derived[key] = bcall
    return bind_outputs(REMAT, bcall, ins, range(len(call.graph.outputs)))


REMAT = Primitive(
    "checkpoint",
    lambda *avals, call, index: group_eval(call=call, index=index),
    group_impl,
    lambda g, out, *xs, call, index: _remat_vjp({index: g}, *xs, call=call),
    lambda t, out, *xs, call, index: _remat_jvp(t, *xs, call=call)[index],
    kind="other",
    format=format_call("checkpoint", lambda call: call.fun_name),
    extra={
        "call_vjp": _remat_vjp,
        "call_jvp": _remat_jvp,
        "call_batch": _remat_batch,
        "vjp_active": True,
        # compiler.passes.simplify replaces the node by this subgraph's output `index`.
        "inline": lambda params: (params["call"].graph, params["index"]),
    },
)
