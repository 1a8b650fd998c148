"""Tracing a user's function into a graph, and running a graph.

`trace_function` flattens the arguments' pytrees, traces the function on one tracer per
leaf (named by its path, `params['w']`), and gives a `Traced`: the graph, the output's
structure, and the outer tracers it closed over. `Traced.compiled()` runs the pipeline
below the front end: simplify, partition, and an executable plan of fused kernels (the
plan loaded from disk instead when this graph was prepared before, compiler.plan_cache);
`Traced.call` runs it, saying so on stderr when a run has kernels to build
(fastgrad.core.compile_log).
"""

from __future__ import annotations

import inspect
import random
import re
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from fastgrad.core.collector import no_full_collections
from fastgrad.core.compile_log import compiling, log_compile
from fastgrad.core.config import config
from fastgrad.core.interpreter import DeferredGraph, eval_graph, run_graph
from fastgrad.core.ir import Aval, Graph
from fastgrad.core.pytree import TreeDef, flatten, leaf_paths, unflatten
from fastgrad.core.tracing import Trace, Tracer, as_array, current_trace, is_python_scalar

if TYPE_CHECKING:
    from fastgrad.runtime.executable import Executable


def identifier(path: str) -> str:
    name = re.sub(r"\W+", "_", path).strip("_")
    return name if name and not name[0].isdigit() else f"x_{name}"


def signature(leaf: Any) -> Any:
    """What the trace cache keys a leaf by: (shape, dtype), or the Aval of a weakly typed
    Python scalar; arrays take the fast path."""
    if type(leaf) is np.ndarray:
        return leaf.shape, leaf.dtype
    try:
        aval = leaf.aval if isinstance(leaf, Tracer) else leaf_aval(leaf, "argument")
    except TypeError:
        return ("unsupported", type(leaf))  # reported, with its name, when traced
    # A NumPy scalar and a 0-d array, or a tracer and an array, key alike.
    return aval if aval.weak else (aval.shape, aval.dtype)


def leaf_aval(leaf: Any, where: str) -> Aval:
    if isinstance(leaf, Tracer):
        return leaf.aval
    arr = as_array(leaf, where)
    return Aval(arr.shape, arr.dtype, weak=is_python_scalar(leaf))


# Held while a plan is built, so that threads making the same first call share one plan.
# Re-entrant: a plan for a loop body is built while its enclosing plan is.
_BUILDING = threading.RLock()


@dataclass
class Traced:
    """A function traced at one input signature."""

    graph: Graph
    out_tree: TreeDef
    captured: list[Tracer]  # tracers of an enclosing trace that the function closed over
    name: str = "function"  # what messages call it: `loss(w: f64[3], x: f64[2,3])`
    executable: Executable | None = None  # the compiled form, built on first concrete call
    layouts: set[tuple[str, ...]] = field(default_factory=set)  # argument layouts run with
    # What names the graph when it is a stored graph inlined and nothing else (`_inlined`):
    # its plan's key then follows from those parts, with no digest of its nodes.
    inlined: tuple[Any, ...] | None = None

    def call(self, args: list[np.ndarray], layout: tuple[str, ...] = (), why: str = "") -> Any:
        """Run the compiled form on `args`, whose memory layouts are `layout`. The first
        run builds the kernels Numba has not compiled yet (announced on stderr), or in
        background mode hands them to the compile thread and runs with NumPy; a run with
        a new layout may build new machine code for it (logged with `why`)."""
        executable = self.compiled()
        if self.layouts and layout in self.layouts:
            return executable(args)
        from fastgrad.compiler.kernel_cache import STATS, needs_build
        from fastgrad.runtime.background import first_run

        first = not self.layouts
        self.layouts.add(layout)
        if first and config.compile == "background" and not executable.waits:
            # Kernels compile behind, the call runs on NumPy. It is preparation too (core.
            # collector): the full collection that the objects preparing it made call for
            # comes after it, not in it (~20 ms in a warm M1's first call, every other run).
            with no_full_collections(), first_run(self.name):
                return executable(args)
        sources = [k.source for k in executable.kernels]
        to_build = len({s for s in sources if needs_build(s)}) if first else 0
        built = STATS.numba_compiles() if config.log_compiles else 0
        start = time.perf_counter()
        with compiling(self.name, to_build):
            outs = executable(args)
        if config.log_compiles:
            built = STATS.numba_compiles() - built
            seconds = time.perf_counter() - start
            log_compile(self.name, len(sources), len(sources) - built, seconds, why)
        return outs

    def compiled(self) -> Executable:
        """The executable plan, built on first use (once, whichever threads ask)."""
        if self.executable is None:
            with _BUILDING:
                if self.executable is None:
                    with no_full_collections():
                        self.executable = self._prepare()
        return self.executable

    def _prepare(self) -> Executable:
        # The compiler and the runtime load here, at a first call, not with `import
        # fastgrad` (-X importtime: ~25 ms of its ~65 ms beside NumPy's, bytecode cached).
        from fastgrad.compiler import plan_cache
        from fastgrad.compiler.fusion import partition
        from fastgrad.compiler.passes import simplify
        from fastgrad.runtime import build_tables
        from fastgrad.runtime.executable import DEBUG, Executable
        from fastgrad.runtime.explain import explain

        key = None
        if config.plan_cache:  # the graph's digest, or what names it (~20 ms at T=200)
            if self.inlined is None:
                key = plan_cache.plan_key(self.graph)
            else:
                key = plan_cache.inlined_key(self.graph, self.inlined)
        tables = build_tables.load(key) if key is not None else None
        if tables is not None and tables.steps is not None:  # the executable as data
            executable = _from_steps(key, self.graph, tables)
            if executable is not None:
                return executable
            tables = None
        stored = plan_cache.load(key, self.graph) if key is not None else None
        if stored is not None:
            graph, steps, generated = stored
        else:
            graph = simplify(self.graph)
            steps = partition(graph)
            generated = {}
        if DEBUG:
            print(f"# fastgrad: traced\n{self.graph}\n# fastgrad: simplified\n{graph}")
        executable = None
        if key is not None and stored is not None and tables is not None:
            executable = _from_tables(key, graph, steps, generated, tables)
        if executable is None:
            executable = Executable(graph, steps, generated=generated, record=key is not None)
            if key is not None and executable.tables is not None:
                build_tables.save(key, executable.tables, self.graph)
        if key is not None and stored is None:
            plan_cache.save(key, self.graph, (graph, steps, executable.generated))
        if DEBUG:
            print(f"# fastgrad: plan\n{explain(self.graph, executable)}")
        return executable


