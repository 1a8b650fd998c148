"""The user-facing transformations: jit, grad, value_and_grad, vjp, make_graph, stop_gradient.

Each traces the user's function into a graph (frontend), differentiates it (autodiff) where
asked, and runs the result: on concrete arrays through the executor, on tracers by inlining
it into the enclosing trace, which is what lets them compose in any order.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastgrad import numpy as fnp
from fastgrad.autodiff import vjp_graph
from fastgrad.explain import explain
from fastgrad.fusion import partition
from fastgrad.interpreter import eval_graph, run_graph
from fastgrad.ir import Aval, Graph
from fastgrad.passes import simplify
from fastgrad.pytree import TreeDef, builder, flatten, leaf_paths, tree_map, unflatten
from fastgrad.runtime import DEBUG, Executable
from fastgrad.tracing import Trace, Tracer, as_array, is_python_scalar

# ---------------------------------------------------------------- tracing a function


def _identifier(path: str) -> str:
    name = re.sub(r"\W+", "_", path).strip("_")
    return name if name and not name[0].isdigit() else f"x_{name}"


def _signature(leaf: Any) -> Any:
    """What the trace cache keys a leaf by; arrays take the fast path."""
    if type(leaf) is np.ndarray:
        return leaf.shape, leaf.dtype
    if isinstance(leaf, Tracer):
        return leaf.aval
    try:
        return _leaf_aval(leaf, "argument")
    except TypeError:
        return ("unsupported", type(leaf))  # reported, with its name, when traced


def _leaf_aval(leaf: Any, where: str) -> Aval:
    if isinstance(leaf, Tracer):
        return leaf.aval
    arr = as_array(leaf, where)
    return Aval(arr.shape, arr.dtype, weak=is_python_scalar(leaf))


@dataclass
class Traced:
    """A function traced at one input signature."""

    graph: Graph
    out_tree: TreeDef
    captured: list[Tracer]  # tracers of an enclosing trace that the function closed over
    executable: Executable | None = None  # the compiled form, built on first concrete call

    def compiled(self) -> Executable:
        if self.executable is None:
            graph = simplify(self.graph)
            steps = partition(graph)
            if DEBUG:
                print(f"# fastgrad: traced\n{self.graph}\n# fastgrad: simplified\n{graph}")
            self.executable = Executable(graph, steps)
            if DEBUG:
                print(f"# fastgrad: plan\n{explain(self.graph, self.executable)}")
        return self.executable


class Lowered:
    """A function compiled for one signature: its graphs, kernels and an explanation."""

    def __init__(self, traced: Traced):
        self._traced = traced
        self.executable = traced.compiled()

    @property
    def graph(self) -> Graph:
        """The traced graph (forward and, under grad, backward)."""
        return self._traced.graph

    @property
    def kernels(self) -> list[str]:
        """The generated Numba source of every fused loop, in execution order."""
        return [k.source for k in self.executable.kernels]

    def explain(self) -> str:
        """The kernels, the ops in each, what was recomputed, what stop_gradient pruned."""
        return explain(self._traced.graph, self.executable)

    def __repr__(self) -> str:
        return self.explain()


def trace_function(
    fun: Callable[..., Any],
    tree: Any,
    names: Sequence[str],
    rebuild: Callable[[Any], Any],
    fun_name: str,
) -> Traced:
    """Trace `fun(*rebuild(tree'))` where tree' is `tree` with every leaf replaced by a tracer.

    `names` are readable paths of the leaves, used to name graph inputs and in errors.
    """
    leaves, treedef = flatten(tree)
    avals = [_leaf_aval(x, where) for x, where in zip(leaves, names, strict=True)]
    with Trace() as trace:
        tracers = [trace.new_input(a, _identifier(n)) for a, n in zip(avals, names, strict=True)]
        out = fun(*rebuild(unflatten(treedef, tracers)))
        out_leaves, out_tree = flatten(out)
        for i, leaf in enumerate(out_leaves):
            if not isinstance(leaf, Tracer):
                _leaf_aval(leaf, f"output leaf {i} of {fun_name}")
    graph = trace.to_graph(out_leaves)
    graph.verify()
    return Traced(graph, out_tree, list(trace.captured))


def _name(fun: Any) -> str:
    return getattr(fun, "__name__", None) or type(fun).__name__


def _run(graph: Graph, args: Sequence[Any]) -> list[Any]:
    """Run a graph: inline it into a trace if any input is traced, else execute it."""
    if any(isinstance(a, Tracer) for a in args):
        return eval_graph(graph, args)
    return run_graph(graph, [np.asarray(a) for a in args])


def _param_names(fun: Callable[..., Any], nargs: int) -> list[str]:
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(nargs):
        if i < len(params) and params[i].kind in (
            params[i].POSITIONAL_ONLY,
            params[i].POSITIONAL_OR_KEYWORD,
        ):
            names.append(params[i].name)
        else:
            names.append(f"arg{i}")
    return names


def _arg_leaf_names(args: Sequence[Any], names: Sequence[str]) -> list[str]:
    out = []
    for a, n in zip(args, names, strict=True):
        out.extend(leaf_paths(a, n))
    return out


# ---------------------------------------------------------------- jit


class Jitted:
    """A function compiled per input signature (see `jit`)."""

    def __init__(
        self,
        fun: Callable[..., Any],
        static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (),
        fuse: bool = True,
    ):
        if not callable(fun):
            raise TypeError(f"jit expects a function, got {type(fun).__name__}")
        self.fun = fun
        self.fuse = fuse
        # Name and docstring only: copying __dict__ would let a wrapped Jitted's state leak in.
        functools.update_wrapper(self, fun, updated=())
        nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        try:
            sig = inspect.signature(fun).parameters
        except (TypeError, ValueError):
            sig = {}  # type: ignore[assignment]
        for n in names:
            if sig and n not in sig:
                raise ValueError(f"static_argnames: {_name(fun)} has no parameter {n!r}")
        # A static argument may come by position or by name: map each form to the other.
        positional = [
            p.name for p in sig.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        self._static_nums = frozenset(nums) | {
            positional.index(n) for n in names if n in positional
        }
        self._static_names = frozenset(names) | {
            positional[i] for i in nums if -len(positional) <= i < len(positional)
        }
        self._cache: dict[Any, Traced] = {}
        # Calls with only array arguments skip pytree handling: (shapes, dtypes) -> entry.
        self._fast: dict[Any, Traced] = {}

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        if not self._static_nums and not kwargs:  # the common case, kept cheap
            return (args, {}), ((), ())
        nargs = len(args)
        static_pos = {i % nargs for i in self._static_nums if -nargs <= i < nargs}
        dyn_args = tuple(None if i in static_pos else a for i, a in enumerate(args))
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
        static = (
            tuple((i, args[i]) for i in sorted(static_pos)),
            tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static_names)),
        )
        try:
            hash(static)
        except TypeError:
            raise TypeError(
                f"static arguments of {_name(self.fun)} must be hashable, got {static!r}"
            ) from None
        return (dyn_args, dyn_kwargs), static

    def _leaf_names(self, tree: Any) -> list[str]:
        dyn_args, dyn_kwargs = tree
        names = _param_names(self.fun, len(dyn_args))
        return _arg_leaf_names(dyn_args, names) + [
            p for k in sorted(dyn_kwargs) for p in leaf_paths(dyn_kwargs[k], k)
        ]

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Traced, list[Any]]:
        tree, static = self._split(args, kwargs)
        leaves, treedef = flatten(tree)
        key = (treedef, tuple(map(_signature, leaves)), static)
        traced = self._cache.get(key)
        if traced is None:
            leaf_names = self._leaf_names(tree)
            for x, where in zip(leaves, leaf_names, strict=True):
                _leaf_aval(x, where)  # clear errors for unsupported leaves
            static_pos = dict(static[0])

            def rebuild(t: Any) -> Any:
                dyn_args, dyn_kwargs = t
                full = [static_pos.get(i, a) for i, a in enumerate(dyn_args)]
                return full, {**dyn_kwargs, **dict(static[1])}

            traced = trace_function(
                lambda a, k: self.fun(*a, **k), tree, leaf_names, rebuild, _name(self.fun)
            )
            if not traced.captured:  # a closure over outer tracers is valid for one call only
                self._cache[key] = traced
        return traced, leaves

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs and self.fuse:
            try:
                key = tuple([(a.shape, a.dtype) for a in args if type(a) is np.ndarray])
                fast = self._fast.get(key) if len(key) == len(args) else None
            except TypeError:
                fast = None
            if fast is not None:
                return builder(fast.out_tree)(fast.compiled()(args))
        traced, leaves = self._trace(args, kwargs)
        if (
            self.fuse
            and not kwargs
            and not self._static_nums
            and not traced.captured
            and all(type(a) is np.ndarray for a in args)
        ):
            self._fast[tuple((a.shape, a.dtype) for a in args)] = traced
        inputs = [*leaves, *traced.captured]
        if self.fuse and not any(isinstance(a, Tracer) for a in inputs):
            outs = traced.compiled()([np.asarray(a) for a in inputs])
        else:
            outs = _run(traced.graph, inputs)
        return unflatten(traced.out_tree, outs)

    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The traced graph for these arguments."""
        return self._trace(args, kwargs)[0].graph

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """The compiled form for these arguments: `.graph`, `.kernels`, `.explain()`.

        >>> import fastgrad as fg, fastgrad.numpy as fnp
        >>> f = fg.jit(fg.value_and_grad(lambda x: fnp.sum(fnp.sin(x) * x)))
        >>> print(f.lower(np.ones(4)).explain().splitlines()[0])
        1 steps: 1 fused loop(s), 0 library call(s)
        """
        return Lowered(self._trace(args, kwargs)[0])

    def __repr__(self) -> str:
        return f"jit({_name(self.fun)})"


