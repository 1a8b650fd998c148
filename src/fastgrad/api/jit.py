"""`jit`: trace a function once per input signature and run the compiled graph; and
`make_graph`, which shows the traced graph.

A transform of a jitted function (`grad`, `jvp`, ... in fastgrad.api) is itself jitted,
made once per jitted function (`Jitted.derived`), so it is compiled and cached too, in any
order of composition. With `config.log_compiles`, a call that traces again says why:
which argument changed, and how (`explain_miss`).
"""

from __future__ import annotations

import collections
import functools
import inspect
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.api.trace import (
    Traced,
    arg_leaf_names,
    leaf_aval,
    load_layers,
    name_of,
    param_names,
    run,
    signature,
    signature_text,
    trace_function,
)
from fastgrad.core.collector import no_full_collections
from fastgrad.core.compile_log import log_trace
from fastgrad.core.config import config
from fastgrad.core.ir import Aval, Graph
from fastgrad.core.miss import MISS
from fastgrad.core.pytree import builder, flatten, leaf_paths, unflatten
from fastgrad.core.tracing import Tracer

# How many past signatures a jitted function keeps to explain why it traces again.
_REMEMBERED = 16


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
        from fastgrad.runtime.explain import explain  # the runtime loads on a first call

        return explain(self._traced.graph, self.executable)

    def __repr__(self) -> str:
        return self.explain()


class _FastEntry:
    """What a call whose arguments are all arrays of known layouts runs: the traced
    function's plan, and once the plan is lowered to one segment, the small call
    (runtime.small_call) that runs it without its arena."""

    __slots__ = ("build", "executable", "signature", "small", "traced")

    def __init__(self, traced: Traced, signature: Any):
        self.traced, self.signature = traced, signature
        self.executable = traced.compiled()
        self.build = builder(traced.out_tree)
        self.small: Any = None  # the small call; False: none for this plan and layout

    def settle(self, key: Any, args: Sequence[Any]) -> None:
        """Once the plan's calls are final, take its small call for arguments of layouts
        `key` (`args` are such a call's)."""
        if self.executable.lowered:
            tree = self.traced.out_tree
            self.small = self.executable.small_call(key, args, tree) or False


