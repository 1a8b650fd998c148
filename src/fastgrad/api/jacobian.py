"""Jacobians of any output shape: jacrev (row by row in reverse mode), jacfwd (column by
column in forward mode), hessian (jacfwd of jacrev), and linearize (a function's value
and its JVP as a function, the primal work done once). Pytrees in and out."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.api.forward import jvp, jvp_inputs, jvp_parts
from fastgrad.api.grad import argnums_key, check_argnums, vjp
from fastgrad.api.jit import Jitted, jit
from fastgrad.api.trace import arg_leaf_names, leaf_aval, name_of, param_names, run, trace_function
from fastgrad.core.ir import Aval, Graph
from fastgrad.core.pytree import TreeDef, flatten, unflatten
from fastgrad.core.tracing import CONST, Trace, Tracer, bind
from fastgrad.ops.base import astype, reshape
from fastgrad.ops.shape import stack


def _split_args(
    fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], argnums: Any, what: str
) -> tuple[tuple[Any, ...], Callable[..., Any], list[Aval], TreeDef]:
    """The differentiated arguments, `fun` as a function of them alone, their leaves' types
    (float, or a clear error) and the structure a Jacobian's input part takes."""
    nums = check_argnums(argnums, len(args), fun)
    diff = tuple(args[i] for i in nums)

    def partial(*d: Any) -> Any:
        full = list(args)
        for i, x in zip(nums, d, strict=True):
            full[i] = x
        return fun(*full, **kwargs)

    functools.update_wrapper(partial, fun, updated=())
    names = arg_leaf_names(diff, [param_names(fun, len(args))[i] for i in nums])
    avals = [leaf_aval(x, n) for x, n in zip(flatten(diff)[0], names, strict=True)]
    for aval, n in zip(avals, names, strict=True):
        if not aval.is_float:
            raise TypeError(
                f"{what} needs float arguments to differentiate, but argument {n} has dtype "
                f"{aval.dtype}; pass integer arguments outside argnums"
            )
    in_tree = flatten(diff[0] if isinstance(argnums, int) else diff)[1]
    return diff, partial, avals, in_tree


def _check_float_outputs(leaves: Sequence[Any], what: str, fun: Any) -> None:
    for k, leaf in enumerate(leaves):
        if leaf_aval(leaf, "output").dtype.kind != "f":
            raise TypeError(
                f"{what} needs float outputs, but output leaf {k} of {name_of(fun)} has dtype "
                f"{leaf_aval(leaf, 'output').dtype}"
            )


def _basis(avals: Sequence[Aval], j: int, p: int) -> list[np.ndarray]:
    """Zeros of `avals`, with a 1 at flat position p of leaf j."""
    leaves = [np.zeros(a.shape, a.dtype) for a in avals]
    leaves[j].reshape(-1)[p] = 1
    return leaves


def _assemble(
    parts: list[list[list[Any]]], out_avals: Sequence[Aval], in_avals: Sequence[Aval], rows: bool
) -> list[list[Any]]:
    """blocks[i][j] of shape out_i + in_j, from per-position pieces: parts[i][j] holds, for
    each flat position of out i (rows) or of in j (columns), an array of in_j's (or out_i's)
    shape."""
    blocks = []
    for i, oa in enumerate(out_avals):
        row = []
        for j, ia in enumerate(in_avals):
            shape = oa.shape + ia.shape
            dtype = ia.dtype if rows else oa.dtype
            pieces = parts[i][j]
            if not pieces:
                row.append(np.zeros(shape, dtype))
                continue
            block = reshape(stack(pieces, axis=0 if rows else -1), shape)
            row.append(astype(block, dtype))
        blocks.append(row)
    return blocks