def jit(
    fun: Callable[..., Any] | None = None,
    *,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
    fuse: bool = True,
) -> Any:
    """Trace `fun` once per input signature and run the traced graph.

    Signatures are the pytree structure, shapes and dtypes of the arguments and the values
    of the static ones. Arguments named in `static_argnums`/`static_argnames` are passed as
    plain Python values, so they may steer Python control flow. The graph is compiled into
    fused Numba loops; `fuse=False` runs it through the NumPy reference interpreter instead.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> @fg.jit
    ... def f(x):
    ...     return fnp.sum(fnp.tanh(x) * 2.0)
    >>> f(np.zeros(3, np.float32))
    array(0., dtype=float32)
    """
    if fun is None:
        return lambda f: Jitted(f, static_argnums, static_argnames, fuse)
    return Jitted(fun, static_argnums, static_argnames, fuse)


def make_graph(fun: Callable[..., Any], static_argnums: int | Sequence[int] = ()) -> Any:
    """A function that traces `fun` on its arguments and returns the graph (print it).

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> print(fg.make_graph(lambda x: fnp.exp(x) * 2.0)(np.ones(3)))
    graph(x: f64[3]):
        a: f64[3] = exp(x)
        b: f64[3] = broadcast_to(2.0, shape=(3,))
        c: f64[3] = a * b
        return (c,)
    """
    jitted = Jitted(fun, static_argnums)
    return jitted.graph


