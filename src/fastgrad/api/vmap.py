"""vmap: map a function over an axis of its arguments, as one batched graph.

The function is traced once, on one example (its arguments without the mapped axes); the
graph is batched by fastgrad.transforms.batching and runs like any graph: with NumPy on
concrete arrays, inlined into the enclosing trace otherwise, so vmap composes with jit,
grad, jvp and itself. A vmap of a jitted function is jitted too (`Jitted.derived`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.api.jit import Jitted
from fastgrad.api.trace import leaf_aval, name_of, param_names, run, trace_avals
from fastgrad.core.ir import Aval
from fastgrad.core.pytree import flatten, leaf_paths, unflatten
from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import with_batch
from fastgrad.ops.shape import transpose
from fastgrad.transforms.batching import batch_graph


def _is_axis(spec: Any) -> bool:
    return spec is None or (isinstance(spec, int | np.integer) and not isinstance(spec, bool))


def _kind(x: Any) -> str:
    if isinstance(x, dict):
        return f"a dict with keys {sorted(x, key=repr)}"
    if isinstance(x, tuple | list):
        return f"a {type(x).__name__} of {len(x)}"
    return "a single array"


def prefix_axes(spec: Any, tree: Any, what: str) -> list[int | None]:
    """One axis (or None) per leaf of `tree`, from `spec`: an int or None for a whole
    subtree, or a container of the same structure as `tree` down to there (JAX's pytree
    prefixes)."""
    if _is_axis(spec):
        return [None if spec is None else int(spec)] * len(flatten(tree)[0])
    if isinstance(spec, dict) and isinstance(tree, dict) and set(spec) == set(tree):
        keys = sorted(tree)
        return [a for k in keys for a in prefix_axes(spec[k], tree[k], f"{what}[{k!r}]")]
    if (
        isinstance(spec, tuple | list)
        and type(spec) is type(tree)
        and not isinstance(spec, dict)
        and len(spec) == len(tree)
    ):
        return [
            a for i, (s, t) in enumerate(zip(spec, tree, strict=True))
            for a in prefix_axes(s, t, f"{what}[{i}]")
        ]  # fmt: skip
    if not isinstance(spec, tuple | list | dict):
        raise TypeError(f"vmap: {what} is {spec!r}; an axis is an int or None")
    raise ValueError(
        f"vmap: {what} is {_kind(spec)} ({spec!r}), but the value it describes is "
        f"{_kind(tree)}: give one int or None for the whole value, or a container of the "
        "same structure"
    )


def _freeze(spec: Any) -> Any:
    """A hashable form of an axes spec (a cache key)."""
    if isinstance(spec, dict):
        return ("dict", tuple(sorted((k, _freeze(v)) for k, v in spec.items())))
    if isinstance(spec, tuple | list):
        return (type(spec).__name__, tuple(_freeze(s) for s in spec))
    return spec


def _moveaxis(x: Any, source: int, destination: int) -> Any:
    order = list(range(aval_of(x).ndim))
    order.insert(destination, order.pop(source))
    return transpose(x, order)


def _batch_size(sizes: Sequence[tuple[str, int, int]], axis_size: int | None, fun_name: str) -> int:
    if axis_size is not None:
        for path, axis, n in sizes:
            if n != axis_size:
                raise ValueError(
                    f"vmap({fun_name}): argument {path} has size {n} along its mapped axis "
                    f"{axis}, but axis_size is {axis_size}"
                )
        return int(axis_size)
    if not sizes:
        raise ValueError(
            f"vmap({fun_name}): no argument is mapped (in_axes is None for all of them); "
            "pass axis_size=n to repeat the function n times"
        )
    path, axis, n = sizes[0]
    for other, other_axis, m in sizes[1:]:
        if m != n:
            raise ValueError(
                f"vmap({fun_name}): the mapped axes have different sizes: argument {path} has "
                f"size {n} along axis {axis}, argument {other} has size {m} along axis "
                f"{other_axis}; every mapped axis must have the same size"
            )
    return n


def _call(fun: Callable[..., Any], in_axes: Any, out_axes: Any, axis_size: Any, args: Any) -> Any:
    fun_name = name_of(fun)
    names = param_names(fun, len(args))
    if isinstance(in_axes, tuple):
        if len(in_axes) != len(args):
            raise ValueError(
                f"vmap({fun_name}): in_axes has {len(in_axes)} entries, but {fun_name} was "
                f"called with {len(args)} positional arguments; give one entry per argument "
                "(an int, None, or a pytree of them matching the argument)"
            )
        specs = in_axes
    else:
        specs = (in_axes,) * len(args)
    paths: list[str] = []
    axes: list[int | None] = []
    for arg, name, spec in zip(args, names, specs, strict=True):
        paths += leaf_paths(arg, name)
        axes += prefix_axes(spec, arg, f"in_axes for argument {name}")
    leaves, tree = flatten(tuple(args))
    avals, sizes, moved = [], [], []
    for leaf, path, axis in zip(leaves, paths, axes, strict=True):
        aval = leaf_aval(leaf, f"argument {path}")
        if axis is None:
            avals.append(aval)
            moved.append(leaf)
            continue
        if not -aval.ndim <= axis < aval.ndim:
            raise ValueError(
                f"vmap({fun_name}): in_axes maps axis {axis} of argument {path}, which has "
                f"shape {aval.shape} (no axis {axis}); map an existing axis or give None"
            )
        axis %= aval.ndim
        sizes.append((path, axis, aval.shape[axis]))
        avals.append(Aval(aval.shape[:axis] + aval.shape[axis + 1 :], aval.dtype))
        moved.append(_moveaxis(leaf, axis, 0))
    size = _batch_size(sizes, axis_size, fun_name)
    traced = trace_avals(lambda *a: fun(*a), avals, tree, paths, list, fun_name)
    batched = [a is not None for a in axes] + [False] * len(traced.captured)
    graph, out_batched = batch_graph(traced.graph, batched, size)
    outs = run(graph, [*moved, *traced.captured])
    example = unflatten(traced.out_tree, range(len(outs)))
    out_specs = prefix_axes(out_axes, example, "out_axes")
    results = []
    for out, has_batch, axis, path in zip(
        outs, out_batched, out_specs, leaf_paths(example, "output"), strict=True
    ):
        if axis is None:
            if has_batch:
                raise ValueError(
                    f"vmap({fun_name}): out_axes is None for {path}, but it depends on the "
                    "mapped arguments, so it differs across the batch; give it an axis"
                )
            results.append(out)
            continue
        ndim = aval_of(out).ndim + (0 if has_batch else 1)
        if not -ndim <= axis < ndim:
            raise ValueError(
                f"vmap({fun_name}): out_axes puts the batch at axis {axis} of {path}, which "
                f"has {ndim} axes with the batch (one example: {ndim - 1})"
            )
        if not has_batch:  # the same for every example: repeated along the batch
            out = with_batch(out, size)
            out = out if isinstance(out, Tracer) else np.array(out)
        results.append(_moveaxis(out, 0, axis % ndim))
    return unflatten(traced.out_tree, results)


def vmap(
    fun: Callable[..., Any],
    in_axes: Any = 0,
    out_axes: Any = 0,
    axis_size: int | None = None,
) -> Callable[..., Any]:
    """`fun` mapped over an axis of its arguments: one traced, batched computation, not a
    Python loop (elementwise work stays one fused loop, a product with a shared matrix one
    BLAS call).

    `in_axes` gives the mapped axis of each positional argument: an int (negative counts
    from the end), None for an argument shared by the whole batch, or a pytree of those
    matching the argument; one int or None stands for all arguments. `out_axes` says where
    the batch axis goes in the outputs, in the same way (None for an output that does not
    depend on the mapped arguments). `axis_size` is the batch size when no argument is
    mapped. Composes with jit, grad, jvp, jacfwd, scan, cond, custom_vjp and itself:
    `fg.vmap(fg.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)` gives per-example
    gradients.

    >>> import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    >>> fg.vmap(lambda w, x: fnp.dot(w, x), in_axes=(None, 0))(np.ones(3), np.eye(3) * 2)
    array([2., 2., 2.])
    >>> fg.vmap(lambda x: x.sum(), in_axes=1)(np.arange(6.0).reshape(2, 3))
    array([3., 5., 7.])
    """
    if not callable(fun):
        raise TypeError(f"vmap expects a function, got {type(fun).__name__}")
    if isinstance(in_axes, list):  # as in JAX, a list of axes means one per argument
        in_axes = tuple(in_axes)
    if not (_is_axis(in_axes) or isinstance(in_axes, tuple)):
        raise TypeError(
            f"vmap: in_axes must be an int, None, or a tuple with one entry per argument, "
            f"got {in_axes!r}"
        )
    if axis_size is not None and (not isinstance(axis_size, int) or axis_size < 0):
        raise TypeError(f"vmap: axis_size must be a non-negative int, got {axis_size!r}")
    if isinstance(fun, Jitted):
        jitted = fun
        jitted.check_transform("vmap")
        key = ("vmap", _freeze(in_axes), _freeze(out_axes), axis_size)

        def make(f: Callable[..., Any]) -> Callable[..., Any]:
            return vmap(f, in_axes, out_axes, axis_size)

        def batched_jitted(*args: Any) -> Any:
            return jitted.derived(key, make, "vmap", shift=None)(*args)

        return batched_jitted

    @functools.wraps(fun)
    def batched(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError(
                f"vmap({name_of(fun)}): pass the arguments by position (keyword arguments "
                f"{sorted(kwargs)} have no entry in in_axes)"
            )
        return _call(fun, in_axes, out_axes, axis_size, args)

    return batched
