"""The `python_call` primitive: a call back into a user's NumPy function from a graph.

A `PythonCall` holds the function, its static keyword arguments, the types of its
arguments and results (as flat leaves), and the user's derivative rules, if any. One node
per result leaf stands for a call; its NumPy reference calls the function, so a compiled
plan runs it as a library call. The user's VJP rule is applied to traced values, so it is
differentiated again for higher orders; without a JVP rule forward mode transposes it.
fastgrad.api.callback builds these (`fg.primitive`, `fg.pure_callback`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastgrad.core.interpreter import eval_graph
from fastgrad.core.ir import Aval, Graph
from fastgrad.core.primitive import Primitive
from fastgrad.core.pytree import TreeDef, flatten, unflatten
from fastgrad.core.tracing import Trace, aval_of, bind
from fastgrad.ops.base import astype, batch_size, with_batch
from fastgrad.ops.base import sum as reduce_sum
from fastgrad.ops.shape import zeros_like
from fastgrad.transforms.batching import batch_graph, batched_aval
from fastgrad.transforms.reverse import vjp_graph


@dataclass(eq=False)
class PythonCall:
    """A user's function at one signature: `fun(*args, **kwargs)` with args of structure
    `in_tree` and leaf types `in_avals`, giving results of structure `out_tree` and leaf
    types `out_avals`. `vjp(g, out, *args, **kwargs)` and `jvp(tangents, out, *args,
    **kwargs)` are the user's rules (None: not given); a call without a VJP rule (a pure
    callback) has no derivative."""

    name: str
    fun: Callable[..., Any]
    kwargs: dict[str, Any]
    in_tree: TreeDef
    in_avals: tuple[Aval, ...]
    out_tree: TreeDef
    out_avals: tuple[Aval, ...]
    vjp: Callable[..., Any] | None = None
    jvp: Callable[..., Any] | None = None
    _transposed: dict[tuple[int, ...], Graph] = field(default_factory=dict)
    _batched: dict[Any, PythonCall] = field(default_factory=dict)

    def run(self, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Call the function on arrays and check its results against the declared types."""
        result = self.fun(*unflatten(self.in_tree, list(xs)), **self.kwargs)
        leaves, tree = flatten(result)
        if tree != self.out_tree:
            raise TypeError(
                f"{self.name} returned a result of structure {tree!r}, but was declared to "
                f"return {self.out_tree!r}"
            )
        arrays = [np.asarray(leaf) for leaf in leaves]
        for k, (a, want) in enumerate(zip(arrays, self.out_avals, strict=True)):
            if a.shape != want.shape or a.dtype != want.dtype:
                got = Aval(a.shape, a.dtype)
                raise TypeError(
                    f"{self.name} returned {got} for result leaf {k}, but was declared to "
                    f"return {want}; give result_shape_dtypes that match what it returns"
                )
        return arrays

    def _no_rule(self, mode: str) -> TypeError:
        return TypeError(
            f"{self.name} has no derivative ({mode} mode): it is a pure_callback, or an "
            "fg.primitive without a rule. Give it one with fg.primitive(...).defvjp, or wrap "
            "its inputs in fg.stop_gradient if they need no gradient."
        )

    def cotangents(self, gs: dict[int, Any], outs: Sequence[Any], xs: Sequence[Any]) -> list[Any]:
        """Input-leaf cotangents (None: none) for the result cotangents `gs` (leaf -> g)."""
        if self.vjp is None:
            raise self._no_rule("reverse")
        g = [
            (gs[k] if k in gs else zeros_like(outs[k])) if a.is_float else None
            for k, a in enumerate(self.out_avals)
        ]
        cts = self.vjp(
            unflatten(self.out_tree, g),
            unflatten(self.out_tree, list(outs)),
            *unflatten(self.in_tree, list(xs)),
            **self.kwargs,
        )
        return self._input_leaves(cts, "the VJP rule", "cotangent")

    def tangents(self, ts: Sequence[Any], outs: Sequence[Any], xs: Sequence[Any]) -> list[Any]:
        """Result-leaf tangents (None: zero) for input-leaf tangents `ts` (None: zero)."""
        if self.jvp is not None:
            full = [
                (t if t is not None else zeros_like(x)) if a.is_float else None
                for t, x, a in zip(ts, xs, self.in_avals, strict=True)
            ]
            out = self.jvp(
                unflatten(self.in_tree, full),
                unflatten(self.out_tree, list(outs)),
                *unflatten(self.in_tree, list(xs)),
                **self.kwargs,
            )
            return self._result_leaves(out)
        if self.vjp is None:
            raise self._no_rule("forward")
        inputs = tuple(i for i, t in enumerate(ts) if t is not None and self.in_avals[i].is_float)
        floats = [k for k, a in enumerate(self.out_avals) if a.is_float]
        if not inputs or not floats:
            return [None] * len(self.out_avals)
        zeros = [zeros_like(outs[k]) for k in floats]
        res = eval_graph(self.transposed(inputs), [*xs, *outs, *zeros, *(ts[i] for i in inputs)])
        tangents: list[Any] = [None] * len(self.out_avals)
        for k, t in zip(floats, res[len(inputs) :], strict=True):
            tangents[k] = t
        return tangents

    def transposed(self, inputs: tuple[int, ...]) -> Graph:
        """J t from the VJP rule, which is linear in g: the gradient in g of <vjp(g), t>.

        Inputs: the argument leaves, the result leaves, one g per float result, one tangent
        per input leaf in `inputs`. Outputs: the cotangents of those inputs, then J t per
        float result.
        """
        graph = self._transposed.get(inputs)
        if graph is None:
            floats = [k for k, a in enumerate(self.out_avals) if a.is_float]
            bwd = self.rule_graph(inputs)
            n = len(self.in_avals) + len(self.out_avals)
            graph = vjp_graph(bwd, range(n, n + len(floats)), range(len(inputs))).verify()
            self._transposed[inputs] = graph
        return graph

    def rule_graph(self, inputs: Sequence[int]) -> Graph:
        """The VJP rule as a graph. Inputs: the argument leaves, the result leaves, one g
        per float result. Outputs: the cotangents of the input leaves `inputs` (zeros where
        the rule gives none)."""
        floats = [k for k, a in enumerate(self.out_avals) if a.is_float]
        with Trace() as trace:
            xs = [trace.new_input(a) for a in self.in_avals]
            outs = [trace.new_input(a) for a in self.out_avals]
            gs = {k: trace.new_input(Aval(self.out_avals[k].shape, self.out_avals[k].dtype))
                  for k in floats}  # fmt: skip
            cts = self.cotangents(gs, outs, xs)
            picked = [zeros_like(xs[i]) if cts[i] is None else cts[i] for i in inputs]
        if trace.captured:
            raise TypeError(
                f"the VJP rule of {self.name} closes over a traced value; rules must get "
                "every traced value they use as an argument"
            )
        return trace.to_graph(picked)

    def _input_leaves(self, cts: Any, rule: str, what: str) -> list[Any]:
        n_args = len(self.in_tree.children) if self.in_tree.kind == "tuple" else 1
        if not isinstance(cts, tuple | list) or len(cts) != n_args:
            raise TypeError(
                f"{rule} of {self.name} must return a tuple with one {what} per positional "
                f"argument ({n_args}), got {type(cts).__name__}"
                + ("; write `return (g,)` for one argument" if n_args == 1 else "")
            )
        out: list[Any] = []
        for ct, sub in zip(cts, self.in_tree.children, strict=True):
            if ct is None:
                out += [None] * sub.num_leaves
                continue
            leaves, tree = flatten(ct)
            if tree != sub:
                raise TypeError(f"{rule} of {self.name} returned a {what} of structure {tree!r} "
                                f"for an argument of structure {sub!r}")  # fmt: skip
            out += leaves
        return [self._checked(ct, a, rule, what) for ct, a in zip(out, self.in_avals, strict=True)]

    def _result_leaves(self, tangent: Any) -> list[Any]:
        leaves, tree = flatten(tangent)
        if tree != self.out_tree:
            raise TypeError(f"the JVP rule of {self.name} returned a tangent of structure "
                            f"{tree!r}, but the result has {self.out_tree!r}")  # fmt: skip
        return [
            self._checked(t, a, "the JVP rule", "tangent")
            for t, a in zip(leaves, self.out_avals, strict=True)
        ]

    def _checked(self, value: Any, aval: Aval, rule: str, what: str) -> Any:
        if value is None or not aval.is_float:
            return None
        got = aval_of(value)
        if got.shape != aval.shape:
            raise ValueError(f"{rule} of {self.name} returned a {what} of shape {got.shape} for "
                             f"a value of shape {aval.shape}")  # fmt: skip
        return astype(value, aval.dtype)


