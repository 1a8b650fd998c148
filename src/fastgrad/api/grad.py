"""Reverse mode for users: grad, value_and_grad, vjp, and stop_gradient on pytrees.

Applied to a jitted function, each gives a jitted function (fastgrad.api.jit, `derived`):
compiled and cached like any other, whatever the order of composition.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.api.jit import Jitted
from fastgrad.api.trace import (
    Traced,
    arg_leaf_names,
    leaf_aval,
    name_of,
    note_inlined,
    param_names,
    run,
    trace_function,
)
from fastgrad.core.config import config
from fastgrad.core.interpreter import defer_inline, node_count
from fastgrad.core.ir import Aval, Graph
from fastgrad.core.pytree import TreeDef, flatten, tree_map, unflatten
from fastgrad.core.tracing import current_trace
from fastgrad.ops.base import astype
from fastgrad.ops.elementwise import stop_gradient as stop_gradient_leaf
from fastgrad.transforms.reverse import vjp_graph


def check_argnums(argnums: int | Sequence[int], nargs: int, fun: Any) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums:
        raise ValueError("argnums must name at least one argument")
    for i in nums:
        if not isinstance(i, int):
            raise TypeError(f"argnums must be ints, got {i!r}")
        if not -nargs <= i < nargs:
            raise ValueError(
                f"argnums {i} is out of range: {name_of(fun)} was called with {nargs} positional "
                "argument(s)"
            )
    nums = tuple(i % nargs for i in nums)
    if len(set(nums)) != len(nums):
        raise ValueError(f"argnums {argnums} repeats an argument")
    return nums


def _check_differentiable(aval: Aval, where: str, transform: str) -> None:
    if not aval.is_float:
        raise TypeError(
            f"{transform} needs float arguments to differentiate, but {where} has dtype "
            f"{aval.dtype}. Integer and boolean arrays can be passed in arguments that are not "
            "in argnums; convert to float32/float64 to differentiate."
        )


def vjp_parts(
    fun: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    argnums: tuple[int, ...],
    transform: str = "grad",
) -> tuple[Traced, list[Any], list[TreeDef]]:
    """Trace `fun` in the arguments `argnums` (in that order); the others pass through as
    they are, so concrete ones stay concrete (Python control flow on them works, as in JAX).

    Returns the traced function, the differentiated leaves and each argument's structure.
    """
    names = param_names(fun, len(args))
    diff_args = tuple(args[i] for i in argnums)

    def rebuild(traced_args: tuple[Any, ...]) -> list[Any]:
        full = list(args)
        for i, a in zip(argnums, traced_args, strict=True):
            full[i] = a
        return full

    leaf_names = arg_leaf_names(diff_args, [names[i] for i in argnums])
    leaves, _ = flatten(diff_args)
    for leaf, where in zip(leaves, leaf_names, strict=True):
        _check_differentiable(leaf_aval(leaf, where), f"argument {where}", transform)
    traced = trace_function(
        lambda *a: fun(*a, **kwargs), diff_args, leaf_names, rebuild, name_of(fun)
    )
    return traced, leaves, [flatten(a)[1] for a in diff_args]


def reverse_graph(graph: Graph, n_wrt: int) -> tuple[Graph, str | None]:
    """`vjp_graph` of `graph` for its first `n_wrt` inputs and a cotangent of its first
    output, and the key it is stored under (None: not stored). Inside a trace (a jitted
    function being traced), it is kept on disk by the traced graph (compiler.plan_cache):
    a new process tracing the same function runs no VJP rule. Outside one, each call
    differentiates afresh (nothing is written for functions called eagerly)."""
    key = None
    cached = config.plan_cache and current_trace() is not None
    if cached:  # only then: eager calls never load the compiler
        from fastgrad.compiler import plan_cache
    rules = _rules(graph) if cached and len(graph.nodes) >= plan_cache.MIN_NODES else None
    if rules is not None:
        key = plan_cache.plan_key(graph, "vjp", n_wrt, rules)
        stored = plan_cache.load_graph(key) if key is not None else None
        if stored is not None:
            return stored, key
    backward = vjp_graph(graph, range(n_wrt), seeds=[0]).verify()
    if key is not None:
        plan_cache.save_graph(key, backward)
    return backward, key


def _rules(graph: Graph) -> tuple[Any, ...] | None:
    """Where the VJP rules of `graph`'s ops are defined, or None when one is not
    fastgrad's own (set at run time: a test replacing a rule). The key holds it, so that a
    graph differentiated by a replaced rule is never stored, nor one stored before used."""
    found: dict[str, tuple[str, str, int]] = {}
    for node in graph.nodes:
        op = node.op
        if op.name in found:
            continue
        rule = op.vjp if op.vjp is not None else op.extra.get("call_vjp")
        if rule is None:  # no gradient
            found[op.name] = ("", "", 0)
            continue
        module = getattr(rule, "__module__", None) or ""
        if not module.startswith("fastgrad."):
            return None
        code = getattr(rule, "__code__", None)
        line = code.co_firstlineno if code is not None else 0
        found[op.name] = (module, getattr(rule, "__qualname__", ""), line)
    return tuple(sorted(found.items()))


def argnums_key(argnums: int | Sequence[int]) -> Any:
    """`argnums` in a hashable form that keeps an int apart from a tuple of one."""
    return argnums if isinstance(argnums, int) else tuple(argnums)


def value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """A function returning `fun`'s value and its gradient with respect to `argnums`.

    `fun` must return a float scalar, or `(scalar, aux)` with `has_aux=True`; the result is
    then `((value, aux), grads)`. Gradients have the structure of the differentiated
    arguments; with a tuple `argnums` they come as a tuple. If `fun` is jitted, so is the
    result: `fg.value_and_grad(fg.jit(f))` is `fg.jit(fg.value_and_grad(f))`.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> value, g = fg.value_and_grad(lambda x: fnp.sum(x * x))(np.array([1.0, 2.0]))
    >>> float(value), g
    (5.0, array([2., 4.]))
    """
    if isinstance(fun, Jitted):
        fun.check_transform("value_and_grad", argnums)
        return fun.derived(
            ("value_and_grad", argnums_key(argnums), has_aux),
            lambda f: value_and_grad(f, argnums, has_aux),
            "value_and_grad",
        )

    @functools.wraps(fun, updated=())
    def value_and_grad_fun(*args: Any, **kwargs: Any) -> Any:
        nums = check_argnums(argnums, len(args), fun)
        traced, leaves, trees = vjp_parts(fun, args, kwargs, nums)
        out_leaves = traced.graph.outputs
        if has_aux:
            if traced.out_tree.kind not in ("tuple", "list") or len(traced.out_tree.children) != 2:
                raise TypeError(
                    f"with has_aux=True, {name_of(fun)} must return a pair (value, aux), got "
                    f"structure {traced.out_tree!r}"
                )
            value_tree = traced.out_tree.children[0]
            if value_tree.kind != "leaf":
                raise TypeError(f"the value returned by {name_of(fun)} must be a scalar array")
        elif traced.out_tree.kind != "leaf":
            raise TypeError(
                f"grad needs {name_of(fun)} to return a scalar, got a pytree "
                f"{traced.out_tree!r} (use has_aux=True to return (value, aux))"
            )
        value = out_leaves[0].aval
        if value.shape != () or not value.is_float:
            raise TypeError(
                f"grad needs {name_of(fun)} to return a float scalar, got {value} (shape "
                f"{value.shape}, dtype {value.dtype}); reduce it first, e.g. with fnp.sum"
            )
        backward, key = reverse_graph(traced.graph, len(leaves))
        one = np.ones((), value.dtype)
        inputs = [*leaves, *traced.captured, one]
        trace = current_trace()
        # (jit(value_and_grad(f))): nothing recorded before, and its nodes held back
        first = trace is not None and not trace.nodes and trace.deferred is None
        if first and key is not None:
            outs = defer_inline(backward, inputs)
            note_inlined(key, inputs, outs, node_count(backward))
        else:
            outs = run(backward, inputs)
        n_out = len(out_leaves)
        result = unflatten(traced.out_tree, outs[:n_out])
        grad_leaves = iter(outs[n_out:])
        grads = [
            unflatten(tree, [next(grad_leaves) for _ in range(tree.num_leaves)]) for tree in trees
        ]
        return result, (grads[0] if isinstance(argnums, int) else tuple(grads))

    return value_and_grad_fun


def grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """A function returning the gradient of scalar-valued `fun` with respect to `argnums`.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> fg.grad(lambda x: fnp.sum(fnp.sin(x)))(np.zeros(2))
    array([1., 1.])
    >>> fg.grad(fg.grad(lambda x: x ** 3))(2.0)
    array(12.)
    """
    if isinstance(fun, Jitted):
        fun.check_transform("grad", argnums)
        return fun.derived(
            ("grad", argnums_key(argnums), has_aux), lambda f: grad(f, argnums, has_aux), "grad"
        )
    vg = value_and_grad(fun, argnums, has_aux)

    @functools.wraps(fun, updated=())
    def grad_fun(*args: Any, **kwargs: Any) -> Any:
        (value, grads) = vg(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    return grad_fun


def vjp(fun: Callable[..., Any], *primals: Any, has_aux: bool = False) -> Any:
    """`fun(*primals)` and a function mapping an output cotangent to input cotangents.

    `vjp_fn(ct)` takes `ct` of the output's structure, shapes and dtypes, and returns a tuple
    with one cotangent per primal. With `has_aux=True`, `fun` returns `(out, aux)` and the
    result is `(out, vjp_fn, aux)`.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> out, vjp_fn = fg.vjp(lambda x: x * 3.0, np.array([1.0, 2.0]))
    >>> vjp_fn(np.array([1.0, 10.0]))
    (array([ 3., 30.]),)
    """
    if not primals:
        raise TypeError("vjp needs at least one primal argument")
    if isinstance(fun, Jitted):
        return _vjp_of_jitted(fun, primals, has_aux)
    nums = tuple(range(len(primals)))
    traced, leaves, trees = vjp_parts(fun, primals, {}, nums)
    outs = run(traced.graph, [*leaves, *traced.captured])
    out_tree = traced.out_tree
    aux = None
    n_main = len(outs)
    if has_aux:
        if out_tree.kind not in ("tuple", "list") or len(out_tree.children) != 2:
            raise TypeError(f"with has_aux=True, {name_of(fun)} must return a pair (out, aux)")
        n_main = out_tree.children[0].num_leaves
        aux = unflatten(out_tree.children[1], outs[n_main:])
        out_tree = out_tree.children[0]
    out_avals = [v.aval for v in traced.graph.outputs[:n_main]]
    seeds = [i for i, a in enumerate(out_avals) if a.is_float]

    built: list[Graph] = []  # the backward graph, built on first use (a plain list pickles)

    def backward() -> Graph:
        if not built:
            built.append(vjp_graph(traced.graph, range(len(leaves)), seeds).verify())
        return built[0]

    def vjp_fn(ct: Any) -> tuple[Any, ...]:
        ct_leaves, ct_tree = flatten(ct)
        if ct_tree != out_tree:
            raise ValueError(
                f"vjp_fn: the cotangent's structure {ct_tree!r} differs from the output's "
                f"{out_tree!r}"
            )
        for i, (c, a) in enumerate(zip(ct_leaves, out_avals, strict=True)):
            ca = leaf_aval(c, f"cotangent leaf {i}")
            if ca.shape != a.shape:
                raise ValueError(
                    f"vjp_fn: cotangent leaf {i} has shape {ca.shape}, the output has {a.shape}"
                )
        ct_args = [astype(ct_leaves[i], out_avals[i].dtype) for i in seeds]
        res = run(backward(), [*leaves, *traced.captured, *ct_args])
        grad_leaves = iter(res[len(traced.graph.outputs) :])
        return tuple(unflatten(t, [next(grad_leaves) for _ in range(t.num_leaves)]) for t in trees)

    out = unflatten(out_tree, outs[:n_main])
    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def _vjp_of_jitted(fun: Jitted, primals: tuple[Any, ...], has_aux: bool) -> Any:
    """vjp of a jitted function: the output from its compiled form, and a `vjp_fn` that
    runs the jitted backward pass (which recomputes what it needs of the forward one)."""
    fun.check_transform("vjp")
    out = fun(*primals)
    aux = None
    if has_aux:
        if not isinstance(out, tuple | list) or len(out) != 2:
            raise TypeError(f"with has_aux=True, {fun.label} must return a pair (out, aux)")
        out, aux = out

    def make(f: Callable[..., Any]) -> Callable[..., Any]:
        def backward(primals: tuple[Any, ...], ct: Any) -> Any:
            return vjp(f, *primals, has_aux=has_aux)[1](ct)

        return backward

    backward = fun.derived(("vjp", has_aux), make, "vjp", shift=None)

    def vjp_fn(ct: Any) -> tuple[Any, ...]:
        return backward(primals, ct)  # type: ignore[no-any-return]

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def stop_gradient(x: Any, name: str | None = None) -> Any:
    """The identity going forward; no gradient flows back through it (pytrees too).

    Use it where a value should be treated as a constant by differentiation: the shift in a
    numerically stable softmax, EM responsibilities, samples from a sampler, an adversarial
    perturbation. Integer and boolean leaves pass through; plain arrays are returned as is.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> fg.grad(lambda x: fnp.sum(x * x))(np.array([3.0]))
    array([6.])
    >>> fg.grad(lambda x: fnp.sum(x * fg.stop_gradient(x)))(np.array([3.0]))
    array([3.])
    """
    return tree_map(lambda leaf: stop_gradient_leaf(leaf, name), x)