class Jitted:
    """A function compiled per input signature (see `jit`)."""

    def __init__(
        self,
        fun: Callable[..., Any],
        static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (),
        fuse: bool = True,
        label: str | None = None,
    ):
        if not callable(fun):
            raise TypeError(f"jit expects a function, got {type(fun).__name__}")
        load_layers()  # here rather than at the first call
        self.fun = fun
        self.fuse = fuse
        self.label = label or name_of(fun)  # what messages call it: `grad(loss)`
        self.static_argnames = static_argnames
        # Name and docstring only: copying __dict__ would let a wrapped Jitted's state leak in.
        functools.update_wrapper(self, fun, updated=())
        nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self._given_nums = nums
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
        # Signature -> traced function, least recently used first; at most
        # `config.trace_cache_size` entries (a function called with ever new shapes would
        # otherwise keep every graph and plan it ever made).
        self._cache: collections.OrderedDict[Any, Traced] = collections.OrderedDict()
        # Calls with only array arguments skip pytree handling: (shape, dtype, strides) of
        # each -> its entry. Strides are in the key because kernels are compiled per
        # layout. Only `_store` adds or drops entries, under `_lock`.
        self._fast: dict[Any, _FastEntry] = {}
        # The small call of the latest call's fast entry, tried first (it matches the
        # arguments itself, cheaper than the fast key); any other call drops it, so the
        # entries a call skips are those `_touch` would not reorder.
        self._latest: Any = None
        self._lock = threading.Lock()
        self._seen: list[Any] = []  # recent signatures, to explain a new trace
        self._derived: dict[Any, Jitted] = {}  # transforms of this function, jitted
        self._options = (static_argnums, static_argnames, fuse, label)
        self._token = uuid.uuid4().hex  # one name for this function and all its pickled copies
        _LIVE[self._token] = self

    def check_transform(self, transform: str, argnums: Any = None) -> None:
        """Refuse, with a way out, a transform that would differentiate a static argument
        (or, with argnums None, any transform of a function with static arguments)."""
        bad: list[Any]
        if argnums is None:
            bad = sorted(self._static_nums) or sorted(self._static_names)
        else:
            nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
            bad = [i for i in nums if isinstance(i, int) and i in self._static_nums]
        if bad:
            raise TypeError(
                f"{transform} of {self!r}: argument(s) {bad} are static (static_argnums/"
                f"static_argnames), and static arguments are not differentiated. "
                + (
                    "Differentiate with respect to the other arguments (argnums)."
                    if argnums is not None
                    else f"Jit a function that fixes them instead, e.g. "
                    f"fg.{transform}(fg.jit(lambda x: {self.label}(x, n)), ...)."
                )
            )

    def derived(
        self, key: Any, make: Callable[[Callable[..., Any]], Any], name: str, shift: int | None = 0
    ) -> Jitted:
        """The jitted `make(self.fun)` (a transform of this function, `name` in messages),
        made once per `key`. It takes this function's static arguments, `shift` positions
        further right (it has as many new arguments first), or none if `shift` is None."""
        jitted = self._derived.get(key)
        if jitted is None:
            statics: tuple[Any, Any] = ((), ())
            if shift is not None:
                # A negative position counts from the end, which new first arguments keep.
                nums = tuple(i + shift if i >= 0 else i for i in self._given_nums)
                statics = (nums, self.static_argnames)
            jitted = Jitted(make(self.fun), *statics, self.fuse, f"{name}({self.label})")
            jitted = self._derived.setdefault(key, jitted)  # one, if threads race to make it
        return jitted

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
        traced, leaves, _ = self._trace_keyed(args, kwargs)
        return traced, leaves

    def _trace_keyed(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Traced, list[Any], Any]:
        """The traced function for these arguments (traced now if it is not cached), the
        argument leaves, and the signature it is cached under."""
        tree, static = self._split(args, kwargs)
        leaves, treedef = flatten(tree)
        key = (treedef, tuple(map(signature, leaves)), static)
        traced = self._cache.get(key)
        if traced is not None:
            self._touch(key)
        else:
            leaf_names = self._leaf_names(tree)
            avals = [leaf_aval(x, where) for x, where in zip(leaves, leaf_names, strict=True)]
            if config.log_compiles:
                names = self._static_arg_names(static)
                why = explain_miss(key, self._seen, leaf_names, names)
                log_trace(f"{self.label}({signature_text(leaf_names, avals)})", why)
            self._seen = [key, *self._seen[: _REMEMBERED - 1]]
            static_pos = dict(static[0])

            def rebuild(t: Any) -> Any:
                dyn_args, dyn_kwargs = t
                full = [static_pos.get(i, a) for i, a in enumerate(dyn_args)]
                return full, {**dyn_kwargs, **dict(static[1])}

            with no_full_collections():
                traced = trace_function(
                    lambda a, k: self.fun(*a, **k), tree, leaf_names, rebuild, self.label
                )
            if not traced.captured:  # a closure over outer tracers is valid for one call only
                traced = self._store(key, traced)
        return traced, leaves, key

    def _touch(self, key: Any) -> None:
        try:
            self._cache.move_to_end(key)
        except KeyError:  # dropped by another thread meanwhile
            pass

    def _store(self, key: Any, traced: Traced, fast_key: Any = None) -> Traced:
        """Keep `traced` for signature `key` (and for the all-array call `fast_key`);
        drop the least recently used entries beyond the bound. Threads tracing the same
        signature at once all get the first one stored, so its kernels are built once."""
        with self._lock:
            traced = self._cache.setdefault(key, traced)
            if fast_key is not None and fast_key not in self._fast:
                self._fast[fast_key] = _FastEntry(traced, key)
            while len(self._cache) > max(1, config.trace_cache_size):
                _, dropped = self._cache.popitem(last=False)
                for k in [k for k, entry in self._fast.items() if entry.traced is dropped]:
                    del self._fast[k]
        return traced

    def _static_arg_names(self, static: Any) -> list[str]:
        positional, named = static
        names = param_names(self.fun, max((i for i, _ in positional), default=-1) + 1)
        return [names[i] for i, _ in positional] + [k for k, _ in named]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        latest = self._latest
        if latest is not None and not kwargs:
            out = latest(args)
            if out is not MISS:
                return out
        self._latest = None
        if not kwargs and self.fuse:
            try:
                key = tuple([(a.shape, a.dtype, a.strides) for a in args if type(a) is np.ndarray])
                fast = self._fast.get(key) if len(key) == len(args) else None
            except TypeError:
                fast = None
            if fast is not None:
                if len(self._cache) > 1:  # with one signature, nothing to reorder
                    self._touch(fast.signature)
                small = fast.small
                if small:
                    out = small(args)
                    if out is not MISS:  # MISS: another call holds the plan
                        self._latest = small
                        return out
                elif small is None:
                    fast.settle(key, args)
                return fast.build(fast.executable(args))
        traced, leaves, key = self._trace_keyed(args, kwargs)
        inputs = [*leaves, *traced.captured]
        tracing = any(isinstance(a, Tracer) for a in inputs)
        if not self.fuse or tracing:
            from fastgrad.runtime.ownership import owned

            outs = run(traced.graph, inputs)
            return unflatten(traced.out_tree, outs if tracing else owned(outs, inputs))
        arrays = [np.asarray(a) for a in inputs]
        layout = tuple(map(layout_of, arrays))
        why = ""
        if traced.layouts and layout not in traced.layouts and config.log_compiles:
            names = self._leaf_names(self._split(args, kwargs)[0])
            why = explain_layout(next(iter(traced.layouts)), layout, names)
        outs = traced.call(arrays, layout, why)
        if (
            not kwargs
            and not self._static_nums
            and not traced.captured
            and all(type(a) is np.ndarray for a in args)
        ):
            self._store(key, traced, tuple((a.shape, a.dtype, a.strides) for a in args))
        return unflatten(traced.out_tree, outs)

    def compile(self, *args: Any, **kwargs: Any) -> Jitted:
        """Compile now every kernel a call with these arguments needs, and wait for them
        (in background mode too): for benchmarks and servers whose first call must run
        compiled. Runs the function once; returns this jitted function.

        >>> import fastgrad as fg, fastgrad.numpy as fnp
        >>> f = fg.jit(lambda x: fnp.sum(fnp.exp(x))).compile(np.zeros(3))
        >>> f(np.zeros(3))
        array(3.)
        """
        if self.fuse:
            traced, _ = self._trace(args, kwargs)
            traced.compiled().settle()
        self(*args, **kwargs)
        return self

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
        return f"jit({self.label})"


