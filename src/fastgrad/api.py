"""The user-facing transformations: jit, grad, value_and_grad, vjp, jvp, hessian,
custom_vjp, make_graph, stop_gradient.

Each traces the user's function into a graph (frontend), differentiates it (autodiff,
forward) where asked, and runs the result: on concrete arrays through the executor, on
tracers by inlining it into the enclosing trace, which is what lets them compose in any order.
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
from fastgrad.custom import CUSTOM_VJP_CALL, CustomCall
from fastgrad.explain import explain
from fastgrad.forward import jvp_graph
from fastgrad.fusion import partition
from fastgrad.interpreter import eval_graph, run_graph
from fastgrad.ir import Aval, Graph
from fastgrad.passes import simplify
from fastgrad.pytree import TreeDef, builder, flatten, leaf_paths, tree_map, unflatten
from fastgrad.runtime import DEBUG, Executable
from fastgrad.tracing import Trace, Tracer, as_array, bind, current_trace, is_python_scalar

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
        _check_differentiable(_leaf_aval(leaf, where), f"argument {where}", transform)
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


# ---------------------------------------------------------------- forward mode


def _jvp_inputs(
    fun: Any, primals: Any, tangents: Any
) -> tuple[Any, list[Any], list[Any], list[str]]:
    """Checked primals and tangents: the primal tree, its leaves, the tangent leaves (cast to
    the primals' dtypes) and readable leaf paths."""
    for what, value in (("primals", primals), ("tangents", tangents)):
        if not isinstance(value, tuple | list):
            raise TypeError(
                f"jvp: {what} must be a tuple or list with one entry per argument of "
                f"{_name(fun)}, got {type(value).__name__}; write fg.jvp(f, (x,), (v,))"
            )
    if len(primals) != len(tangents):
        raise ValueError(
            f"jvp: got {len(primals)} primal(s) but {len(tangents)} tangent(s); pass one "
            "tangent per primal, of the same structure"
        )
    if not primals:
        raise TypeError("jvp needs at least one primal argument")
    names = _param_names(fun, len(primals))
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
        pa = _leaf_aval(p, f"argument {where}")
        if not pa.is_float:
            raise TypeError(
                f"jvp needs float primals, but argument {where} has dtype {pa.dtype}. Integer "
                "and boolean values carry no tangent: close over them instead, as in "
                "fg.jvp(lambda x: f(x, labels), (x,), (v,))."
            )
        ta = _leaf_aval(t, f"the tangent for {where}")
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
            p_leaves[k] = fnp.astype(p, pa.dtype)
        if ta.dtype != pa.dtype or (ta.weak and not weak):
            t_leaves[k] = fnp.astype(t, pa.dtype)
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
    tree, p_leaves, t_leaves, paths = _jvp_inputs(fun, primals, tangents)
    traced = trace_function(lambda *a: fun(*a), unflatten(tree, p_leaves), paths, list, _name(fun))
    out_tree = traced.out_tree
    if has_aux:
        if out_tree.kind not in ("tuple", "list") or len(out_tree.children) != 2:
            raise TypeError(
                f"with has_aux=True, {_name(fun)} must return a pair (out, aux), got "
                f"structure {out_tree!r}"
            )
        out_tree = out_tree.children[0]
    n_out = len(traced.graph.outputs)
    forward = jvp_graph(traced.graph, range(len(p_leaves)), range(out_tree.num_leaves))
    forward.verify()
    outs = _run(forward, [*p_leaves, *traced.captured, *t_leaves])
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

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> f = lambda x: fnp.sum(x ** 3)
    >>> x = np.array([1.0, 2.0])
    >>> fg.hessian(f)(x)
    array([[ 6.,  0.],
           [ 0., 12.]])
    >>> fg.jvp(fg.grad(f), (x,), (np.array([1.0, 1.0]),))[1]  # H @ v, H never built
    array([ 6., 12.])
    """

    @functools.wraps(fun, updated=())
    def hessian_fun(*args: Any, **kwargs: Any) -> Any:
        nums = _check_argnums(argnums, len(args), fun)
        traced, leaves, _ = _vjp_parts(fun, args, kwargs, nums, "hessian")
        value = traced.graph.outputs[0].aval if traced.graph.outputs else None
        if traced.out_tree.kind != "leaf" or value is None or value.shape != ():
            shown = value if traced.out_tree.kind == "leaf" else f"a pytree {traced.out_tree!r}"
            raise TypeError(
                f"hessian needs {_name(fun)} to return a float scalar, got {shown}; reduce "
                "it first (e.g. with fnp.sum), or take Hessian-vector products of one "
                "output with fg.jvp(fg.grad(f), (x,), (v,))"
            )
        if not value.is_float:
            raise TypeError(f"hessian needs {_name(fun)} to return a float scalar, got {value}")
        diff = tuple(args[i] for i in nums)

        def diff_fun(*d: Any) -> Any:
            full = list(args)
            for i, x in zip(nums, d, strict=True):
                full[i] = x
            return fun(*full, **kwargs)

        grad_fun = grad(diff_fun, argnums=tuple(range(len(nums))))
        names = _arg_leaf_names(diff, [_param_names(fun, len(args))[i] for i in nums])
        hvp = trace_function(
            lambda d, v: jvp(grad_fun, d, v)[1],
            (diff, diff),
            names + [f"d{n}" for n in names],
            lambda t: t,
            f"hessian of {_name(fun)}",
        )
        avals = [_leaf_aval(x, "argument") for x in leaves]
        # columns[i][j]: d(grad_i)/d(leaf_j[p]) for each flat position p of leaf j.
        columns: list[list[list[Any]]] = [[[] for _ in avals] for _ in avals]
        for j, aj in enumerate(avals):
            for p in range(aj.size):
                basis = [np.zeros(a.shape, a.dtype) for a in avals]
                basis[j].reshape(-1)[p] = 1
                outs = _run(hvp.graph, [*leaves, *basis, *hvp.captured])
                for i in range(len(avals)):
                    columns[i][j].append(outs[i])

        def block(i: int, j: int) -> Any:
            shape = avals[i].shape + avals[j].shape
            if not columns[i][j]:
                return np.zeros(shape, avals[i].dtype)
            return fnp.reshape(fnp.stack(columns[i][j], axis=-1), shape)

        tree = flatten(diff[0] if isinstance(argnums, int) else diff)[1]
        n = len(avals)
        return unflatten(tree, [unflatten(tree, [block(i, j) for j in range(n)]) for i in range(n)])

    return hessian_fun


# ---------------------------------------------------------------- custom rules


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
        return f"custom_vjp({_name(self.fun)})"

    def _positional(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        try:
            sig = inspect.signature(self.fun)
        except (TypeError, ValueError):
            if kwargs:
                raise TypeError(f"{_name(self.fun)} takes positional arguments only") from None
            return args
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()  # so that nondiff_argnums may name a defaulted argument
        if bound.kwargs:
            raise TypeError(
                f"custom_vjp function {_name(self.fun)} cannot take keyword-only or **kwargs "
                f"arguments (got {sorted(bound.kwargs)})"
            )
        return tuple(bound.args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = _name(self.fun)
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
        names = _param_names(self.fun, len(args))
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
        paths = _arg_leaf_names(diff, [names[i] for i in positions])

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
        name = _name(self.fun)
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
                p for i, p in enumerate(_param_names(self.fun, len(args))) if i not in nondiff
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
                ca = _leaf_aval(ct, f"the cotangent bwd returned for {where}")
                pa = _leaf_aval(leaf, where)
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
                outputs.append(fnp.astype(ct, pa.dtype))
        graph = trace.to_graph(outputs)
        _no_closure(trace.captured, "bwd", name)
        return graph.verify(), tuple(ct_of_input)


def _no_closure(captured: list[Tracer], rule: str, name: str) -> None:
    if captured:
        t = captured[0]
        hint = f"`{t.var.hint}` " if t.var.hint else ""
        raise TypeError(
            f"the {rule} rule of custom_vjp function {name} closes over the traced value "
            f"{hint}({t.aval}); fwd and bwd must get every traced value as an argument of "
            f"{name}: pass it explicitly (bwd may return None for its cotangent)"
        )
