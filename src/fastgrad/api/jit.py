"""`jit`: trace a function once per input signature and run the compiled graph; and
`make_graph`, which shows the traced graph."""

from __future__ import annotations

import collections
import functools
import inspect
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.api.trace import (
    Traced,
    arg_leaf_names,
    leaf_aval,
    name_of,
    param_names,
    run,
    signature,
    trace_function,
)
from fastgrad.core.ir import Graph
from fastgrad.core.pytree import builder, flatten, leaf_paths, unflatten
from fastgrad.core.tracing import Tracer
from fastgrad.runtime.explain import explain


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
                raise ValueError(f"static_argnames: {name_of(fun)} has no parameter {n!r}")
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
        self._options = (static_argnums, static_argnames, fuse)
        self._token = uuid.uuid4().hex  # one name for this function and all its pickled copies
        _LIVE[self._token] = self

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as the function and its options, without the caches (traced graphs and
        # Numba dispatchers): the receiving process traces again and loads the kernels from
        # the disk cache. The token makes every copy unpickled in one process the same
        # object, so a function sent along with each task compiles once per process.
        return _unpickle_jitted, (self._token, self.fun, self._options)

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
                f"static arguments of {name_of(self.fun)} must be hashable, got {static!r}"
            ) from None
        return (dyn_args, dyn_kwargs), static

    def _leaf_names(self, tree: Any) -> list[str]:
        dyn_args, dyn_kwargs = tree
        names = param_names(self.fun, len(dyn_args))
        return arg_leaf_names(dyn_args, names) + [
            p for k in sorted(dyn_kwargs) for p in leaf_paths(dyn_kwargs[k], k)
        ]

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Traced, list[Any]]:
        tree, static = self._split(args, kwargs)
        leaves, treedef = flatten(tree)
        key = (treedef, tuple(map(signature, leaves)), static)
        traced = self._cache.get(key)
        if traced is None:
            leaf_names = self._leaf_names(tree)
            for x, where in zip(leaves, leaf_names, strict=True):
                leaf_aval(x, where)  # clear errors for unsupported leaves
            static_pos = dict(static[0])

            def rebuild(t: Any) -> Any:
                dyn_args, dyn_kwargs = t
                full = [static_pos.get(i, a) for i, a in enumerate(dyn_args)]
                return full, {**dyn_kwargs, **dict(static[1])}

            traced = trace_function(
                lambda a, k: self.fun(*a, **k), tree, leaf_names, rebuild, name_of(self.fun)
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
            outs = run(traced.graph, inputs)
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
        return f"jit({name_of(self.fun)})"


# The jitted functions alive in this process, by token (see `Jitted.__reduce__`).
_LIVE: weakref.WeakValueDictionary[str, Jitted] = weakref.WeakValueDictionary()
# Copies that arrived by pickle are kept alive, the most recent few: a function that is
# sent with every task would otherwise be dropped, and traced again, between tasks.
_ARRIVED: collections.OrderedDict[str, Jitted] = collections.OrderedDict()
ARRIVED_KEPT = 32


def _unpickle_jitted(token: str, fun: Callable[..., Any], options: tuple[Any, ...]) -> Jitted:
    jitted = _LIVE.get(token)
    if jitted is None:
        fresh = Jitted(fun, *options)
        del _LIVE[fresh._token]
        fresh._token = token
        jitted = _LIVE.setdefault(token, fresh)  # two threads may unpickle it at once
    _ARRIVED[token] = jitted
    _ARRIVED.move_to_end(token)
    while len(_ARRIVED) > ARRIVED_KEPT:
        _ARRIVED.popitem(last=False)
    return jitted


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
