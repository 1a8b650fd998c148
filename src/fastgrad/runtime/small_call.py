"""The small-call path: a plan the interpreter runs as one segment, called with the very
layouts it was lowered for, as one generated Python function.

A jitted function's call at N=16 spent more time between Python and the kernel than in
it: the arena's slots, the segment's layout checks, Numba's dispatcher resolving the
argument tuple's type, and reshapes of 0-d outputs (5.6 us a call against 0.6 us of
kernel). Here the caller (api.jit) has already matched every argument's shape, dtype and
strides (its fast key) against those the segment was built for, so the function only
allocates the fresh outputs, calls the compiled interpreter's entry point for that tuple
type directly (no type resolution) and returns the outputs. It touches no arena slot:
the table's pointer entries are the only shared state, so it holds the plan's lock,
and a call that finds it taken returns None (the caller then runs the plan as usual).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.runtime.arena import staggered_empty

#: args -> the plan's outputs, or None when another call holds the plan
SmallCall = Callable[[Sequence[np.ndarray]], "list[np.ndarray] | None"]


def layouts(segment: Any, inputs: int) -> dict[int, tuple[Any, ...]] | None:
    """The (shape, dtype, strides) that each argument the segment reads must have, by
    argument position; None if it reads anything but arguments."""
    expected = {}
    for slot, shape, strides, dtype in segment.reads:
        if slot >= inputs:
            return None
        expected[slot] = (shape, dtype, strides)
    return expected


def for_layouts(built: Any, key: Sequence[Any]) -> SmallCall | None:
    """The small call of `built` (`build`'s result) if the arguments' layouts `key`
    ((shape, dtype, strides) of each) are those it was built for, else None."""
    if not built:
        return None
    call, expected = built
    matches = all(i < len(key) and key[i] == layout for i, layout in expected.items())
    return call if matches else None


def build(
    calls: Sequence[Any], outputs: Sequence[int], args: Sequence[np.ndarray], lock: threading.Lock
) -> tuple[SmallCall, dict[int, tuple[Any, ...]]] | bool:
    """The small call for an arena lowered to `calls` (outputs in slots `outputs`, the
    first slots its arguments, of which `args` are a call's), and the argument layouts
    it holds for; False unless the plan is one segment whose outputs are all fresh
    arrays it allocates (not views it exports, arguments or constants) and that checks
    no indices."""
    if len(calls) != 1 or not getattr(calls[0], "interpreted", False):
        return False
    segment = calls[0]
    expected = layouts(segment, len(args))
    fresh = {entry[4]: j for j, entry in enumerate(segment.fresh)}
    if (
        expected is None
        or segment.checks
        or segment.exports
        or not segment.reads
        or not all(slot in fresh for slot in outputs)
    ):
        return False
    empty = np.empty
    namespace: dict[str, Any] = {
        "entry": entry_point(
            (*(args[slot] for slot in expected), *(empty(*f[:2]) for f in segment.fresh))
        ),
        "table": segment.array,
        "at": segment.at,
        "acquire": lock.acquire,
        "release": lock.release,
        "empty": np.empty,
        "staggered_empty": staggered_empty,
    }
    lines = ["def small_call(args):"]
    lines += [f"    a{slot} = args[{slot}]" for slot, *_ in segment.reads]
    names = [f"a{slot}" for slot, *_ in segment.reads]
    for j, (shape, dtype, k, view, _slot, small) in enumerate(segment.fresh):
        namespace[f"d{j}"] = dtype
        if small:
            lines.append(f"    f{j} = g{j} = empty({shape!r}, d{j})")
        else:
            lines.append(f"    f{j} = staggered_empty({shape!r}, d{j}, {k})")
            lines.append(f"    g{j} = f{j}" + ("" if view is None else f".reshape({view!r})"))
        names.append(f"f{j}")
    lines += [
        "    if not acquire(False):",
        "        return None",
        "    try:",
        f"        entry(table, at, ({', '.join(names)},))",
        "    finally:",
        "        release()",
        f"    return [{', '.join(f'g{fresh[slot]}' for slot in outputs)}]",
    ]
    exec(compile("\n".join(lines), "<fastgrad small call>", "exec"), namespace)  # noqa: S102
    return namespace["small_call"], expected


def entry_point(arrays: tuple[np.ndarray, ...]) -> Callable[..., None]:
    """The interpreter compiled for the type of tuple `arrays` is, called without Numba's
    dispatcher resolving its arguments' types (0.6 us of a 1.4 us call with five arrays;
    the entry point takes 0.4): safe only for arguments of exactly that type, which the
    caller's layout match guarantees. The dispatcher itself where Numba keeps no entry
    point for it."""
    import numba

    from fastgrad.runtime.vm import run_steps

    signature = (numba.typeof(np.zeros(1, np.int64)), numba.int64, numba.typeof(arrays))
    compiled = run_steps.overloads.get(signature)
    entry = getattr(compiled, "entry_point", None)
    return run_steps if entry is None else entry
