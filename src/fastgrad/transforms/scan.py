"""The `scan` primitive: a loop over the leading axis of stacked inputs, its body a graph.

A `ScanCall` holds the body (inputs: loop-invariant consts, carry, one slice of each
stacked input; outputs: the new carry, one slice of each stacked output) and the trip
count. Forward mode is a scan over primals and tangents; reverse mode is a forward scan
that also stacks the residuals the backward pass needs, then a backward scan over them
that accumulates the consts' cotangents in its carry. Both are again scans, so they can be
differentiated again. fastgrad.api.control_flow builds it from a user's function.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from fastgrad.core.interpreter import eval_graph
from fastgrad.core.ir import Aval, Graph, Node, Var, live_nodes
from fastgrad.core.primitive import Primitive
from fastgrad.core.tracing import Trace, aval_of
from fastgrad.ops.base import batch_size, with_batch
from fastgrad.ops.shape import transpose
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


class ScanCall(GroupCall):
    """One scan: `body` run `length` times (backwards over the stacked axis if `reverse`).

    Body inputs: `n_consts` consts, `n_carry` carries, then one slice per stacked input;
    body outputs: `n_carry` carries, then one slice per stacked output. The scan's nodes
    take consts, initial carries and stacked inputs, and give the final carries, then the
    stacked outputs. `extends` names a scan this one computes too (its inputs are the first
    ones of this scan's, its outputs the first ones), which compiler.passes merges into it.
    """

    name = "scan"

    def __init__(
        self,
        body: Graph,
        n_consts: int,
        n_carry: int,
        length: int,
        reverse: bool = False,
        extends: ScanCall | None = None,
    ):
        super().__init__()
        self.body = body
        self.n_consts = n_consts
        self.n_carry = n_carry
        self.length = length
        self.reverse = reverse
        self.extends = extends

    @property
    def n_xs(self) -> int:
        return len(self.body.inputs) - self.n_consts - self.n_carry

    def input_avals(self) -> list[Aval]:
        avals = [v.aval for v in self.body.inputs]
        k = self.n_consts + self.n_carry
        return avals[:k] + [Aval((self.length, *a.shape), a.dtype) for a in avals[k:]]

    def output_avals(self) -> list[Aval]:
        avals = [Aval(v.aval.shape, v.aval.dtype) for v in self.body.outputs]
        k = self.n_carry
        return avals[:k] + [Aval((self.length, *a.shape), a.dtype) for a in avals[k:]]

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return scan_loop(self, arrays, lambda args: run_body(self.body, args))


def scan_loop(
    call: ScanCall,
    arrays: Sequence[np.ndarray],
    body: Callable[[list[Any]], list[Any]],
    empty: Callable[[int, Aval], np.ndarray] | None = None,
    private: Collection[int] = (),
    loop: Callable[..., list[Any] | None] | None = None,
    handed: Collection[int] | None = None,
) -> list[np.ndarray]:
    """Run `call` on concrete arrays, calling `body(args) -> outputs` once per step.

    Stacked outputs are allocated once (`empty(k, aval)` gives the k-th, when given) and
    filled in place; slices of stacked inputs are views. The runtime's compiled loop calls
    this with its compiled body, and says which stacked outputs are `private` (no caller
    sees them): one that is another shifted by a step (`shifted_outputs`) is then a view.
    `loop(consts, carry, xs, stores)`, when given, may run all the steps at once (the
    plan interpreter's LOOP, runtime.loop_table): it returns the final carry, or None.
    `handed`, when given, says which carry outputs may be (views of) carry inputs (the
    runtime knows from the body's plan): those are copied at every step, and no other;
    else each step checks the memory of each.
    """
    nc, ncar = call.n_consts, call.n_carry
    avals = call.derived.get("avals")  # built once per call: ~3 us a run of a short scan
    if avals is None:
        avals = call.derived["avals"] = (call.input_avals(), call.output_avals()[ncar:])
    arrays = [
        a if type(a) is np.ndarray and a.dtype == av.dtype else np.asarray(a, dtype=av.dtype)
        for a, av in zip(arrays, avals[0], strict=True)
    ]
    consts, carry = arrays[:nc], arrays[nc : nc + ncar]
    xs = [np.ascontiguousarray(x) for x in arrays[nc + ncar :]]
    stacked = avals[1]
    ys: list[Any] = [None] * len(stacked)
    derived = set()  # stacked outputs that are another one shifted: no step writes them
    for k, before, after in shifted_outputs(call):
        if before not in private:
            continue
        # One array of length + 1 rows holds both stacks: the carry's stack is the other
        # one shifted by a row, its initial value in the extra row.
        aval = stacked[after]
        rows = Aval((call.length + 1, *aval.shape[1:]), aval.dtype)
        both = empty(-1 - after, rows) if empty else np.empty(rows.shape, rows.dtype)
        first, rest = (both[:-1], both[1:]) if call.reverse else (both[1:], both[:-1])
        ys[after], ys[before] = first, rest
        both[-1 if call.reverse else 0] = carry[k]
        derived.add(before)
    for j, a in enumerate(stacked):
        if ys[j] is None:
            ys[j] = empty(j, a) if empty else np.empty(a.shape, a.dtype)
    stores = [(y, ncar + j) for j, y in enumerate(ys) if j not in derived]
    final = loop(consts, carry, xs, stores) if loop is not None else None
    steps = range(call.length - 1, -1, -1) if call.reverse else range(call.length)
    for t in steps if final is None else ():
        # x[t, ...]: a 0-d view for a stack of scalars (x[t] is a NumPy scalar, which a
        # plan's view or product steps do not take: its body would not run as a LOOP).
        outs = body([*consts, *carry, *(x[t, ...] for x in xs)])
        # A carry handed on unchanged (or as a view) lives where its input did: in the
        # buffers of the arena the next iteration writes. Copy it out first.
        if handed is None:
            carry = [
                np.array(c, copy=True) if any(np.may_share_memory(c, p) for p in carry) else c
                for c in outs[:ncar]
            ]
        else:
            carry = list(outs[:ncar])
            for k in handed:
                carry[k] = np.array(carry[k], copy=True)
        for y, j in stores:
            y[t] = outs[j]
    carry = carry if final is None else final
    carry = [
        np.asarray(c, dtype=v.aval.dtype) for c, v in zip(carry, call.body.outputs, strict=False)
    ]
    return [*carry, *ys]


def shifted_outputs(call: ScanCall) -> list[tuple[int, int, int]]:
    """(k, before, after) for each carry k whose input is stacked output `before` and
    whose output is stacked output `after`: `before` is `after` shifted by one step (the
    forward scan of a VJP stacks h_{t-1} as a residual beside the h_t a user stacks).

    >>> from fastgrad.core.tracing import Trace
    >>> with Trace() as trace:
    ...     h = trace.new_input(Aval((2,), np.dtype(np.float64)), "h")
    ...     new = h * 2.0
    >>> call = ScanCall(trace.to_graph([new, new, h]), 0, 1, 5)
    >>> shifted_outputs(call)
    [(0, 1, 0)]
    """
    found = call.derived.get("shifted")
    if found is None:
        nc, ncar = call.n_consts, call.n_carry
        ys = call.body.outputs[ncar:]
        found, used = [], set()
        for k in range(ncar):
            carry_in, carry_out = call.body.inputs[nc + k], call.body.outputs[k]
            before = next((j for j, v in enumerate(ys) if v is carry_in and j not in used), None)
            after = next((j for j, v in enumerate(ys) if v is carry_out and j not in used), None)
            if before is not None and after is not None and before != after:
                found.append((k, before, after))
                used.update((before, after))
        call.derived["shifted"] = found
    return list(found)


def _scan_eval(*avals: Aval, call: ScanCall, index: int) -> Aval:
    want = call.input_avals()
    if len(avals) != len(want) or any(
        a.shape != w.shape or a.dtype != w.dtype for a, w in zip(avals, want, strict=False)
    ):
        raise TypeError(
            f"scan was traced for inputs {[str(w) for w in want]}, got {[str(a) for a in avals]}"
        )
    return group_eval(call=call, index=index)


# ---- forward mode: a scan over primals and tangents


def _carry_fixed_point(
    body: Graph, has_tangent: list[bool], n_consts: int, n_carry: int
) -> set[int]:
    """Ids of the body vars that get a tangent, once every carry that can get one (from
    its initial value or from the consts and stacked inputs, at any step) has one."""
    carry = list(has_tangent[n_consts : n_consts + n_carry])
    while True:
        wrt = [
            v
            for i, v in enumerate(body.inputs)
            if (carry[i - n_consts] if n_consts <= i < n_consts + n_carry else has_tangent[i])
        ]
        active = active_vars(body, wrt)
        new = [
            c or (id(v) in active and v.aval.is_float)
            for c, v in zip(carry, body.outputs[:n_carry], strict=True)
        ]
        if new == carry:
            return active
        carry = new


def _scan_jvp(ts: tuple[Any, ...], *ins: Any, call: ScanCall) -> list[Any]:
    """Tangents of all the scan's outputs (None: zero) for input tangents `ts`."""
    nc, ncar, nx = call.n_consts, call.n_carry, call.n_xs
    body = call.body
    has_t = [t is not None and v.aval.is_float for t, v in zip(ts, body.inputs, strict=True)]
    active = _carry_fixed_point(body, has_t, nc, ncar)
    tangent_in = [
        i
        for i, v in enumerate(body.inputs)
        if id(v) in active and v.aval.is_float and (has_t[i] or nc <= i < nc + ncar)
    ]
    # Carries get a tangent if their output does; inputs listed in `tangent_in` in order.
    carry_t = [k for k in range(ncar) if nc + k in tangent_in]
    ys_t = [j for j, v in enumerate(body.outputs[ncar:]) if id(v) in active and v.aval.is_float]
    if not carry_t and not ys_t:
        return [None] * len(body.outputs)
    key = ("jvp", tuple(tangent_in))
    jcall = call.derived.get(key)
    if jcall is None:
        outs = [*carry_t, *(ncar + j for j in ys_t)]
        g = jvp_graph(body, tangent_in, outs)
        n_in, n_out = len(body.inputs), len(body.outputs)
        t_at = {i: n_in + r for r, i in enumerate(tangent_in)}
        groups = [range(nc), range(nc, nc + ncar), range(nc + ncar, n_in)]
        order = [k for grp in groups for k in [*grp, *(t_at[i] for i in grp if i in t_at)]]
        out_order = [
            *range(ncar),
            *(n_out + r for r in range(len(carry_t))),
            *range(ncar, n_out),
            *(n_out + len(carry_t) + r for r in range(len(ys_t))),
        ]
        n_const_t = sum(1 for i in tangent_in if i < nc)
        jcall = ScanCall(
            reorder(g, order, out_order),
            nc + n_const_t,
            ncar + len(carry_t),
            call.length,
            call.reverse,
        )
        call.derived[key] = jcall
    args: list[Any] = []
    for grp in (range(nc), range(nc, nc + ncar), range(nc + ncar, nc + ncar + nx)):
        args += [ins[i] for i in grp]
        for i in grp:
            if i in tangent_in:
                args.append(ts[i] if has_t[i] else zeros_of(body.inputs[i].aval))
    n_carry2 = ncar + len(carry_t)
    wanted = [ncar + r for r in range(len(carry_t))]
    wanted += [n_carry2 + (len(body.outputs) - ncar) + r for r in range(len(ys_t))]
    outs = bind_outputs(SCAN, jcall, args, wanted)
    tangents: list[Any] = [None] * len(body.outputs)
    for k, t in zip([*carry_t, *(ncar + j for j in ys_t)], outs, strict=True):
        tangents[k] = t
    return tangents


# ---- reverse mode: a forward scan stacking residuals, then a backward scan


class _Split:
    """The VJP of a scan body split into a forward part and a backward part.

    `fwd`: the body with the residuals the backward part needs appended to its stacked
    outputs. `bwd`: inputs (const residuals, carry cotangents, const accumulators, stacked
    residuals, stacked-input residuals, stacked-output cotangents), outputs (cotangents of
    the carries, the accumulators plus this step's const cotangents, cotangents of the
    stacked inputs). Index lists say which scan inputs each residual group reads.
    """

    def __init__(self, call: ScanCall, wrt: list[int], seeds_y: list[int]):
        nc, ncar = call.n_consts, call.n_carry
        body = call.body
        n_in, n_out = len(body.inputs), len(body.outputs)
        self.carries = [k for k in range(ncar) if body.inputs[nc + k].aval.is_float]
        self.wrt = wrt
        self.seeds_y = seeds_y
        seeds = [*self.carries, *(ncar + j for j in seeds_y)]
        g = vjp_graph(body, wrt, seeds)
        primal_out = g.outputs[:n_out]
        cts_out = g.outputs[n_out:]
        forward = live_nodes(g.nodes, primal_out)
        in_forward = {id(n.out) for n in forward}
        invariant = _invariant(g, nc, forward)
        # Backward nodes: what the cotangents need that the forward part does not give,
        # recomputing loop-invariant values (a transpose of a weight) rather than
        # stacking them once per step.
        needed = {id(v) for v in cts_out}
        keep: list[Node] = []
        for node in reversed(g.nodes):
            if id(node.out) not in needed or node.op.effect:
                continue
            if id(node.out) in in_forward and id(node.out) not in invariant:
                continue  # a residual
            keep.append(node)
            needed.update(id(v) for v in node.inputs)
        keep.reverse()
        made = {id(n.out) for n in keep}
        seed_vars = g.inputs[n_in:]
        self.const_res = [i for i in range(nc) if id(g.inputs[i]) in needed]
        self.xs_res = [i for i in range(nc + ncar, n_in) if id(g.inputs[i]) in needed]
        stacked: list[Var] = [
            g.inputs[nc + k] for k in range(ncar) if id(g.inputs[nc + k]) in needed
        ]
        stacked += [n.out for n in forward if id(n.out) in needed and id(n.out) not in made]
        stacked = list({id(v): v for v in stacked}.values())
        # A residual the body already stacks as an output is read from that output.
        ys_at = {id(v): ncar + j for j, v in enumerate(primal_out[ncar:])}
        extra = [v for v in stacked if id(v) not in ys_at]
        self.stacked_from = [
            ys_at[id(v)] if id(v) in ys_at else n_out + extra.index(v) for v in stacked
        ]
        self.fwd = Graph(g.inputs[:n_in], forward, [*primal_out, *extra])
        seed_carry, seed_ys = seed_vars[: len(self.carries)], seed_vars[len(self.carries) :]
        inner = Graph(
            [
                *(g.inputs[i] for i in self.const_res),
                *seed_carry,
                *stacked,
                *(g.inputs[i] for i in self.xs_res),
                *seed_ys,
            ],
            keep,
            cts_out,
        )
        bwd = _accumulating(inner, body, wrt, self.carries, len(self.const_res), nc, ncar)
        self.fwd_call = ScanCall(self.fwd, nc, ncar, call.length, call.reverse, extends=call)
        n_acc = sum(1 for i in wrt if i < nc)
        self.bwd_call = ScanCall(
            bwd, len(self.const_res), len(self.carries) + n_acc, call.length, not call.reverse
        )


def _invariant(g: Graph, n_consts: int, forward: list[Node]) -> set[int]:
    """Ids of forward values that depend on the consts alone (the same at every step)."""
    inv = {id(v) for v in g.inputs[:n_consts]}
    for node in forward:
        if not node.op.effect and all(id(v) in inv for v in node.inputs):
            inv.add(id(node.out))
    return inv


def _accumulating(
    inner: Graph,
    body: Graph,
    wrt: list[int],
    carries: list[int],
    n_const_res: int,
    nc: int,
    ncar: int,
) -> Graph:
    """The backward body: `inner` with a carry per differentiated const that adds up its
    cotangents over the steps."""
    const_wrt = [i for i in wrt if i < nc]
    n_head = n_const_res + len(carries)
    with Trace() as trace:
        ins = [trace.new_input(v.aval, v.hint) for v in inner.inputs]
        accs = [trace.new_input(body.inputs[i].aval, f"acc{i}") for i in const_wrt]
        cts = eval_graph(inner, ins)
        by_input = dict(zip(wrt, cts, strict=True))
        outs = [by_input[nc + k] for k in carries]
        outs += [acc + by_input[i] for acc, i in zip(accs, const_wrt, strict=True)]
        outs += [by_input[i] for i in wrt if i >= nc + ncar]
    graph = trace.to_graph(outs)
    # Inputs in the order the backward scan passes them: consts, carries, stacked.
    k = len(inner.inputs)
    order = [*range(n_head), *range(k, k + len(accs)), *range(n_head, k)]
    return Graph([graph.inputs[i] for i in order], graph.nodes, graph.outputs).verify()


def _scan_vjp(
    gs: dict[int, Any], *ins: Any, call: ScanCall, active: Sequence[bool] | None = None
) -> tuple[Any, ...]:
    """Cotangents of the scan's inputs for cotangents `gs` (output index -> g)."""
    nc, ncar = call.n_consts, call.n_carry
    body = call.body
    n_in = len(body.inputs)
    wrt = [
        i
        for i, v in enumerate(body.inputs)
        if v.aval.is_float and (nc <= i < nc + ncar or active is None or active[i])
    ]
    seeds_y = sorted(k - ncar for k in gs if k >= ncar and body.outputs[k].aval.is_float)
    key = ("vjp", tuple(wrt), tuple(seeds_y))
    split = call.derived.get(key)
    if split is None:
        split = _Split(call, wrt, seeds_y)
        call.derived[key] = split
    stacked = bind_outputs(SCAN, split.fwd_call, ins, split.stacked_from)
    out_avals = call.output_avals()
    carry_g = [gs[k] if k in gs else zeros_of(out_avals[k]) for k in split.carries]
    const_wrt = [i for i in wrt if i < nc]
    accs = [zeros_of(body.inputs[i].aval) for i in const_wrt]
    args = [
        *(ins[i] for i in split.const_res),
        *carry_g,
        *accs,
        *stacked,
        *(ins[i] for i in split.xs_res),
        *(gs[ncar + j] for j in seeds_y),
    ]
    xs_wrt = [i for i in wrt if i >= nc + ncar]
    n_carry2 = len(split.carries) + len(const_wrt)
    outs = bind_outputs(SCAN, split.bwd_call, args, range(n_carry2 + len(xs_wrt)))
    cts: list[Any] = [None] * n_in
    for k, ct in zip(split.carries, outs, strict=False):
        cts[nc + k] = ct
    for i, ct in zip(const_wrt, outs[len(split.carries) :], strict=False):
        cts[i] = ct
    for i, ct in zip(xs_wrt, outs[n_carry2:], strict=True):
        cts[i] = ct
    if active is not None:
        cts = [ct if a else None for ct, a in zip(cts, active, strict=True)]
    return tuple(cts)


def merge_extended(nodes: list[Node]) -> list[Node]:
    """Read the outputs of a scan from a scan that extends it on the same inputs (the
    forward scan of a VJP computes the primal outputs again, with its residuals), so that
    the loop runs once (test_control_flow.py::test_value_and_grad_runs_the_forward_loop_once).
    """
    groups: dict[Any, ScanCall] = {}
    for node in nodes:
        if node.op is SCAN:
            groups[(id(node.params["call"]), *map(id, node.inputs))] = node.params["call"]
    wider: dict[Any, ScanCall] = {}
    for key, scan in groups.items():
        if scan.extends is not None:
            wider[(id(scan.extends), *key[1:])] = scan
    if not wider:
        return nodes
    out = []
    for node in nodes:
        if node.op is SCAN:
            key = (id(node.params["call"]), *map(id, node.inputs))
            call = wider.get(key)
            while call is not None:  # an extension of an extension reads the widest
                node = Node(
                    SCAN, node.inputs, {"call": call, "index": node.params["index"]}, node.out
                )
                call = wider.get((id(call), *key[1:]))
        out.append(node)
    return out


# ---- batching: the body runs on whole batches


def _scan_batch(batched: Sequence[bool], *ins: Any, call: ScanCall) -> list[Any]:
    """All the scan's outputs for a batch (leading axis). Every carry is batched; stacked
    inputs and outputs keep the scan's axis first and the batch second inside the loop."""
    nc, ncar = call.n_consts, call.n_carry
    size = batch_size(batched, ins)
    flags = [*batched[:nc], *(True,) * ncar, *batched[nc + ncar :]]
    key = ("batch", tuple(flags), size)
    bcall = call.derived.get(key)
    if bcall is None:
        body, _ = batch_graph(call.body, flags, size, force=True)
        bcall = ScanCall(body, nc, ncar, call.length, call.reverse)
        call.derived[key] = bcall
    carry = [
        x if b else with_batch(x, size)
        for x, b in zip(ins[nc : nc + ncar], batched[nc : nc + ncar], strict=True)
    ]
    xs = [
        swap_leading(x) if b else x
        for x, b in zip(ins[nc + ncar :], batched[nc + ncar :], strict=True)
    ]
    outs = bind_outputs(SCAN, bcall, [*ins[:nc], *carry, *xs], range(len(call.body.outputs)))
    return [*outs[:ncar], *(swap_leading(y) for y in outs[ncar:])]


def swap_leading(x: Any) -> Any:
    """`x` with its first two axes swapped."""
    return transpose(x, (1, 0, *range(2, aval_of(x).ndim)))


def _describe(call: ScanCall) -> str:
    return f"length={call.length}" + (", reverse" if call.reverse else "")


# Not in ops.REGISTRY: it has no NumPy kernel or loop of its own; the runtime runs it.
SCAN = Primitive(
    "scan",
    _scan_eval,
    group_impl,
    lambda g, out, *xs, call, index: _scan_vjp({index: g}, *xs, call=call),
    lambda t, out, *xs, call, index: _scan_jvp(t, *xs, call=call)[index],
    kind="other",
    format=format_call("scan", _describe),
    extra={
        "call_vjp": _scan_vjp,
        "call_jvp": _scan_jvp,
        "call_batch": _scan_batch,
        "vjp_active": True,
    },
)
