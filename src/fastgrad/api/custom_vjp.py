"""`custom_vjp`: a function with a reverse-mode rule its user wrote, JAX-style."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.api.trace import arg_leaf_names, leaf_aval, name_of, param_names, trace_function
from fastgrad.core.ir import Aval, Graph
from fastgrad.core.pytree import TreeDef, flatten, unflatten
from fastgrad.core.tracing import Trace, Tracer, bind, current_trace
from fastgrad.ops.base import astype
from fastgrad.transforms.custom_call import CUSTOM_VJP_CALL, CustomCall


def _match_cotangent(ct: Any, tree: TreeDef, what: str) -> list[Any]:
    """The leaves of cotangent `ct` for an argument of structure `tree`; None stands for a
    zero subtree (None leaves)."""
    if ct is None:
        return [None] * tree.num_leaves
    if tree.kind == "leaf":
        return [ct]
    ct_leaves, ct_tree = flatten(ct)
    if ct_tree == tree:
        return ct_leaves
    kind_ok = isinstance(ct, tuple | list | dict) and ct_tree.kind == tree.kind
    if not kind_ok or ct_tree.aux != tree.aux or len(ct_tree.children) != len(tree.children):
        raise ValueError(f"{what} has structure {ct_tree!r}, but the argument has {tree!r}")
    children = [ct[k] for k in tree.aux] if tree.kind == "dict" else list(ct)
    return [
        leaf
        for child, sub in zip(children, tree.children, strict=True)
        for leaf in _match_cotangent(child, sub, what)
    ]


class custom_vjp:  # noqa: N801  named as in JAX
    """A function with a user-defined reverse-mode rule, JAX-style.

    `f = fg.custom_vjp(f)`, then `f.defvjp(fwd, bwd)`:

    - `fwd(*args)` returns `(out, residuals)`: `out` as `f` returns it, `residuals` a
      pytree of arrays (or None) that `bwd` needs.
    - `bwd(residuals, g)`, with `g` the cotangent of `out` (None at integer leaves), returns
      a tuple with one cotangent per argument of `f`, each of its argument's structure and
      shapes; None stands for a zero cotangent and must be given for integer arguments.
      Cotangents are cast to their argument's float dtype.
    - `nondiff_argnums`: arguments that are static Python values (an axis, a flag, a
      function). `fwd` gets them in place; `bwd` gets them first, `bwd(*nondiff, res, g)`,
      and returns no cotangent for them.

    On plain arrays outside any trace `f` simply runs. Traced (under jit, grad, vjp, jvp,
    hessian), each call is one `custom_vjp(f)` node in the graph: reverse mode uses `bwd`
    (which may itself be differentiated, for grad of grad), forward mode its transpose
    (`bwd` must be linear in `g`, as any VJP is), and the compiled function inlines `fwd`,
    so the rule fuses like any other code. `fwd` and `bwd` must take every traced value
    they use as an argument: closing over one is an error.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> @fg.custom_vjp
    ... def round_ste(x):  # rounds going forward; gradient 1 (straight-through)
    ...     return fnp.rint(x)
    >>> round_ste.defvjp(lambda x: (fnp.rint(x), None), lambda res, g: (g,))
    >>> fg.grad(lambda x: fnp.sum(round_ste(x) * x))(np.array([0.4, 1.6]))
    array([0.4, 3.6])
    """

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: int | Sequence[int] = ()):
        if not callable(fun):
            raise TypeError(f"custom_vjp expects a function, got {type(fun).__name__}")
        functools.update_wrapper(self, fun, updated=())
        self.fun = fun
        self.nondiff_argnums = (
            (nondiff_argnums,) if isinstance(nondiff_argnums, int) else tuple(nondiff_argnums)
        )
        self.fwd: Callable[..., Any] | None = None
        self.bwd: Callable[..., Any] | None = None

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any]) -> None:
        """Set the rule: `fwd(*args) -> (out, residuals)`, `bwd(residuals, g) -> cotangents`."""
        for what, f in (("fwd", fwd), ("bwd", bwd)):
            if not callable(f):
                raise TypeError(f"defvjp: {what} must be a function, got {type(f).__name__}")
        self.fwd, self.bwd = fwd, bwd

    def __repr__(self) -> str:
        return f"custom_vjp({name_of(self.fun)})"

    def _positional(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        try:
            sig = inspect.signature(self.fun)
        except (TypeError, ValueError):
            if kwargs:
                raise TypeError(f"{name_of(self.fun)} takes positional arguments only") from None
            return args
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()  # so that nondiff_argnums may name a defaulted argument
        if bound.kwargs:
            raise TypeError(
                f"custom_vjp function {name_of(self.fun)} cannot take keyword-only or **kwargs "
                f"arguments (got {sorted(bound.kwargs)})"
            )
        return tuple(bound.args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = name_of(self.fun)
        fwd_rule, bwd_rule = self.fwd, self.bwd
        if fwd_rule is None or bwd_rule is None:
            raise TypeError(f"custom_vjp function {name} has no rule: call {name}.defvjp(fwd, bwd)")
        args = self._positional(args, kwargs)
        if current_trace() is None:
            return self.fun(*args)
        nondiff = set()
        for i in self.nondiff_argnums:
            if not -len(args) <= i < len(args):
                raise ValueError(
                    f"nondiff_argnums {i} is out of range: {name} was called with "
                    f"{len(args)} argument(s)"
                )
            nondiff.add(i % len(args))
        names = param_names(self.fun, len(args))
        for i in sorted(nondiff):
            if any(isinstance(leaf, Tracer) for leaf in flatten(args[i])[0]):
                raise TypeError(
                    f"argument {names[i]} of {name} is in nondiff_argnums but is a traced "
                    "array; nondiff_argnums are for static Python values. Pass arrays as "
                    "ordinary arguments and return None for their cotangents in bwd."
                )
        positions = [i for i in range(len(args)) if i not in nondiff]
        diff = tuple(args[i] for i in positions)
        leaves, arg_tree = flatten(diff)
        paths = arg_leaf_names(diff, [names[i] for i in positions])

        def full(d: Sequence[Any]) -> list[Any]:
            out = list(args)
            for i, x in zip(positions, d, strict=True):
                out[i] = x
            return out

        fwd = trace_function(
            lambda *d: fwd_rule(*full(d)),
            diff,
            paths,
            list,
            f"the fwd rule of {name}",
        )
        _no_closure(fwd.captured, "fwd", name)
        if fwd.out_tree.kind not in ("tuple", "list") or len(fwd.out_tree.children) != 2:
            raise TypeError(
                f"the fwd rule of {name} must return a pair (out, residuals), got structure "
                f"{fwd.out_tree!r}"
            )
        out_tree, res_tree = fwd.out_tree.children
        n_out = out_tree.num_leaves
        # Outside a trace the function itself runs, inside it fwd does: they must agree.
        primal = trace_function(lambda *d: self.fun(*full(d)), diff, paths, list, name)
        got = [(v.aval.shape, v.aval.dtype) for v in fwd.graph.outputs[:n_out]]
        want = [(v.aval.shape, v.aval.dtype) for v in primal.graph.outputs]
        if primal.out_tree != out_tree or got != want:
            shown = lambda tree, g: unflatten(tree, [str(Aval(*a)) for a in g])  # noqa: E731
            raise TypeError(
                f"the fwd rule of {name} must return {name}'s output first, but its output "
                f"is {shown(out_tree, got)} where {name} returns {shown(primal.out_tree, want)}"
            )
        bwd, ct_of_input = self._trace_bwd(
            bwd_rule, fwd.graph, n_out, out_tree, res_tree, arg_tree, leaves, paths, nondiff, args
        )
        call = CustomCall(name, fwd.graph, bwd, n_out, ct_of_input)
        outs = [bind(CUSTOM_VJP_CALL, *leaves, call=call, index=k) for k in range(n_out)]
        return unflatten(out_tree, outs)

    def _trace_bwd(
        self,
        bwd_rule: Callable[..., Any],
        fwd: Graph,
        n_out: int,
        out_tree: TreeDef,
        res_tree: TreeDef,
        arg_tree: TreeDef,
        leaves: list[Any],
        paths: list[str],
        nondiff: set[int],
        args: tuple[Any, ...],
    ) -> tuple[Graph, tuple[int | None, ...]]:
        """Trace bwd on residuals and output cotangents; check what it returns."""
        name = name_of(self.fun)
        n_args = len(arg_tree.children)
        with Trace() as trace:
            res = [trace.new_input(v.aval, f"res{k}") for k, v in enumerate(fwd.outputs[n_out:])]
            g = [
                trace.new_input(Aval(v.aval.shape, v.aval.dtype), f"ct{k}")
                if v.aval.is_float
                else None
                for k, v in enumerate(fwd.outputs[:n_out])
            ]
            static = [args[i] for i in sorted(nondiff)]
            cts = bwd_rule(*static, unflatten(res_tree, res), unflatten(out_tree, g))
            if not isinstance(cts, tuple | list) or len(cts) != n_args:
                if isinstance(cts, tuple | list):
                    got = f"{len(cts)} cotangent(s)"
                elif isinstance(cts, Tracer | np.ndarray):
                    got = "a single array"
                else:
                    got = f"a {type(cts).__name__}"
                raise TypeError(
                    f"the bwd rule of {name} must return a tuple with one cotangent per "
                    f"differentiable argument ({n_args}), got {got}"
                    + ("; write `return (g,)` for one argument" if n_args == 1 else "")
                )
            arg_names = [
                p for i, p in enumerate(param_names(self.fun, len(args))) if i not in nondiff
            ]
            ct_leaves: list[Any] = []
            for a, (ct, sub) in enumerate(zip(cts, arg_tree.children, strict=True)):
                what = f"the cotangent the bwd rule of {name} returned for {arg_names[a]}"
                ct_leaves += _match_cotangent(ct, sub, what)
            outputs: list[Any] = []
            ct_of_input: list[int | None] = []
            for ct, leaf, where in zip(ct_leaves, leaves, paths, strict=True):
                if ct is None:
                    ct_of_input.append(None)
                    continue
                ca = leaf_aval(ct, f"the cotangent bwd returned for {where}")
                pa = leaf_aval(leaf, where)
                if not pa.is_float:
                    raise TypeError(
                        f"the bwd rule of {name} returned a cotangent for {where}, which has "
                        f"dtype {pa.dtype} and is never differentiated; return None in its place"
                    )
                if ca.shape != pa.shape:
                    raise ValueError(
                        f"the bwd rule of {name} returned a cotangent of shape {ca.shape} for "
                        f"{where}, which has shape {pa.shape}"
                    )
                if not ca.is_float:
                    raise TypeError(
                        f"the bwd rule of {name} returned a {ca.dtype} cotangent for {where}; "
                        "cotangents of float arguments must be float"
                    )
                ct_of_input.append(len(outputs))
                outputs.append(astype(ct, pa.dtype))
        graph = trace.to_graph(outputs)
        _no_closure(trace.captured, "bwd", name)
        return graph.verify(), tuple(ct_of_input)


def _no_closure(captured: list[Tracer], rule: str, name: str) -> None:
    if captured:
        t = captured[0]
        hint = f"`{t.hint}` " if t.hint else ""
        raise TypeError(
            f"the {rule} rule of custom_vjp function {name} closes over the traced value "
            f"{hint}({t.aval}); fwd and bwd must get every traced value as an argument of "
            f"{name}: pass it explicitly (bwd may return None for its cotangent)"
        )
