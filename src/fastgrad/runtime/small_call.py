"""The small-call path: a plan the interpreter runs as one segment, called with the very
layouts it was lowered for, as one generated Python function.

A jitted function's call at N=16 spent more time between Python and the kernel than in
it: the arena's slots, the segment's layout checks, Numba's dispatcher resolving the
argument tuple's type, and reshapes of 0-d outputs (5.6 us a call against 0.6 us of
kernel). Here one function generated per plan and argument layouts does all of a call:
it matches the arguments (count, exact type, and each one's shape, dtype and strides)
against those it was made for, makes the kernels' index checks, allocates the fresh
outputs, calls the compiled interpreter's entry point for that tuple type directly (no
type resolution), makes the views it returns and returns the result's structure
itself. Arguments it returns (or views of them) are copied: what the caller receives is
always its own. It touches no arena slot: the table's pointer entries are the only
shared state, so it holds the plan's lock. It returns MISS for other arguments, or when
another call holds the plan (the caller then runs the plan as usual).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastgrad.core.miss import MISS
from fastgrad.core.pytree import TreeDef, builder, expression
from fastgrad.runtime.arena import staggered_empty
from fastgrad.runtime.ownership import borrowed

#: args -> the plan's result, or MISS (other arguments, or another call holds the plan)
SmallCall = Callable[[Sequence[np.ndarray]], Any]


# A view step's op (runtime.executable's `view`) as source: its input, its parameter.
_VIEWS = {
    "slice": "{}[{}]",
    "transpose": "{}.transpose({})",
    "reshape": "{}.reshape({})",
    "broadcast_to": "broadcast_to({}, {})",
}


@dataclass
class Plan:
    """What a small call runs: the segment, its entry point and lock, the argument
    layouts it holds for, and the source lines after the arguments' match."""

    expected: dict[int, tuple[Any, ...]]  # argument position -> (shape, dtype, strides)
    body: list[str]
    outputs: list[str]  # each output's expression
    namespace: dict[str, Any]


def layouts(segment: Any, inputs: int) -> dict[int, tuple[Any, ...]] | None:
    """The (shape, dtype, strides) that each argument the segment reads must have, by
    argument position; None if it reads anything but arguments."""
    expected = {}
    for slot, shape, strides, dtype in segment.reads:
        if slot >= inputs:
            return None
        expected[slot] = (shape, dtype, strides)
    return expected


def build(
    calls: Sequence[Any], outputs: Sequence[int], args: Sequence[np.ndarray], lock: threading.Lock
) -> Plan | bool:
    """The small call's plan for an arena lowered to `calls` (outputs in slots `outputs`,
    the first slots its arguments, of which `args` are a call's); False unless the plan is
    one segment that reads only arguments, checks indices only of arguments, and whose
    outputs are arrays it allocates, views of them or of arguments, or arguments."""
    if len(calls) != 1 or not getattr(calls[0], "interpreted", False):
        return False
    segment = calls[0]
    expected = layouts(segment, len(args))
    if (
        expected is None
        or not segment.reads
        or not all(slot < len(args) for check in segment.checks for slot in check.__self__.checks)
    ):
        return False
    namespace: dict[str, Any] = {
        "table": segment.array,
        "at": segment.at,
        "acquire": lock.acquire,
        "release": lock.release,
        "empty": np.empty,
        "broadcast_to": np.broadcast_to,
        "array": np.array,
        "staggered_empty": staggered_empty,
    }
    names = {slot: f"a{slot}" for slot in range(len(args))}  # slot -> what holds its array
    body = [f"    check{j}(args)" for j in range(len(segment.checks))]
    namespace.update((f"check{j}", check) for j, check in enumerate(segment.checks))
    arrays = [f"a{slot}" for slot in expected]
    for j, (shape, dtype, k, shaped, slot, small) in enumerate(segment.fresh):
        namespace[f"d{j}"] = dtype
        if small:
            body.append(f"    f{j} = g{j} = empty({shape!r}, d{j})")
        else:
            body.append(f"    f{j} = staggered_empty({shape!r}, d{j}, {k})")
            body.append(f"    g{j} = f{j}" + ("" if shaped is None else f".reshape({shaped!r})"))
        arrays.append(f"f{j}")
        names[slot] = f"g{j}"
    # The segment's entry, compiled for its stand-ins' type: a read-only argument is
    # another Numba type, for which the dispatcher would compile the interpreter inside
    # this call; the match above keeps shapes, dtypes and strides.
    namespace["entry"] = segment.run
    namespace.update(hold=segment.hold, drop=drop, locks=segment.locks)  # LOOP rows' loops'
    body += [
        "    if not acquire(False):",
        "        return MISS",
        "    if not hold():",
        "        release()",
        "        return MISS",
        "    try:",
        f"        entry(table, at, ({', '.join(arrays)},))",
        "    finally:",
        "        drop(locks)",
        "        release()",
    ]
    views = segment.view_steps.items()  # in the order they run
    lent = borrowed(((step.ins[0], slot) for slot, step in views), len(args))
    for slot, step in views:
        source = step.ins[0]
        if slot not in segment.exported:
            continue
        if source not in names:
            return False  # a view of a buffer or a constant: the arena's path
        namespace[f"p{slot}"] = step.arg
        body.append(f"    v{slot} = " + _VIEWS[step.op].format(names[source], f"p{slot}"))
        names[slot] = f"v{slot}"
    if not all(slot in names for slot in outputs):
        return False  # a constant, or a view of one
    # An argument returned (or a view of one) is copied: the caller's own, as the arena's
    # path returns it.
    returned = [f"array({names[s]}, copy=True)" if s in lent else names[s] for s in outputs]
    return Plan(expected, body, returned, namespace)


def function(plan: Plan | bool, key: Sequence[Any], tree: TreeDef) -> SmallCall | None:
    """The small call of `plan` (`build`'s) for arguments of layouts `key` ((shape,
    dtype, strides) of each), returning the structure `tree`; None if `plan` does not
    hold for those layouts."""
    if not plan or not all(
        i < len(key) and key[i] == layout for i, layout in plan.expected.items()
    ):
        return None
    n = len(key)
    names = [f"a{i}" for i in range(n)]
    attributes = ", ".join(f"{a}.shape, {a}.dtype, {a}.strides" for a in names)
    namespace = dict(plan.namespace, MISS=MISS, ND=np.ndarray, K=tuple(x for k in key for x in k))
    result = expression(tree, plan.outputs)
    if result is None:
        namespace["build"] = builder(tree)
        result = f"build([{', '.join(plan.outputs)}])"
    lines = [
        "def small_call(args):",
        f"    if len(args) != {n}:",
        "        return MISS",
        f"    {', '.join(names)}, = args",
        "    if "
        + " or ".join(f"type({a}) is not ND" for a in names)
        + f" or ({attributes},) != K:",
        "        return MISS",
        *plan.body,
        f"    return {result}",
    ]
    exec(compile("\n".join(lines), "<fastgrad small call>", "exec"), namespace)  # noqa: S102
    return namespace["small_call"]  # type: ignore[no-any-return]


def take(locks: Sequence[Any]) -> bool:
    """Whether all of `locks` were free and are now held (else none is held)."""
    for k, lock in enumerate(locks):
        if not lock.acquire(False):
            drop(locks[:k])
            return False
    return True


def drop(locks: Sequence[Any]) -> None:
    for lock in locks:
        lock.release()


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