# ---------------------------------------------------------------- reverse mode


def _check_argnums(argnums: int | Sequence[int], nargs: int, fun: Any) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums:
        raise ValueError("argnums must name at least one argument")
    for i in nums:
        if not isinstance(i, int):
            raise TypeError(f"argnums must be ints, got {i!r}")
        if not -nargs <= i < nargs:
            raise ValueError(
                f"argnums {i} is out of range: {_name(fun)} was called with {nargs} positional "
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


def _vjp_parts(
    fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], argnums: tuple[int, ...]
) -> tuple[Traced, list[Any], list[TreeDef]]:
    """Trace `fun` in the arguments `argnums` (in that order); the others pass through as
    they are, so concrete ones stay concrete (Python control flow on them works, as in JAX).

    Returns the traced function, the differentiated leaves and each argument's structure.
    """
    names = _param_names(fun, len(args))
    diff_args = tuple(args[i] for i in argnums)

    def rebuild(traced_args: tuple[Any, ...]) -> list[Any]:
        full = list(args)
        for i, a in zip(argnums, traced_args, strict=True):
            full[i] = a
        return full

    leaf_names = _arg_leaf_names(diff_args, [names[i] for i in argnums])
    leaves, _ = flatten(diff_args)
    for leaf, where in zip(leaves, leaf_names, strict=True):
        _check_differentiable(_leaf_aval(leaf, where), f"argument {where}", "grad")
    traced = trace_function(
        lambda *a: fun(*a, **kwargs), diff_args, leaf_names, rebuild, _name(fun)
    )
    return traced, leaves, [flatten(a)[1] for a in diff_args]