def jacrev(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """A function returning the Jacobian of `fun` in the arguments `argnums`, by reverse
    mode: one VJP per output element (so best for few outputs).

    For an output leaf of shape O and an argument leaf of shape I the block has shape O + I;
    pytrees nest as JAX's do: the output's structure outside, the argument's inside (a tuple
    of them for a tuple `argnums`). With `has_aux=True`, `fun` returns (out, aux) and the
    result is (jacobian, aux). `fg.jacobian` is the same function.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> fg.jacrev(lambda x: x[:2] * x[1:])(np.array([1.0, 2.0, 3.0]))
    array([[2., 1., 0.],
           [0., 3., 2.]])
    """

    return _jacrev(fun, argnums, has_aux, "jacrev")


def _jacrev(fun: Callable[..., Any], argnums: Any, has_aux: bool, what: str) -> Callable[..., Any]:
    compiled_row = None
    if isinstance(fun, Jitted):
        # Row by row, each a call of one compiled VJP (jitting the whole loop would inline
        # a copy of the backward pass per row).
        fun.check_transform(what, argnums)
        compiled_row = fun.derived(
            (what, "row", argnums_key(argnums), has_aux),
            lambda f: _row_function(f, argnums, has_aux, what),
            f"{what} row",
            shift=1,
        )

    @functools.wraps(fun, updated=())
    def jacrev_fun(*args: Any, **kwargs: Any) -> Any:
        diff, partial, in_avals, in_tree = _split_args(fun, args, kwargs, argnums, what)
        if compiled_row is None:
            out, vjp_fn, *aux = vjp(partial, *diff, has_aux=has_aux)
        else:
            out, *aux = _split_aux(fun(*args, **kwargs), has_aux, fun)

            def vjp_fn(ct: Any) -> Any:
                return compiled_row(ct, *args, **kwargs)

        out_leaves, out_tree = flatten(out)
        _check_float_outputs(out_leaves, what, fun)
        out_avals = [leaf_aval(x, "output") for x in out_leaves]
        parts: list[list[list[Any]]] = [[[] for _ in in_avals] for _ in out_avals]
        for i, oa in enumerate(out_avals):
            for p in range(oa.size):
                grads = flatten(vjp_fn(unflatten(out_tree, _basis(out_avals, i, p))))[0]
                for j, g in enumerate(grads):
                    parts[i][j].append(g)
        blocks = _assemble(parts, out_avals, in_avals, rows=True)
        jac = unflatten(out_tree, [unflatten(in_tree, row) for row in blocks])
        return (jac, aux[0]) if has_aux else jac

    return jacrev_fun


jacobian = jacrev


def _row_function(f: Callable[..., Any], argnums: Any, has_aux: bool, what: str) -> Any:
    """`row(ct, *args, **kwargs)`: the VJP of `f` in `argnums` with cotangent `ct`."""

    def row(ct: Any, *args: Any, **kwargs: Any) -> Any:
        diff, partial, _, _ = _split_args(f, args, kwargs, argnums, what)
        return vjp(partial, *diff, has_aux=has_aux)[1](ct)

    return row


def _column_function(f: Callable[..., Any], argnums: Any, has_aux: bool, what: str) -> Any:
    """`column(basis, *args, **kwargs)`: `f`'s output and its JVP in `argnums` along
    `basis` (and its aux), as `fg.jvp` returns them."""

    def column(basis: Any, *args: Any, **kwargs: Any) -> Any:
        diff, partial, _, _ = _split_args(f, args, kwargs, argnums, what)
        return jvp(partial, diff, basis, has_aux=has_aux)

    return column


def _split_aux(result: Any, has_aux: bool, fun: Any) -> tuple[Any, ...]:
    if not has_aux:
        return (result,)
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise TypeError(f"with has_aux=True, {name_of(fun)} must return a pair (out, aux)")
    return tuple(result)


def jacfwd(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """A function returning the Jacobian of `fun` in the arguments `argnums`, by forward
    mode: one JVP per input element (so best for few inputs). Same shapes and nesting as
    `jacrev`; the JVP is traced once and run for each column.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> fg.jacfwd(lambda x: fnp.stack([fnp.sum(x), x[0] * x[1]]))(np.array([2.0, 3.0]))
    array([[1., 1.],
           [3., 2.]])
    """

    column = _compiled_columns(fun, argnums, has_aux, "jacfwd", lambda f: f)
    return _jacfwd(fun, argnums, has_aux, "jacfwd", column)


def _compiled_columns(
    fun: Any, argnums: Any, has_aux: bool, what: str, inner: Callable[[Any], Any]
) -> Any:
    """For a jitted `fun`, the compiled column function of `inner(fun)` (made once; each
    column is a call of it, as jitting the whole loop would inline a copy per column)."""
    if not isinstance(fun, Jitted):
        return None
    fun.check_transform(what, argnums)
    return fun.derived(
        (what, "column", argnums_key(argnums), has_aux),
        lambda f: _column_function(inner(f), argnums, has_aux, what),
        f"{what} column",
        shift=1,
    )


def _jacfwd(
    fun: Callable[..., Any], argnums: Any, has_aux: bool, what: str, compiled_column: Any
) -> Callable[..., Any]:
    @functools.wraps(fun, updated=())
    def jacfwd_fun(*args: Any, **kwargs: Any) -> Any:
        diff, partial, in_avals, in_tree = _split_args(fun, args, kwargs, argnums, what)
        leaves, diff_tree = flatten(diff)
        if compiled_column is not None:

            def run_column(basis: list[np.ndarray]) -> Any:
                return compiled_column(unflatten(diff_tree, basis), *args, **kwargs)

        else:  # traced once, run per column
            names = [f"x{k}" for k in range(len(leaves))]
            column = trace_function(
                lambda d, v: jvp(partial, d, v, has_aux=has_aux),
                (diff, diff),
                names + [f"d{n}" for n in names],
                lambda t: t,
                f"{what} of {name_of(fun)}",
            )

            def run_column(basis: list[np.ndarray]) -> Any:
                outs = run(column.graph, [*leaves, *basis, *column.captured])
                return unflatten(column.out_tree, outs)

        first = None
        parts: list[list[list[Any]]] | None = None
        for j, ia in enumerate(in_avals):
            for p in range(ia.size):
                result = run_column(_basis(in_avals, j, p))
                first = first or result
                tangents = flatten(result[1])[0]
                if parts is None:
                    parts = [[[] for _ in in_avals] for _ in tangents]
                for i, t in enumerate(tangents):
                    parts[i][j].append(t)
        if first is None:  # no input elements: one run for the output's types
            first = run_column([np.zeros(a.shape, a.dtype) for a in in_avals])
        out_leaves, out_tree = flatten(first[0])
        _check_float_outputs(out_leaves, what, fun)
        out_avals = [leaf_aval(x, "output") for x in out_leaves]
        if parts is None:
            parts = [[[] for _ in in_avals] for _ in out_avals]
        blocks = _assemble(parts, out_avals, in_avals, rows=False)
        jac = unflatten(out_tree, [unflatten(in_tree, row) for row in blocks])
        return (jac, first[2]) if has_aux else jac

    return jacfwd_fun


def hessian(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """The Hessian of `fun` in `argnums`: `jacfwd(jacrev(fun, argnums), argnums)`.

    For a scalar `fun` of one array argument of shape S it has shape S + S; in general an
    output leaf of shape O gives blocks O + S_i + S_j, nested as output tree, then argument
    tree twice (`h[i][j]` for leaves i, j). Each column is a Hessian-vector product by
    forward-over-reverse; for the product with one vector, without building the Hessian,
    use that directly: `fg.jvp(fg.grad(f), (x,), (v,))[1]`. If `fun` is jitted, each
    column is a call of that product, compiled once.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> f = lambda x: fnp.sum(x ** 3)
    >>> x = np.array([1.0, 2.0])
    >>> fg.hessian(f)(x)
    array([[ 6.,  0.],
           [ 0., 12.]])
    >>> fg.jvp(fg.grad(f), (x,), (np.array([1.0, 1.0]),))[1]  # H @ v, H never built
    array([ 6., 12.])
    """

    # With has_aux, jacfwd passes on the aux that the inner jacrev returns beside its result.
    def inner(f: Callable[..., Any]) -> Callable[..., Any]:
        return _jacrev(f, argnums, has_aux, "hessian")

    column = _compiled_columns(fun, argnums, has_aux, "hessian", inner)
    return _jacfwd(inner(fun), argnums, has_aux, "hessian", column)


def linearize(fun: Callable[..., Any], *primals: Any, has_aux: bool = False) -> Any:
    """`fun(*primals)` and a function computing its JVP at `primals`: `f_jvp(*tangents)`
    equals `fg.jvp(fun, primals, tangents)[1]`, but everything that depends on the primals
    alone is computed once here, so each call does only the linear work. Wrap `f_jvp` in
    `fg.jit` to compile it (it is, when `fun` is jitted). With `has_aux=True`, `fun` returns
    (out, aux) and the result is (out, f_jvp, aux).

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> out, f_jvp = fg.linearize(fnp.sin, np.array([0.0, np.pi]))
    >>> f_jvp(np.array([1.0, 2.0]))
    array([ 1., -2.])
    """
    traced, forward, p_leaves, _, out_tree, aux_tree = jvp_parts(fun, primals, primals, has_aux)
    n_all, n_out = len(traced.graph.outputs), out_tree.num_leaves
    concrete = [*p_leaves, *traced.captured]
    in_avals = [leaf_aval(x, "primal") for x in p_leaves]
    if any(isinstance(x, Tracer) for x in concrete):
        # Traced primals (linearize inside jit or grad): nothing to compute ahead of time.
        outs = run(forward, [*concrete, *[np.zeros(a.shape, a.dtype) for a in in_avals]])
        linear = None
    else:
        outs, linear = _partial_eval(forward, concrete, in_avals, n_all)

    def f_jvp(*tangents: Any) -> Any:
        _, _, t_leaves, _ = jvp_inputs(fun, primals, tangents)
        if linear is None:
            result = run(forward, [*concrete, *t_leaves])[n_all:]
        else:
            result = run(linear, t_leaves)
        return unflatten(out_tree, result)

    if isinstance(fun, Jitted):
        f_jvp = jit(f_jvp, fuse=fun.fuse)  # type: ignore[assignment]
    out = unflatten(out_tree, outs[:n_out])
    if aux_tree is None:
        return out, f_jvp
    return out, f_jvp, unflatten(aux_tree, outs[n_out:n_all])


def _partial_eval(
    graph: Graph, concrete: list[Any], tangent_avals: list[Aval], n_out: int
) -> tuple[list[Any], Graph]:
    """Run a JVP graph on concrete primals with the tangents left symbolic: the primal
    outputs are computed now, and the tangent outputs become a graph of the tangents alone
    (with what it needs from the primals as constants)."""
    with Trace() as trace:
        tangents = [trace.new_input(a, f"t{k}") for k, a in enumerate(tangent_avals)]
        env = {id(v): x for v, x in zip(graph.inputs, [*concrete, *tangents], strict=True)}
        for node in graph.nodes:
            args = [env[id(v)] for v in node.inputs]
            env[id(node.out)] = (
                node.params["value"] if node.op is CONST else bind(node.op, *args, **node.params)
            )
        outs = [env[id(v)] for v in graph.outputs]
    return [np.asarray(o) for o in outs[:n_out]], trace.to_graph(outs[n_out:])
