"""What building an executable computes from its plan alone, kept on disk with the plan.

A plan read from disk (compiler.plan_cache) still had its executable built step by step:
every value's slot, each loop's NumPy tier, the fold of summed matmuls, the arena's
buffers, their lifetimes and offsets (~45 ms of the T=200 RNN's warm first call, on the
machine that measured it). `Tables` holds those results as plain data, stored beside the
plan under a key that adds the runtime layer's source and the one process fact they
depend on (whether kernels may run in parallel); a process that finds them builds only
what is its own (kernel tiers, bound calls, the arena's memory). Tables that do not fit
the plan they are given (`Stale`) are dropped and built again, never trusted.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastgrad.compiler import plan_cache
from fastgrad.compiler.fusion import Loop, Step
from fastgrad.compiler.plan_codec import array_form, constant_places
from fastgrad.core.ir import Graph
from fastgrad.runtime.thread_budget import numba_threads

KIND = "tables"
COUNTERS = plan_cache.Counters()


class Stale(Exception):
    """Stored tables that do not fit the plan they were given."""


@dataclass
class Tables:
    """An executable's build, as plain data (ints, strings, tuples and None)."""

    slots: tuple[int, ...]  # the slot of each value in `values(...)`'s order (-1: none)
    outputs: tuple[int, ...]  # the graph outputs' slots (a check)
    folded: frozenset[int]  # steps (indices in the plan) whose add BLAS accumulates
    matmuls: dict[int, tuple[int, bool]]  # step index -> (output slot, accumulate)
    numpy: dict[int, Any]  # a loop's step index -> its NumPy tier's tables
    arena: tuple[Any, ...]  # executable._arena's layout (arena_tables)
    products: Any  # thread_budget.products of the plan's graph (its matmuls' sizes)
    # The executable's steps themselves (runtime.stored_plan), built again without the
    # plan's graph; None where they have no stored form.
    steps: Any = None

    def encode(self) -> tuple[Any, ...]:
        return (
            self.slots,
            self.outputs,
            tuple(sorted(self.folded)),
            tuple(sorted((k, *v) for k, v in self.matmuls.items())),
            tuple(sorted(self.numpy.items())),
            self.arena,
            self.products,
            self.steps,
        )

    @classmethod
    def decode(cls, data: tuple[Any, ...]) -> Tables:
        slots, outputs, folded, matmuls, numpy, arena, products, steps = data
        return cls(
            slots,
            outputs,
            frozenset(folded),
            {k: (out, accumulate) for k, out, accumulate in matmuls},
            dict(numpy),
            arena,
            products,
            steps,
        )


def values(graph: Graph, steps: list[Step]) -> list[Any]:
    """A plan's values in an order that follows from the plan alone: the graph's inputs and
    nodes, then the values of nodes fusion made for its loops."""
    out = [*graph.inputs, *map(_out, graph.nodes)]
    seen = set(out)  # (a Var hashes by identity)
    for step in steps:
        if isinstance(step, Loop):
            for var in map(_out, step.nodes):
                if var not in seen:
                    seen.add(var)
                    out.append(var)
    return out


_out = operator.attrgetter("out")


def slot_table(tables: Tables, graph: Graph, steps: list[Step]) -> dict[Any, int]:
    """The stored slots, by value."""
    order = values(graph, steps)
    if len(order) != len(tables.slots):
        raise Stale("the tables number another count of values")
    return {v: k for v, k in zip(order, tables.slots, strict=True) if k >= 0}


@functools.lru_cache(maxsize=1)
def runtime_version() -> str:
    """A digest of the runtime layer's source (read once per process): what builds an
    executable, and so what the tables depend on besides the plan."""
    folder = Path(__file__).parent
    return plan_cache.sources_digest(folder.parent, (folder.name,), recursive=False)


def key(plan_key: str) -> str:
    """The tables' file name part: the plan's key, the runtime's source, and whether loops
    may run in parallel here (which of a loop's kernel variants its step runs)."""
    parts = (plan_key, runtime_version(), str(numba_threads() > 1))
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=20).hexdigest()


def load(plan_key: str) -> Tables | None:
    """The tables stored for the plan of `plan_key`, or None (none, or unusable: removed)."""
    return plan_cache.load_kind(key(plan_key), KIND, Tables.decode, COUNTERS)


def save(plan_key: str, tables: Tables, traced: Graph) -> None:
    """Store `tables`, built for the plan of `traced` (whose constants the stored steps
    refer to rather than hold: plan_codec.constant_places)."""
    if tables.steps is not None:
        steps = encode_arrays(tables.steps, constant_places(traced))
        tables = dataclasses.replace(tables, steps=steps)
    plan_cache.save_kind(key(plan_key), KIND, tables.encode, COUNTERS)


def encode_arrays(form: tuple[Any, ...], traced_consts: dict[int, int]) -> tuple[Any, ...]:
    """runtime.stored_plan.describe's form with its arrays as data: a constant of the
    traced graph by its place among them (`traced_consts`: id of its value -> place),
    others by their bytes."""
    *rest, arrays = form
    return (*rest, tuple(array_form(a, traced_consts) for a in arrays))


def drop(plan_key: str) -> None:
    """Remove tables found not to fit their plan (they are built and stored again)."""
    COUNTERS.dropped += 1
    try:
        plan_cache.path_of(key(plan_key), KIND).unlink()
    except OSError:  # gone already, or another process replaced it
        pass