def _from_tables(
    key: str, graph: Graph, steps: Any, generated: Any, tables: Any
) -> Executable | None:
    """The executable of a plan read from disk, built from the tables stored with it; None
    when they do not fit (removed then: built and stored again)."""
    from fastgrad.runtime import build_tables
    from fastgrad.runtime.executable import Executable

    try:
        return Executable(graph, steps, generated=generated, tables=tables)
    except Exception:  # noqa: BLE001  (never trusted: a fresh build raises a real error)
        build_tables.drop(key)
        return None


def _from_steps(key: str, traced: Graph, tables: Any) -> Executable | None:
    """The executable that stored tables describe step by step (runtime.stored_plan),
    built without the plan's graph, which is read only if something asks for it; None
    when they do not fit (removed then: built and stored again)."""
    from fastgrad.compiler import plan_cache
    from fastgrad.compiler.plan_codec import constants, decode_plan
    from fastgrad.runtime import build_tables
    from fastgrad.runtime.executable import StoredBuild

    def read_plan() -> Any:  # (not counted: the plan was, in its executable's form)
        decode = partial(decode_plan, traced)
        stored = plan_cache.load_kind(key, "plan", decode, plan_cache.Counters())
        if stored is not None:
            return stored
        from fastgrad.compiler.fusion import partition  # (the plan file went: again)
        from fastgrad.compiler.passes import simplify

        graph = simplify(traced)
        return graph, partition(graph), {}

    try:
        executable = StoredBuild.stored(tables, traced, lambda: constants(traced), read_plan)
    except Exception:  # noqa: BLE001  (never trusted: a fresh build raises a real error)
        build_tables.drop(key)
        return None
    plan_cache.COUNTERS.loaded += 1  # the plan, in its executable's form
    return executable


def load_layers() -> None:
    """Import the compiler and runtime layers, which `import fastgrad` leaves out and a
    jitted function's first call needs: `jit(f)` calls this, so that the first call (what
    a user waits on) does not import them (~15 ms of CPU, 40-80 ms on the loaded machine)."""
    from fastgrad.compiler import plan_cache  # noqa: F401
    from fastgrad.runtime import explain  # noqa: F401  (the executable and all it imports)


def signature_text(names: Sequence[str], avals: Sequence[Aval], limit: int = 4) -> str:
    """`x: f64[3], labels: i64[4]`: the arguments a function was traced for (the first few)."""
    parts = [f"{n}: {a}" for n, a in zip(names, avals, strict=True)]
    return ", ".join(parts[:limit] + (["..."] if len(parts) > limit else []))


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
    avals = [leaf_aval(x, where) for x, where in zip(leaves, names, strict=True)]
    return trace_avals(fun, avals, treedef, names, rebuild, fun_name)