def _call_eval(*avals: Aval, call: PythonCall, index: int) -> Aval:
    if [(a.shape, a.dtype) for a in avals] != [(a.shape, a.dtype) for a in call.in_avals]:
        raise TypeError(
            f"{call.name} was set up for arguments {[str(a) for a in call.in_avals]}, got "
            f"{[str(a) for a in avals]}"
        )
    return call.out_avals[index]


def _call_impl(*xs: Any, call: PythonCall, index: int) -> Any:
    return call.run([np.asarray(x) for x in xs])[index]


def _outputs(call: PythonCall, xs: Sequence[Any]) -> list[Any]:
    # The call's results as graph values, for rules of a call with several results (their
    # nodes merge with the call's own ones when the graph is simplified).
    return [bind(PYTHON_CALL_MULTI, *xs, call=call, index=k) for k in range(len(call.out_avals))]


def batched_call(call: PythonCall, batched: Sequence[bool], size: int) -> PythonCall:
    """The call on a batch: NumPy code cannot be batched for the user, so the function
    runs once per example and the results are stacked (JAX's "sequential" callbacks)."""
    key = (tuple(batched), size)
    if key in call._batched:
        return call._batched[key]

    def per_example(*xs: np.ndarray) -> list[np.ndarray]:
        outs = [call.run([x[i] if b else x for x, b in zip(xs, batched, strict=True)])
                for i in range(size)]  # fmt: skip
        return [
            np.stack([o[k] for o in outs]) if outs else np.empty((0, *a.shape), a.dtype)
            for k, a in enumerate(call.out_avals)
        ]

    n, m = len(call.in_avals), len(call.out_avals)

    def batched_vjp(g: list[Any], out: list[Any], *xs: Any) -> tuple[Any, ...]:
        # The user's rule, traced for one example and batched like any graph; an input
        # shared by the batch gets the sum of the examples' cotangents.
        floats = [k for k, a in enumerate(call.out_avals) if a.is_float]
        graph = call.rule_graph([i for i, a in enumerate(call.in_avals) if a.is_float])
        flags = [*batched, *[True] * (m + len(floats))]
        rule, has_batch = batch_graph(graph, flags, size)
        values = eval_graph(rule, [*xs, *out, *(g[k] for k in floats)])
        cts = iter(zip(values, has_batch, strict=True))
        result: list[Any] = []
        for a, b in zip(call.in_avals, batched, strict=True):
            if not a.is_float:
                result.append(None)
                continue
            ct, ct_batched = next(cts)
            if b:
                result.append(ct if ct_batched else with_batch(ct, size))
            else:
                result.append(reduce_sum(ct, axis=0) if ct_batched else ct * size)
        return tuple(result)

    def no_rule(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{call.name} is vmapped and has only a JVP rule; forward mode of a vmapped "
            "callback needs its VJP rule: differentiate inside the vmap, fg.vmap(fg.jvp(f))"
        )

    batch = call._batched[key] = PythonCall(
        f"vmap({call.name})",
        per_example,
        {},
        flatten(tuple(range(n)))[1],
        tuple(
            batched_aval(a, size) if b else a for a, b in zip(call.in_avals, batched, strict=True)
        ),
        flatten(list(range(m)))[1],
        tuple(batched_aval(a, size) for a in call.out_avals),
        batched_vjp if call.vjp is not None else None,
        no_rule if call.vjp is None and call.jvp is not None else None,  # else transposed
    )
    return batch


