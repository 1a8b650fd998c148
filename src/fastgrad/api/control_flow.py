"""Structured control flow, JAX's names and signatures: scan, fori_loop, while_loop, cond,
switch and checkpoint.

Each traces the user's function(s) once into graphs (values they close over become
explicit inputs), checks that the pieces fit (a carry keeps its shape and dtype, branches
agree), and binds one primitive of fastgrad.transforms.scan or .control_flow: a loop whose
body compiles once, whatever the trip count, and which differentiates exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.api.trace import leaf_aval, name_of
from fastgrad.core.ir import Aval, Graph, Var
from fastgrad.core.pytree import TreeDef, flatten, leaf_paths, unflatten
from fastgrad.core.tracing import Trace, Tracer, is_python_scalar
from fastgrad.ops.base import astype
from fastgrad.transforms.calls import bind_outputs
from fastgrad.transforms.control_flow import REMAT, SWITCH, WHILE, RematCall, SwitchCall, WhileCall
from fastgrad.transforms.scan import SCAN, ScanCall


def _trace(
    fun: Callable[..., Any],
    avals: Sequence[Aval],
    hints: Sequence[str],
    rebuild: Callable[..., Any],
) -> tuple[Graph, list[Tracer], Any]:
    """Trace `fun(*rebuild(tracers))`: the graph (inputs: the tracers, then the values it
    closed over), those closed-over tracers, and its output tree (leaves as traced)."""
    with Trace() as trace:
        ins = [trace.new_input(a, h) for a, h in zip(avals, hints, strict=True)]
        out = fun(*rebuild(ins))
        leaves, tree = flatten(out)
        for k, leaf in enumerate(leaves):
            if not isinstance(leaf, Tracer):
                leaf_aval(leaf, f"output leaf {k} of {name_of(fun)}")
    graph = trace.to_graph(leaves)
    captured = list(trace.captured)
    # Inputs: explicit, then captured; the caller puts the captured ones first.
    return graph, captured, (tree, leaves)


def _consts_first(graph: Graph, n_explicit: int) -> Graph:
    ins = graph.inputs
    return Graph([*ins[n_explicit:], *ins[:n_explicit]], graph.nodes, graph.outputs)


def _avals(leaves: Sequence[Any], paths: Sequence[str]) -> list[Aval]:
    return [leaf_aval(x, p) for x, p in zip(leaves, paths, strict=True)]


def _shown(a: Aval) -> str:
    return f"shape {a.shape} and dtype {a.dtype}"


def _check_carry(
    what: str,
    tree: TreeDef,
    out_tree: TreeDef,
    avals: Sequence[Aval],
    outs: Sequence[Var],
    paths: Sequence[str],
) -> None:
    """The carry a body returns must have the structure, shapes and dtypes it was given."""
    if out_tree != tree:
        raise TypeError(
            f"{what}: the body must return a carry of the structure it was given, "
            f"{tree!r}, but returned {out_tree!r}"
        )
    for a, v, p in zip(avals, outs, paths, strict=True):
        if a.shape != v.aval.shape or a.dtype != v.aval.dtype:
            raise TypeError(
                f"{what}: the carry leaf {p} has {_shown(a)} going in, but the body returns "
                f"it with {_shown(v.aval)}; a carry must keep its shape and dtype from step "
                "to step (cast it, or start from a value of the type the body produces)"
            )


def _promote_weak(avals: list[Aval], outs: Sequence[Var]) -> list[Aval] | None:
    """Initial carries that are Python scalars take the dtype the body gives them (as in
    JAX); None when nothing changes."""
    new = [
        Aval(a.shape, v.aval.dtype)
        if a.weak and a.dtype != v.aval.dtype and a.shape == v.aval.shape
        else a
        for a, v in zip(avals, outs, strict=False)
    ]
    return new if new != avals else None


def _cast(leaves: Sequence[Any], avals: Sequence[Aval]) -> list[Any]:
    return [
        astype(x, a.dtype) if is_python_scalar(x) or leaf_aval(x, "").dtype != a.dtype else x
        for x, a in zip(leaves, avals, strict=True)
    ]


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
) -> tuple[Any, Any]:
    """Loop `f` over the leading axis of `xs`, carrying a value: JAX's `lax.scan`.

    `f(carry, x) -> (carry, y)`; returns the final carry and the `y`s stacked along a new
    leading axis. `init`, `xs` and the `y`s are pytrees; the carry keeps its structure,
    shapes and dtypes. With `xs=None`, give `length`. `reverse=True` runs from the last
    slice to the first (the `y`s stay in the order of `xs`). The body is traced once and
    compiled once whatever the trip count; `unroll` is accepted for JAX compatibility
    and does not change how it runs. Differentiable in both modes, to any order.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> def cumsum(xs):
    ...     return fg.scan(lambda c, x: (c + x, c + x), 0.0, xs)[1]
    >>> cumsum(np.array([1.0, 2.0, 3.0]))
    array([1., 3., 6.])
    >>> fg.grad(lambda xs: fnp.sum(cumsum(xs)))(np.array([1.0, 2.0, 3.0]))
    array([3., 2., 1.])
    """
    if not isinstance(unroll, bool) and (not isinstance(unroll, int) or unroll < 1):
        raise ValueError(f"scan: unroll must be a positive int or a bool, got {unroll!r}")
    x_leaves, x_tree = flatten(xs)
    x_paths = leaf_paths(xs, "xs")
    x_avals = _avals(x_leaves, x_paths)
    lengths = {}
    for a, p in zip(x_avals, x_paths, strict=True):
        if not a.shape:
            raise ValueError(
                f"scan: {p} is a scalar; every leaf of xs needs a leading axis to scan over"
            )
        lengths[p] = a.shape[0]
    if length is not None:
        if not isinstance(length, int | np.integer) or isinstance(length, bool) or length < 0:
            raise ValueError(f"scan: length must be a non-negative int, got {length!r}")
    if len(set(lengths.values())) > 1 or (
        length is not None and lengths and set(lengths.values()) != {int(length)}
    ):
        sizes = ", ".join(f"{p}: {n}" for p, n in lengths.items())
        given = f" and length={length}" if length is not None else ""
        raise ValueError(
            f"scan: the leaves of xs must all have the same leading axis{given}, got {sizes}"
        )
    if length is None:
        if not lengths:
            raise ValueError("scan: with xs=None (or no arrays in xs), give length=")
        length = next(iter(lengths.values()))
    length = int(length)
    c_leaves, c_tree = flatten(init)
    c_paths = leaf_paths(init, "carry")
    c_avals = _avals(c_leaves, c_paths)
    slice_avals = [Aval(a.shape[1:], a.dtype) for a in x_avals]
    nc_in = len(c_avals)

    def rebuild(ins: list[Tracer]) -> tuple[Any, Any]:
        return unflatten(c_tree, ins[:nc_in]), unflatten(x_tree, ins[nc_in:])

    hints = [f"c{k}" for k in range(nc_in)] + [f"x{k}" for k in range(len(slice_avals))]
    for _ in range(2):
        graph, captured, (tree, leaves) = _trace(
            lambda c, x: f(c, x), [*c_avals, *slice_avals], hints, rebuild
        )
        if tree.kind not in ("tuple", "list") or len(tree.children) != 2:
            raise TypeError(
                f"scan: the body {name_of(f)} must return a pair (carry, y), got {tree!r}"
            )
        carry_tree, y_tree = tree.children
        promoted = _promote_weak(c_avals, graph.outputs[:nc_in]) if carry_tree == c_tree else None
        if promoted is None:
            break
        c_avals = promoted
    _check_carry("scan", c_tree, carry_tree, c_avals, graph.outputs[:nc_in], c_paths)
    body = _consts_first(graph, nc_in + len(slice_avals))
    call = ScanCall(body, len(captured), nc_in, length, bool(reverse))
    args = [*captured, *_cast(c_leaves, c_avals), *x_leaves]
    outs = bind_outputs(SCAN, call, args, range(len(body.outputs)))
    return unflatten(carry_tree, outs[:nc_in]), unflatten(y_tree, outs[nc_in:])


def _is_static_int(x: Any) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any], init_val: Any) -> Any:
    """`for i in range(lower, upper): val = body_fun(i, val)`, then `val`: JAX's `fori_loop`.

    With static (Python int) bounds it is a `scan` (differentiable in both modes); with
    traced bounds a `while_loop` (forward mode only).

    >>> import fastgrad as fg
    >>> fg.fori_loop(0, 4, lambda i, x: x * 2.0 + i, 1.0)
    array(22.)
    """
    if _is_static_int(lower) and _is_static_int(upper):

        def step(carry: Any, _: Any) -> Any:
            i, val = carry
            return (i + 1, body_fun(i, val)), None

        (_, val), _ = scan(
            step, (int(lower), init_val), None, length=max(int(upper) - int(lower), 0)
        )
        return val
    return while_loop(
        lambda c: c[0] < upper,
        lambda c: (c[0] + 1, body_fun(c[0], c[1])),
        (lower, init_val),
    )[1]


def while_loop(
    cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init_val: Any
) -> Any:
    """`while cond_fun(val): val = body_fun(val)`, then `val`: JAX's `lax.while_loop`.

    `cond_fun` returns a boolean scalar; `body_fun` returns a carry of the structure,
    shapes and dtypes of `init_val`. The trip count may depend on the values. Forward mode
    (`jvp`) works through it; reverse mode raises, as the values a backward pass needs
    are not kept (use `scan` or `fori_loop` with static bounds).

    >>> import fastgrad as fg
    >>> fg.while_loop(lambda x: x < 100.0, lambda x: x * 3.0, 1.0)
    array(243.)
    """
    c_leaves, c_tree = flatten(init_val)
    c_paths = leaf_paths(init_val, "carry")
    c_avals = _avals(c_leaves, c_paths)
    n = len(c_avals)
    rebuild = lambda ins: (unflatten(c_tree, ins),)  # noqa: E731
    hints = [f"c{k}" for k in range(n)]
    for _ in range(2):
        body, body_captured, (tree, _) = _trace(body_fun, c_avals, hints, rebuild)
        promoted = _promote_weak(c_avals, body.outputs) if tree == c_tree else None
        if promoted is None:
            break
        c_avals = promoted
    _check_carry("while_loop", c_tree, tree, c_avals, body.outputs, c_paths)
    cond, cond_captured, (ctree, _) = _trace(cond_fun, c_avals, hints, rebuild)
    out = cond.outputs[0] if ctree.kind == "leaf" else None
    if out is None or out.aval.shape != () or out.aval.dtype != np.bool_:
        got = str(out.aval) if out is not None else repr(ctree)
        raise TypeError(
            f"while_loop: cond_fun {name_of(cond_fun)} must return a boolean scalar, got {got}"
        )
    call = WhileCall(
        _consts_first(cond, n), _consts_first(body, n), len(cond_captured), len(body_captured)
    )
    args = [*cond_captured, *body_captured, *_cast(c_leaves, c_avals)]
    return unflatten(c_tree, bind_outputs(WHILE, call, args, range(n)))


def switch(index: Any, branches: Sequence[Callable[..., Any]], *operands: Any) -> Any:
    """`branches[index](*operands)`, with a traced integer `index` (clamped into range):
    JAX's `lax.switch`. Every branch must return the same structure, shapes and dtypes;
    derivatives flow through the branch taken.

    >>> import fastgrad as fg
    >>> fg.switch(1, [lambda x: x + 1.0, lambda x: x * 10.0], 2.0)
    array(20.)
    """
    if not branches or not all(callable(b) for b in branches):
        raise TypeError("switch: branches must be a non-empty sequence of functions")
    i_aval = leaf_aval(index, "the index")
    if i_aval.shape != () or i_aval.dtype.kind not in "iub":
        raise TypeError(f"switch: the index must be an integer scalar, got {i_aval}")
    return _switch(index, list(branches), operands, "switch")


def cond(
    pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any], *operands: Any
) -> Any:
    """`true_fun(*operands) if pred else false_fun(*operands)` with a traced boolean
    scalar `pred`: JAX's `lax.cond`. Both branches must return the same structure, shapes
    and dtypes; derivatives flow through the branch taken.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> f = lambda x: fg.cond(x > 0, fnp.sin, lambda x: x * x, x)
    >>> float(f(-3.0)), float(fg.grad(f)(-3.0))
    (9.0, -6.0)
    """
    aval = leaf_aval(pred, "the predicate")
    if aval.shape != () or aval.dtype != np.bool_:
        raise TypeError(
            f"cond: the predicate must be a boolean scalar, got {aval}; compare to get one "
            "(x > 0), or use fg.switch with an integer index"
        )
    index = astype(pred, np.int32) if isinstance(pred, Tracer) else np.int32(bool(pred))
    return _switch(index, [false_fun, true_fun], operands, "cond")


class _Shown:
    """A type in an error message, shown without quotes inside the tree it belongs to."""

    def __init__(self, aval: Aval):
        self.aval = aval

    def __repr__(self) -> str:
        return str(Aval(self.aval.shape, self.aval.dtype))


def _switch(
    index: Any, branches: list[Callable[..., Any]], operands: Sequence[Any], what: str
) -> Any:
    leaves, tree = flatten(tuple(operands))
    paths = leaf_paths(tuple(operands), "operands")
    avals = _avals(leaves, paths)
    rebuild = lambda ins: unflatten(tree, ins)  # noqa: E731
    traced = [_trace(b, avals, [f"op{k}" for k in range(len(avals))], rebuild) for b in branches]
    first_tree, first = traced[0][2][0], traced[0][0]
    for k, (g, _, (t, _)) in enumerate(traced[1:], 1):
        shown = [_Shown(v.aval) for v in g.outputs]
        want = [_Shown(v.aval) for v in first.outputs]
        strip = lambda g: [(v.aval.shape, v.aval.dtype) for v in g.outputs]  # noqa: E731
        if t != first_tree or strip(g) != strip(first):
            names = ("false_fun", "true_fun") if what == "cond" else ("branch 0", f"branch {k}")
            raise TypeError(
                f"{what}: the branches must return the same structure, shapes and dtypes, "
                f"but {names[0]} returns {unflatten(first_tree, want)} and {names[1]} "
                f"returns {unflatten(t, shown)}"
            )
    # Every branch takes all the values any branch closed over, then the operands.
    consts: list[Tracer] = []
    for _, captured, _ in traced:
        consts += [c for c in captured if all(c is not d for d in consts)]
    n = len(avals)
    graphs = []
    for g, captured, _ in traced:
        by_id = {id(c): v for c, v in zip(captured, g.inputs[n:], strict=True)}
        ins = [by_id.get(id(c)) or Var(c.aval) for c in consts]
        graphs.append(Graph([*ins, *g.inputs[:n]], g.nodes, g.outputs))
    call = SwitchCall(graphs)
    args = [
        astype(index, np.int32) if isinstance(index, Tracer) else np.int32(index),
        *consts,
        *leaves,
    ]
    outs = bind_outputs(SWITCH, call, args, range(len(first.outputs)))
    return unflatten(first_tree, outs)


def checkpoint(fun: Callable[..., Any]) -> Callable[..., Any]:
    """`fun`, differentiated by recomputing its values in the backward pass instead of
    storing them: JAX's `checkpoint` (`remat`). Only its inputs are kept; inside `scan`
    this bounds what a long loop stores per step to the body's inputs.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> f = fg.checkpoint(lambda x: fnp.sin(fnp.sin(x)))
    >>> float(fg.grad(f)(0.0))
    1.0
    """

    @functools.wraps(fun)
    def rematerialized(*args: Any) -> Any:
        leaves, tree = flatten(args)
        paths = leaf_paths(args, "args")
        avals = _avals(leaves, paths)
        rebuild = lambda ins: unflatten(tree, ins)  # noqa: E731
        graph, captured, (out_tree, _) = _trace(
            fun, avals, [f"a{k}" for k in range(len(avals))], rebuild
        )
        call = RematCall(graph, name_of(fun))
        outs = bind_outputs(REMAT, call, [*leaves, *captured], range(len(graph.outputs)))
        return unflatten(out_tree, outs)

    return rematerialized


remat = checkpoint