# ---------------------------------------------------------------- why a call traces again

LAYOUTS = {"C": "C-contiguous", "F": "Fortran-contiguous", "A": "strided"}


def layout_of(a: np.ndarray) -> str:
    """The memory layout kernels are compiled for (Numba's: C, F, or A for any strides)."""
    return "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else "A"


def explain_layout(old: tuple[str, ...], new: tuple[str, ...], names: Sequence[str]) -> str:
    """Which arguments come with other strides than in the run before."""
    changed = [
        f"{name}: strides changed ({LAYOUTS[a]} -> {LAYOUTS[b]})"
        for name, a, b in zip(names, old, new, strict=False)
        if a != b
    ]
    return "; ".join(changed)


def _as_aval(sig: Any) -> Aval | None:
    if isinstance(sig, Aval):
        return sig
    if isinstance(sig, tuple) and len(sig) == 2 and isinstance(sig[1], np.dtype):
        return Aval(sig[0], sig[1])
    return None  # an unsupported leaf, reported when traced


def _shape_class(shape: tuple[int, ...]) -> tuple[bool, ...]:
    # Kernels are keyed by rank and by which dimensions are 1 (they broadcast), not sizes.
    return tuple(d == 1 for d in shape)


def _leaf_changes(name: str, old: Any, new: Any) -> list[tuple[int, str]]:
    """How a leaf's signature changed: (weight, text) pairs, heavier for bigger changes."""
    a, b = _as_aval(old), _as_aval(new)
    if old == new:
        return []
    if a is None or b is None:
        return [(4, f"{name}: {a or old} -> {b or new}")]
    out = []
    if a.dtype != b.dtype:
        out.append((4, f"{name}: dtype {a.dtype} -> {b.dtype}"))
    if a.weak != b.weak:
        kinds = ("Python scalar", "array") if a.weak else ("array", "Python scalar")
        out.append((4, f"{name}: {kinds[0]} -> {kinds[1]}"))
    if a.ndim != b.ndim:
        out.append((3, f"{name}: rank {a.ndim} -> {b.ndim} (shape {a.shape} -> {b.shape})"))
    elif _shape_class(a.shape) != _shape_class(b.shape):
        text = f"{name}: shape {a.shape} -> {b.shape}, a new shape class (size-1 dimensions "
        out.append((2, text + "broadcast, so the kernels differ)"))
    elif a.shape != b.shape:
        text = f"{name}: shape {a.shape} -> {b.shape} (same shape class: kernels reused)"
        out.append((1, text))
    return out


