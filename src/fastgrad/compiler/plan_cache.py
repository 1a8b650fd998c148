"""Prepared plans kept on disk, so that a new process tracing a known graph skips
simplification, partitioning and code generation.

A plan is stored in `<cache dir>/plans/<key>.plan`, the key a digest of the traced graph
(compiler.graph_key.graph_digest: its structure, types, names and constants) and of what
preparation depends on besides: the source of fastgrad's layers that prepare a graph
(core, ops, transforms, compiler: any edit there is a new version, no number kept by
hand; the digest is kept under the files' sizes and modification times,
`sources_digest`), Numba's, llvmlite's and NumPy's versions, Python and the CPU
(`environment_tag`). The file is a format tag, a sha256 of the key and the payload, then
the payload: the plan as plain data (tuples, ints, strings, bytes), unpickled by an
unpickler that refuses every class.
A file that is truncated, damaged, of another format, stored under another key or that
does not fit the graph is removed and the plan built again, never trusted; files are
written through a temporary name and a rename (machine_code.write_atomically), so
processes writing the same plan at once, or killed while writing, leave a whole file.
`config.plan_cache` (`FASTGRAD_PLAN_CACHE=0`) turns the cache off; `config.plan_cache_mb`
bounds the folder, the least recently written or read files removed first
(compiler.cache_eviction).

Other products of preparation are kept the same way, under a key that also says which
one: `load_graph` and `save_graph` hold a whole graph (fastgrad.api.grad stores the
reverse-mode graph of a traced function, so that tracing `jit(value_and_grad(f))` in a new
process runs no VJP rule); `load_kind` and `save_kind` any plain data (the executable's
build, runtime.build_tables).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fastgrad.compiler.cache_eviction import evict, touch
from fastgrad.compiler.codegen.source import KernelSource
from fastgrad.compiler.fusion import Step
from fastgrad.compiler.graph_key import graph_digest
from fastgrad.compiler.machine_code import (
    cache_unusable,
    environment_tag,
    sealed,
    unsealed,
    write_atomically,
)
from fastgrad.compiler.plan_codec import (
    Uncacheable,
    decode_graph,
    decode_plan,
    encode_graph,
    encode_plan,
    op_facts,
)
from fastgrad.core.config import cache_dir, config
from fastgrad.core.interpreter import DeferredGraph, node_count
from fastgrad.core.ir import Graph
from fastgrad.core.tracing import CONST

FOLDER = "plans"
FORMAT = b"fastgrad-plan-3\n"  # changes with the file layout
# Graphs smaller than this are prepared afresh: reading a plan has a fixed cost (the
# planning layers' source digest once per process, a file per graph), and a 64-node
# gradient (W4, the MLP) took 3.7 ms to prepare, 5.4 ms through the cache.
MIN_NODES = 200
# The layers whose code decides what a traced graph's plan is, and what names it (api:
# trace's `_inlined` and grad's stored backward graph make an inlined plan's key). The
# runtime takes the plan as it is: the executable is built afresh in every process.
_PLANNING = ("api", "core", "ops", "transforms", "compiler")

Plan = tuple[Graph, list[Step], dict[tuple[int, bool], KernelSource]]
T = TypeVar("T")


class Counters:
    """Plans loaded (a plan's executable built from its stored steps counts as its plan
    loaded: runtime.stored_plan), saved, built because none was stored, and dropped as
    unusable."""

    def __init__(self) -> None:
        self.loaded = self.saved = self.missed = self.dropped = self.uncacheable = 0


COUNTERS = Counters()  # plans
GRAPH_COUNTERS = Counters()  # other graphs (load_graph, save_graph)


@functools.lru_cache(maxsize=1)
def source_version() -> str:
    """A digest of the source of fastgrad's planning layers (once per process)."""
    return sources_digest(Path(__file__).parents[1], _PLANNING)