def value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """A function returning `fun`'s value and its gradient with respect to `argnums`.

    `fun` must return a float scalar, or `(scalar, aux)` with `has_aux=True`; the result is
    then `((value, aux), grads)`. Gradients have the structure of the differentiated
    arguments; with a tuple `argnums` they come as a tuple.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> value, g = fg.value_and_grad(lambda x: fnp.sum(x * x))(np.array([1.0, 2.0]))
    >>> float(value), g
    (5.0, array([2., 4.]))
    """

    @functools.wraps(fun, updated=())
    def value_and_grad_fun(*args: Any, **kwargs: Any) -> Any:
        nums = _check_argnums(argnums, len(args), fun)
        traced, leaves, trees = _vjp_parts(fun, args, kwargs, nums)
        out_leaves = traced.graph.outputs
        if has_aux:
            if traced.out_tree.kind not in ("tuple", "list") or len(traced.out_tree.children) != 2:
                raise TypeError(
                    f"with has_aux=True, {_name(fun)} must return a pair (value, aux), got "
                    f"structure {traced.out_tree!r}"
                )
            value_tree = traced.out_tree.children[0]
            if value_tree.kind != "leaf":
                raise TypeError(f"the value returned by {_name(fun)} must be a scalar array")
        elif traced.out_tree.kind != "leaf":
            raise TypeError(
                f"grad needs {_name(fun)} to return a scalar, got a pytree "
                f"{traced.out_tree!r} (use has_aux=True to return (value, aux))"
            )
        value = out_leaves[0].aval
        if value.shape != () or not value.is_float:
            raise TypeError(
                f"grad needs {_name(fun)} to return a float scalar, got {value} (shape "
                f"{value.shape}, dtype {value.dtype}); reduce it first, e.g. with fnp.sum"
            )
        backward = vjp_graph(traced.graph, range(len(leaves)), seeds=[0])
        backward.verify()
        one = np.ones((), value.dtype)
        outs = _run(backward, [*leaves, *traced.captured, one])
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
    nums = tuple(range(len(primals)))
    if not primals:
        raise TypeError("vjp needs at least one primal argument")
    traced, leaves, trees = _vjp_parts(fun, primals, {}, nums)
    outs = _run(traced.graph, [*leaves, *traced.captured])
    out_tree = traced.out_tree
    aux = None
    n_main = len(outs)
    if has_aux:
        if out_tree.kind not in ("tuple", "list") or len(out_tree.children) != 2:
            raise TypeError(f"with has_aux=True, {_name(fun)} must return a pair (out, aux)")
        n_main = out_tree.children[0].num_leaves
        aux = unflatten(out_tree.children[1], outs[n_main:])
        out_tree = out_tree.children[0]
    out_avals = [v.aval for v in traced.graph.outputs[:n_main]]
    seeds = [i for i, a in enumerate(out_avals) if a.is_float]

    @functools.lru_cache(maxsize=1)
    def backward() -> Graph:
        return vjp_graph(traced.graph, range(len(leaves)), seeds).verify()

    def vjp_fn(ct: Any) -> tuple[Any, ...]:
        ct_leaves, ct_tree = flatten(ct)
        if ct_tree != out_tree:
            raise ValueError(
                f"vjp_fn: the cotangent's structure {ct_tree!r} differs from the output's "
                f"{out_tree!r}"
            )
        for i, (c, a) in enumerate(zip(ct_leaves, out_avals, strict=True)):
            ca = _leaf_aval(c, f"cotangent leaf {i}")
            if ca.shape != a.shape:
                raise ValueError(
                    f"vjp_fn: cotangent leaf {i} has shape {ca.shape}, the output has {a.shape}"
                )
        ct_args = [fnp.astype(ct_leaves[i], out_avals[i].dtype) for i in seeds]
        res = _run(backward(), [*leaves, *traced.captured, *ct_args])
        grad_leaves = iter(res[len(traced.graph.outputs) :])
        return tuple(unflatten(t, [next(grad_leaves) for _ in range(t.num_leaves)]) for t in trees)

    out = unflatten(out_tree, outs[:n_main])
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
    return tree_map(lambda leaf: fnp.stop_gradient(leaf, name), x)
