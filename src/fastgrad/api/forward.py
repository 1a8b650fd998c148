"""Forward mode for users: jvp, and hessian (forward over reverse).

As in fastgrad.api.grad, a jitted function's jvp is jitted too; its hessian runs one
jitted Hessian-vector product per column.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.api.grad import argnums_key, check_argnums, grad, vjp_parts
from fastgrad.api.jit import Jitted
from fastgrad.api.trace import arg_leaf_names, leaf_aval, name_of, param_names, run, trace_function
from fastgrad.core.pytree import flatten, leaf_paths, unflatten
from fastgrad.ops.base import astype, reshape
from fastgrad.ops.shape import stack
from fastgrad.transforms.forward import jvp_graph


def _jvp_inputs(
    fun: Any, primals: Any, tangents: Any
) -> tuple[Any, list[Any], list[Any], list[str]]:
    """Checked primals and tangents: the primal tree, its leaves, the tangent leaves (cast to
    the primals' dtypes) and readable leaf paths."""
    for what, value in (("primals", primals), ("tangents", tangents)):
        if not isinstance(value, tuple | list):
            raise TypeError(
                f"jvp: {what} must be a tuple or list with one entry per argument of "
                f"{name_of(fun)}, got {type(value).__name__}; write fg.jvp(f, (x,), (v,))"
            )
    if len(primals) != len(tangents):
        raise ValueError(
            f"jvp: got {len(primals)} primal(s) but {len(tangents)} tangent(s); pass one "
            "tangent per primal, of the same structure"
        )
    if not primals:
        raise TypeError("jvp needs at least one primal argument")
    names = param_names(fun, len(primals))
    p_leaves: list[Any] = []
    t_leaves: list[Any] = []
    paths: list[str] = []
    for name, p, t in zip(names, primals, tangents, strict=True):
        pl, pt = flatten(p)
        tl, tt = flatten(t)
        if pt != tt:
            raise ValueError(
                f"jvp: the tangent for argument {name} has structure {tt!r}, its primal {pt!r}"
            )
        p_leaves += pl
        t_leaves += tl
        paths += leaf_paths(p, name)
    for k, (p, t, where) in enumerate(zip(p_leaves, t_leaves, paths, strict=True)):
        pa = leaf_aval(p, f"argument {where}")
        if not pa.is_float:
            raise TypeError(
                f"jvp needs float primals, but argument {where} has dtype {pa.dtype}. Integer "
                "and boolean values carry no tangent: close over them instead, as in "
                "fg.jvp(lambda x: f(x, labels), (x,), (v,))."
            )
        ta = leaf_aval(t, f"the tangent for {where}")
        if ta.shape != pa.shape:
            raise ValueError(
                f"jvp: the tangent for {where} has shape {ta.shape}, its primal {pa.shape}; "
                "they must match"
            )
        if ta.dtype != pa.dtype and not ta.weak:
            raise TypeError(
                f"jvp: the tangent for {where} has dtype {ta.dtype}, its primal {pa.dtype}; "
                f"they must match (convert it with .astype(np.{pa.dtype.name}))"
            )
        # Primal and tangent are weakly typed only if both are Python scalars; else both
        # are strong, so that tangents promote exactly like their primals.
        weak = pa.weak and ta.weak
        if pa.weak and not weak:
            p_leaves[k] = astype(p, pa.dtype)
        if ta.dtype != pa.dtype or (ta.weak and not weak):
            t_leaves[k] = astype(t, pa.dtype)
    return flatten(tuple(primals))[1], p_leaves, t_leaves, paths


def jvp(fun: Callable[..., Any], primals: Any, tangents: Any, has_aux: bool = False) -> Any:
    """`fun(*primals)` and its Jacobian-vector product with `tangents` (forward mode).

    `primals` and `tangents` are tuples with one entry per positional argument of `fun`;
    each tangent has its primal's structure, shapes and float dtypes. Returns
    `(out, tangent_out)`, the tangent with the output's structure (zeros where the output
    does not depend on the tangents). With `has_aux=True`, `fun` returns `(out, aux)` and
    the result is `(out, tangent_out, aux)`. Composes with jit, grad and itself; a
    stop_gradient'ed value has a zero tangent. `fg.jvp(fg.grad(f), (x,), (v,))[1]` is a
    Hessian-vector product that never builds the Hessian.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> fg.jvp(lambda x: x * x, (np.array([1.0, 2.0]),), (np.array([1.0, 0.5]),))
    (array([1., 4.]), array([2., 2.]))
    >>> fg.jvp(lambda x: x * fg.stop_gradient(x), (3.0,), (1.0,))[1]
    array(3.)
    """
    if isinstance(fun, Jitted):
        fun.check_transform("jvp")

        def make(f: Callable[..., Any]) -> Callable[..., Any]:
            def jvp_of(primals: Any, tangents: Any) -> Any:
                return jvp(f, primals, tangents, has_aux)

            return jvp_of

        return fun.derived(("jvp", has_aux), make, "jvp", shift=None)(primals, tangents)
    tree, p_leaves, t_leaves, paths = _jvp_inputs(fun, primals, tangents)
    traced = trace_function(
        lambda *a: fun(*a), unflatten(tree, p_leaves), paths, list, name_of(fun)
    )
    out_tree = traced.out_tree
    if has_aux:
        if out_tree.kind not in ("tuple", "list") or len(out_tree.children) != 2:
            raise TypeError(
                f"with has_aux=True, {name_of(fun)} must return a pair (out, aux), got "
                f"structure {out_tree!r}"
            )
        out_tree = out_tree.children[0]
    n_out = len(traced.graph.outputs)
    forward = jvp_graph(traced.graph, range(len(p_leaves)), range(out_tree.num_leaves))
    forward.verify()
    outs = run(forward, [*p_leaves, *traced.captured, *t_leaves])
    out = unflatten(out_tree, outs[: out_tree.num_leaves])
    tangent_out = unflatten(out_tree, outs[n_out:])
    if has_aux:
        aux = unflatten(traced.out_tree.children[1], outs[out_tree.num_leaves : n_out])
        return out, tangent_out, aux
    return out, tangent_out


def hessian(fun: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """A function returning the Hessian of scalar-valued `fun` with respect to `argnums`.

    For one array argument of shape S the Hessian has shape S + S. For a pytree argument,
    or a tuple `argnums`, it is a tree of trees: `h[i][j]` holds the second derivatives
    in leaves i and j, of shape `shape_i + shape_j`. It is built column by column, each a
    Hessian-vector product by forward-over-reverse; for the product with one vector,
    without building the Hessian, use that directly: `fg.jvp(fg.grad(f), (x,), (v,))[1]`.
    If `fun` is jitted, each column is a call of that product, compiled once.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> f = lambda x: fnp.sum(x ** 3)
    >>> x = np.array([1.0, 2.0])
    >>> fg.hessian(f)(x)
    array([[ 6.,  0.],
           [ 0., 12.]])
    >>> fg.jvp(fg.grad(f), (x,), (np.array([1.0, 1.0]),))[1]  # H @ v, H never built
    array([ 6., 12.])
    """
    compiled_hvp = None
    if isinstance(fun, Jitted):
        # Column by column, each a call of one compiled Hessian-vector product (jitting
        # the whole loop would inline a copy of it per column).
        fun.check_transform("hessian", argnums)
        compiled_hvp = fun.derived(
            ("hvp", argnums_key(argnums)), lambda f: _hvp(f, argnums), "hvp", shift=1
        )

    @functools.wraps(fun, updated=())
    def hessian_fun(*args: Any, **kwargs: Any) -> Any:
        nums = check_argnums(argnums, len(args), fun)
        traced, leaves, _ = vjp_parts(fun, args, kwargs, nums, "hessian")
        value = traced.graph.outputs[0].aval if traced.graph.outputs else None
        if traced.out_tree.kind != "leaf" or value is None or value.shape != ():
            shown = value if traced.out_tree.kind == "leaf" else f"a pytree {traced.out_tree!r}"
            raise TypeError(
                f"hessian needs {name_of(fun)} to return a float scalar, got {shown}; reduce "
                "it first (e.g. with fnp.sum), or take Hessian-vector products of one "
                "output with fg.jvp(fg.grad(f), (x,), (v,))"
            )
        if not value.is_float:
            raise TypeError(f"hessian needs {name_of(fun)} to return a float scalar, got {value}")
        diff = tuple(args[i] for i in nums)

        def diff_fun(*d: Any) -> Any:
            full = list(args)
            for i, x in zip(nums, d, strict=True):
                full[i] = x
            return fun(*full, **kwargs)

        if compiled_hvp is None:
            grad_fun = grad(diff_fun, argnums=tuple(range(len(nums))))
            names = arg_leaf_names(diff, [param_names(fun, len(args))[i] for i in nums])
            hvp = trace_function(
                lambda d, v: jvp(grad_fun, d, v)[1],
                (diff, diff),
                names + [f"d{n}" for n in names],
                lambda t: t,
                f"hessian of {name_of(fun)}",
            )

            def column(basis: list[Any]) -> list[Any]:
                return run(hvp.graph, [*leaves, *basis, *hvp.captured])
        else:
            diff_tree = flatten(diff)[1]

            def column(basis: list[Any]) -> list[Any]:
                product = compiled_hvp(unflatten(diff_tree, basis), *args, **kwargs)
                return flatten(product)[0]

        avals = [leaf_aval(x, "argument") for x in leaves]
        # columns[i][j]: d(grad_i)/d(leaf_j[p]) for each flat position p of leaf j.
        columns: list[list[list[Any]]] = [[[] for _ in avals] for _ in avals]
        for j, aj in enumerate(avals):
            for p in range(aj.size):
                basis = [np.zeros(a.shape, a.dtype) for a in avals]
                basis[j].reshape(-1)[p] = 1
                outs = column(basis)
                for i in range(len(avals)):
                    columns[i][j].append(outs[i])

        def block(i: int, j: int) -> Any:
            shape = avals[i].shape + avals[j].shape
            if not columns[i][j]:
                return np.zeros(shape, avals[i].dtype)
            return reshape(stack(columns[i][j], axis=-1), shape)

        tree = flatten(diff[0] if isinstance(argnums, int) else diff)[1]
        n = len(avals)
        return unflatten(tree, [unflatten(tree, [block(i, j) for j in range(n)]) for i in range(n)])

    return hessian_fun


def _hvp(fun: Callable[..., Any], argnums: int | Sequence[int]) -> Callable[..., Any]:
    """`hvp(basis, *args, **kwargs)`: the product of the Hessian of `fun` in `argnums` with
    `basis` (one tangent per differentiated argument), by forward over reverse."""

    def hvp(basis: Any, *args: Any, **kwargs: Any) -> Any:
        nums = check_argnums(argnums, len(args), fun)

        def diff_fun(*d: Any) -> Any:
            full = list(args)
            for i, x in zip(nums, d, strict=True):
                full[i] = x
            return fun(*full, **kwargs)

        grad_fun = grad(diff_fun, argnums=tuple(range(len(nums))))
        return jvp(grad_fun, tuple(args[i] for i in nums), tuple(basis))[1]

    return hvp