def trace_avals(
    fun: Callable[..., Any],
    avals: Sequence[Aval],
    treedef: TreeDef,
    names: Sequence[str],
    rebuild: Callable[[Any], Any],
    fun_name: str,
) -> Traced:
    """`trace_function` for arguments known by their types: `avals` are the leaves of a
    tree of structure `treedef`."""
    before = _global_generators()
    with Trace() as trace:
        tracers = [trace.new_input(a, identifier(n)) for a, n in zip(avals, names, strict=True)]
        out = fun(*rebuild(unflatten(treedef, tracers)))
        _warn_if_drawn(before, fun_name)
        out_leaves, out_tree = flatten(out)
        for i, leaf in enumerate(out_leaves):
            if not isinstance(leaf, Tracer):
                leaf_aval(leaf, f"output leaf {i} of {fun_name}")
    graph = trace.to_graph(out_leaves)
    graph.verify(types=config.check_graphs)
    name = f"{fun_name}({signature_text(names, avals)})"
    return Traced(graph, out_tree, list(trace.captured), name, inlined=_inlined(trace, graph))


def note_inlined(key: str, args: Sequence[Any], outs: Sequence[Any], count: int) -> None:
    """Note on the trace open in this thread that the first nodes it recorded are those of
    the graph stored under `key` (of `count` nodes) inlined on `args`, giving `outs`
    (api.grad: the forward and backward graph of `jit(value_and_grad(f))`, held back,
    core.interpreter.defer_inline)."""
    trace = current_trace()
    if trace is not None:
        trace.inlined = (key, list(args), count, list(outs))


def _inlined(trace: Trace, graph: Graph) -> tuple[Any, ...] | None:
    """When `graph` is a stored graph inlined and nothing else (Trace.inlined, and the
    trace ended on some of that inlining's outputs with nothing else recorded: a
    DeferredGraph), its inputs `graph`'s or constants, what its nodes follow from: that
    graph's key, where each of its inputs comes from (an input's place, or a constant's
    bytes), `graph`'s inputs and sizes, which of its outputs it gives. Else None. Its
    nodes are not made for this."""
    if trace.inlined is None or trace.captured or not isinstance(graph, DeferredGraph):
        return None
    if graph.deferred is None:  # its nodes already made (and what they came from let go)
        return None
    key, args, count, outs = trace.inlined
    held = graph.deferred.outs
    if len(outs) != len(held) or any(a is not b for a, b in zip(outs, held, strict=True)):
        return None
    place = {id(v): k for k, v in enumerate(graph.inputs)}
    sources: list[Any] = []
    for arg in args:
        if isinstance(arg, Tracer):
            k = place.get(id(arg._var)) if arg.trace is trace else None
            if k is None:
                return None
            sources.append(k)
        elif type(arg) is np.ndarray:
            sources.append((arg.dtype.str, arg.shape, arg.tobytes()))
        else:
            return None
    inputs = tuple((v.aval.shape, v.aval.dtype.str, v.aval.weak, v.hint) for v in graph.inputs)
    return key, tuple(sources), inputs, count, len(outs), graph.chosen


_WARNED_RANDOM: set[str] = set()


def _global_generators() -> tuple[Any, Any]:
    """The states of NumPy's global generator and of Python's `random` module. The latter
    only while this is the process's one thread: libraries draw from `random` in their own
    threads (a Dask client's, for one), and a change made there is not the traced
    function's; None then means "not known"."""
    state: Any = np.random.get_state()
    alone = threading.active_count() == 1
    return (state[1].tobytes(), *state[2:]), random.getstate() if alone else None


def _warn_if_drawn(before: tuple[Any, Any], fun_name: str) -> None:
    """Warn (once per function) when tracing drew from a global generator: the numbers are
    constants of the graph, the same at every call (tests/test_random.py pins this)."""
    after = _global_generators()
    changed = after[0] != before[0] or None not in (after[1], before[1]) and after[1] != before[1]
    if not changed or fun_name in _WARNED_RANDOM:
        return
    _WARNED_RANDOM.add(fun_name)
    which = "np.random" if after[0] != before[0] else "the random module"
    warnings.warn(
        f"fastgrad: {fun_name} used {which} while it was traced: the numbers it drew are "
        "frozen into the compiled function, so every call reuses them. Pass a key and draw "
        "with fg.random instead (fg.random.key(seed), split, uniform, normal, ...).",
        UserWarning,
        stacklevel=4,
    )


def name_of(fun: Any) -> str:
    return getattr(fun, "__name__", None) or type(fun).__name__


def run(graph: Graph, args: Sequence[Any]) -> list[Any]:
    """Run a graph: inline it into a trace if any input is traced, else execute it."""
    if any(isinstance(a, Tracer) for a in args):
        return eval_graph(graph, args)
    return run_graph(graph, [np.asarray(a) for a in args])


def param_names(fun: Callable[..., Any], nargs: int) -> list[str]:
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


def arg_leaf_names(args: Sequence[Any], names: Sequence[str]) -> list[str]:
    out = []
    for a, n in zip(args, names, strict=True):
        out.extend(leaf_paths(a, n))
    return out
