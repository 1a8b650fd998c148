"""Forward mode for users: jvp (Jacobians, hessian and linearize are in
fastgrad.api.jacobian).

As in fastgrad.api.grad, a jitted function's jvp is jitted too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastgrad.api.jit import Jitted
from fastgrad.api.trace import leaf_aval, name_of, param_names, run, trace_function
from fastgrad.core.pytree import flatten, leaf_paths, unflatten
from fastgrad.ops.base import astype
from fastgrad.transforms.forward import jvp_graph


def jvp_inputs(
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

    >>> import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
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
    traced, forward, p_leaves, t_leaves, out_tree, aux_tree = jvp_parts(
        fun, primals, tangents, has_aux
    )
    n_out = len(traced.graph.outputs)
    outs = run(forward, [*p_leaves, *traced.captured, *t_leaves])
    out = unflatten(out_tree, outs[: out_tree.num_leaves])
    tangent_out = unflatten(out_tree, outs[n_out:])
    if aux_tree is not None:
        aux = unflatten(aux_tree, outs[out_tree.num_leaves : n_out])
        return out, tangent_out, aux
    return out, tangent_out


def jvp_parts(fun: Callable[..., Any], primals: Any, tangents: Any, has_aux: bool) -> Any:
    """`fun` traced at checked `primals` and its JVP graph (inputs: primal leaves, captured
    tracers, tangent leaves; outputs: all of fun's leaves, then the tangents of its output
    leaves): (traced, jvp graph, primal leaves, tangent leaves, output tree, aux tree or
    None)."""
    tree, p_leaves, t_leaves, paths = jvp_inputs(fun, primals, tangents)
    traced = trace_function(
        lambda *a: fun(*a), unflatten(tree, p_leaves), paths, list, name_of(fun)
    )
    out_tree, aux_tree = traced.out_tree, None
    if has_aux:
        if out_tree.kind not in ("tuple", "list") or len(out_tree.children) != 2:
            raise TypeError(
                f"with has_aux=True, {name_of(fun)} must return a pair (out, aux), got "
                f"structure {out_tree!r}"
            )
        out_tree, aux_tree = out_tree.children
    forward = jvp_graph(traced.graph, range(len(p_leaves)), range(out_tree.num_leaves))
    return traced, forward.verify(), p_leaves, t_leaves, out_tree, aux_tree