def explain_miss(key: Any, seen: Sequence[Any], leaf_names: list[str], statics: list[str]) -> str:
    """Why a call with signature `key` (structure, leaf signatures, static values) is traced:
    what differs from the closest signature traced before (`seen`, latest first)."""
    if not seen:
        return "first call"
    treedef, sigs, static = key
    alike = [k for k in seen if k[0] == treedef]
    if not alike:
        return f"the arguments' structure changed: {seen[0][0]!r} -> {treedef!r}"

    def changes(old: Any) -> list[tuple[int, str]]:
        out = []
        old_static = [v for part in old[2] for v in part]
        new_static = [v for part in static for v in part]
        if [k for k, _ in old_static] != [k for k, _ in new_static]:
            out.append((4, "other arguments are static"))
        else:
            for name, (_, a), (_, b) in zip(statics, old_static, new_static, strict=True):
                if a != b:
                    out.append((4, f"static argument {name}: {a!r} -> {b!r}"))
        for name, a, b in zip(leaf_names, old[1], sigs, strict=True):
            out.extend(_leaf_changes(name, a, b))
        return out

    closest = min((changes(k) for k in alike), key=lambda c: sum(w for w, _ in c))
    return "; ".join(text for _, text in closest) or (
        "same signature as before, but that trace closed over values of an enclosing trace, "
        "which hold for one call only"
    )


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
    plain Python values, so they may steer Python control flow. Arrays the function closes
    over are read when it is traced, as in JAX: later changes to them are not seen. The
    graph is compiled into fused Numba loops; `fuse=False` runs it through the NumPy
    reference interpreter instead. `grad`, `value_and_grad`, `vjp`, `jvp` and `hessian` of
    the result are compiled too. A call returns arrays of the caller's own, never one
    another call returns or an argument: an argument returned (or a view of one) is a copy.

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


def warmup(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Jitted:
    """Compile `fun` for these arguments ahead of time and wait for its kernels, so that
    its next call runs compiled; `fun` is jitted first if it is not. Returns the jitted
    function (`Jitted.compile`).

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> loss = fg.warmup(fg.grad(lambda x: fnp.sum(x * x)), np.ones(2))
    >>> loss(np.ones(2))
    array([2., 2.])
    """
    jitted = fun if isinstance(fun, Jitted) else Jitted(fun, (), (), True)
    return jitted.compile(*args, **kwargs)


def release_buffers() -> None:
    """Let go of the memory fastgrad keeps to hand to later calls' large outputs: memory
    of earlier outputs that nothing holds any more (`fg.config.output_pool_mb` says how
    much at most; runtime.recycling). Outputs the caller still holds are untouched.

    >>> import fastgrad as fg
    >>> fg.release_buffers()
    """
    from fastgrad.runtime import recycling  # (the runtime loads on a first call)

    recycling.release()


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