def sources_digest(package: Path, folders: tuple[str, ...], recursive: bool = True) -> str:
    """A digest of the Python files in `folders` of `package` (and in their subfolders,
    with `recursive`): their paths and contents. Kept in the cache directory under a key
    of their paths, sizes and modification times, which Python's own bytecode cache trusts
    likewise: a process whose sources are unchanged reads none of them (~95 files, ~1 MB:
    ~5 ms of a warm first call, on the loaded machine that measured it)."""
    files: list[tuple[str, str, os.stat_result]] = []  # (path in the package, full, stat)
    top = str(package)
    for folder in folders:
        below = [(folder, os.path.join(top, folder))]  # (path in the package, full path)
        while below:
            rel, path = below.pop()
            with os.scandir(path) as entries:
                for entry in entries:
                    name = entry.name
                    if name.endswith(".py") and entry.is_file():
                        files.append((f"{rel}/{name}", entry.path, entry.stat()))
                    elif (
                        recursive and name != "__pycache__" and entry.is_dir(follow_symlinks=False)
                    ):
                        below.append((f"{rel}/{name}", entry.path))  # (as os.walk: no links)
    files.sort()
    # (one string for the stamp, not an update a file: ~109 files at a first call)
    text = "".join([f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0" for rel, _, st in files])
    stamp = hashlib.blake2b(FORMAT + text.encode(), digest_size=20)
    record = path_of(stamp.hexdigest(), "sources")
    try:
        known = record.read_text()
    except (OSError, ValueError):
        known = ""
    if len(known) == 40 and all(c in "0123456789abcdef" for c in known):
        return known
    digest = hashlib.blake2b(digest_size=20)
    for rel, full, _ in files:
        digest.update(rel.encode() + b"\0")
        with open(full, "rb") as f:
            digest.update(f.read())
    try:
        write_atomically(record, digest.hexdigest().encode())
    except OSError:  # an unwritable cache: read again by the next process
        pass
    return digest.hexdigest()


def plan_key(graph: Graph, *extra: Any) -> str | None:
    """The file name part for `graph`'s plan (or, with `extra` saying which, for another
    product of preparing it), or None if the graph cannot be cached or is too small to
    gain from it."""
    structure = _facts(graph_digest, graph)
    if structure is None:
        return None
    parts = [FORMAT.decode(), source_version(), environment_tag(), np.__version__, structure]
    parts.append(repr(extra))
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=20).hexdigest()


def inlined_key(graph: Graph, parts: tuple[Any, ...]) -> str | None:
    """`plan_key` of a graph that is a stored graph inlined and nothing else (api.trace's
    `_inlined` parts: that graph's key, where its inputs come from, `graph`'s inputs and
    sizes), with no digest of its nodes, which follow from those parts; what planning
    reads of its ops' records is read still (one changed at run time is another key):
    those of the graph inlined (`source`, read from its rows if stored) and constants'."""
    held = isinstance(graph, DeferredGraph) and graph.source is not None  # (nodes unmade)
    source = graph.source if held else graph
    if node_count(source) < MIN_NODES:  # (a graph held back keeps its nodes unmade)
        return None
    try:
        facts = op_facts(source, extra=(CONST,))
    except Uncacheable:
        COUNTERS.uncacheable += 1
        return None
    text = repr(("inlined", FORMAT.decode(), *parts, facts))
    return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


def _facts(read: Callable[[Graph], T], graph: Graph) -> T | None:
    """`read(graph)`, what a key is made of; None where the graph is too small to gain
    from a stored plan, or `read` finds something uncacheable in it (counted)."""
    if len(graph.nodes) < MIN_NODES:
        return None
    try:
        return read(graph)
    except Uncacheable:
        COUNTERS.uncacheable += 1
        return None


def path_of(key: str, kind: str = "plan") -> Path:
    return cache_dir() / FOLDER / f"{key}.{kind}"


class _PlainUnpickler(pickle.Unpickler):
    """Builtins only: a payload naming any class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a plan may not hold {module}.{name}")


def load_kind(key: str, kind: str, rebuild: Callable[[Any], T], counters: Counters) -> T | None:
    """`rebuild(data)` of the data stored for `key`; None when there is none or when the
    file is unusable (which is then removed)."""
    path = path_of(key, kind)
    try:
        touch(path)  # used now: kept by evictions while it is read
        blob = path.read_bytes()
    except FileNotFoundError:
        counters.missed += 1
        return None
    except OSError as error:
        cache_unusable(path, error)
        return None
    try:
        if blob[: len(FORMAT)] != FORMAT:
            raise ValueError("another format")
        payload = unsealed(key.encode(), blob[len(FORMAT) :])
        value = rebuild(_PlainUnpickler(io.BytesIO(payload)).load())
    except Exception:  # damaged, foreign or not fitting this graph: build it again
        counters.dropped += 1
        try:
            path.unlink()
        except OSError:  # gone already: another process dropped or replaced it
            pass
        return None
    counters.loaded += 1
    return value


def save_kind(key: str, kind: str, encode: Callable[[], Any], counters: Counters) -> None:
    """Store `encode()` under `key`; data that has no plain form, or a cache that cannot
    be written (warned about once), is skipped."""
    try:
        # Without pickle's memo, as graph_key.graph_digest: the bytes follow from the plan
        # alone, not from which of its equal tuples and strings happen to be one object (an
        # inlined graph's nodes share their avals with the graph they came from).
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=5)
        pickler.fast = True
        pickler.dump(encode())
        payload = buffer.getvalue()
    except Uncacheable:
        counters.uncacheable += 1
        return
    path = path_of(key, kind)
    try:
        write_atomically(path, FORMAT + sealed(key.encode(), payload))
    except OSError as error:
        cache_unusable(path, error)
        return
    counters.saved += 1
    evict(path.parent, config.plan_cache_mb << 20)


def load(key: str, traced: Graph) -> Plan | None:
    """The stored plan for `key`, rebuilt for `traced`, or None."""
    return load_kind(key, "plan", lambda data: decode_plan(traced, data), COUNTERS)


def save(key: str, traced: Graph, plan: Plan) -> None:
    """Store `plan` (prepared from `traced`) under `key`."""
    save_kind(key, "plan", lambda: encode_plan(traced, *plan), COUNTERS)


def load_graph(key: str) -> Graph | None:
    """The graph stored under `key` (a derivative's graph, say), or None."""
    return load_kind(key, "graph", decode_graph, GRAPH_COUNTERS)


def save_graph(key: str, graph: Graph) -> None:
    save_kind(key, "graph", lambda: encode_graph(graph), GRAPH_COUNTERS)