def _format(args: list[str], params: dict[str, Any]) -> str:
    call = params["call"]
    text = f"python_call({call.name})({', '.join(args)})"
    return text + (f"[{params['index']}]" if len(call.out_avals) > 1 else "")


def _single_batch(batched: Sequence[bool], *xs: Any, call: PythonCall) -> Any:
    return bind(
        PYTHON_CALL, *xs, call=batched_call(call, batched, batch_size(batched, xs)), index=0
    )


# A call with one result: ordinary rules, which see the result as `out`.
PYTHON_CALL = Primitive(
    "python_call",
    _call_eval,
    _call_impl,
    lambda g, out, *xs, call, index: tuple(call.cotangents({0: g}, [out], xs)),
    lambda t, out, *xs, call, index: call.tangents(t, [out], xs)[0],
    lambda batched, *xs, call, index: _single_batch(batched, *xs, call=call),
    format=_format,
)


def _multi_vjp(gs: dict[int, Any], *xs: Any, call: PythonCall) -> tuple[Any, ...]:
    return tuple(call.cotangents(gs, _outputs(call, xs), xs))


def _multi_jvp(t: tuple[Any, ...], *xs: Any, call: PythonCall) -> list[Any]:
    return call.tangents(t, _outputs(call, xs), xs)


def _multi_batch(batched: Sequence[bool], *xs: Any, call: PythonCall) -> list[Any]:
    return _outputs(batched_call(call, batched, batch_size(batched, xs)), xs)


# A call with several results: one node per result; reverse and forward mode run the rule
# once for all of them (see transforms.reverse), as for custom_vjp calls.
PYTHON_CALL_MULTI = Primitive(
    "python_call",
    _call_eval,
    _call_impl,
    lambda g, out, *xs, call, index: _multi_vjp({index: g}, *xs, call=call),
    lambda t, out, *xs, call, index: _multi_jvp(t, *xs, call=call)[index],
    format=_format,
    extra={"call_vjp": _multi_vjp, "call_jvp": _multi_jvp, "call_batch": _multi_batch},
)
