"""Each distinct loop's source generated once: loops of one structure (an unrolled loop's
steps: the T = 800 RNN's gradient has 3,197 loops and 5 kernels) share one generation,
its KernelSource re-bound to each loop's own values.

A loop's structure is everything the generator reads of it, with its values numbered in
order of appearance: its shape and reduced axes, each node's op, params (by type and
exact value: 1, 1.0 and True, 0.0 and -0.0 differ), operands, result's aval and level,
the loop's inputs and outputs, and of the graph's constants among its values, which they
are, their shapes and dtypes, and the value of one-element ones (the generator passes
those as scalars and bakes in what follows from them: exponents, codegen.powers; it reads
no other constant's value). With `parallel` and the vector-math set, that is all a
generation depends on, so two loops of one key get the same source text
(tests/test_source_memo.py checks it)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.loops import generate
from fastgrad.compiler.codegen.source import KernelSource
from fastgrad.compiler.steps import Loop
from fastgrad.core.ir import Var

# Sources kept at most (the oldest go first): a process's distinct loops, not its loops.
CAPACITY = 1024
# The KernelSource fields holding the loop's values, which a reuse re-binds.
_BOUND = ("inputs", "scalars", "outputs", "index_checks")
# By key: the other fields of the source generated first, and where its bound fields'
# values are among that loop's values (in the order the key numbers them).
_kept: dict[tuple[Any, ...], tuple[dict[str, Any], tuple[tuple[int, ...], ...]]] = {}
_lock = threading.Lock()  # (held to add: a dict's get is atomic)


def generated(
    loop: Loop,
    parallel: bool,
    vector_math: AbstractSet[tuple[str, str]],
    constants: dict[int, np.ndarray],
) -> KernelSource:
    """codegen.loops' `generate(loop, parallel, vector_math, constants)`, or the source
    generated for a loop of the same structure, bound to `loop`'s values."""
    key, values = structure(loop, parallel, vector_math, constants)
    try:
        kept = _kept.get(key)
    except TypeError:  # a param of a type that does not hash: generated each time
        return generate(loop, parallel, vector_math, constants)
    if kept is not None:
        fields, positions = kept
        bound = {f: [values[k] for k in at] for f, at in zip(_BOUND, positions, strict=True)}
        return KernelSource(**_copied(fields), **bound)
    source = generate(loop, parallel, vector_math, constants)
    number = {id(v): k for k, v in enumerate(values)}
    try:
        positions = tuple(tuple(number[id(v)] for v in getattr(source, f)) for f in _BOUND)
    except KeyError:  # a value not of the loop's own: not kept (none known)
        return source
    fields = {f.name: getattr(source, f.name) for f in dataclasses.fields(source)}
    fields = _copied({f: value for f, value in fields.items() if f not in _BOUND})
    if any(isinstance(x, Var) for v in fields.values() if type(v) in (list, set) for x in v):
        return source  # values where no re-binding puts the next loop's: not kept
    with _lock:
        if len(_kept) >= CAPACITY:
            del _kept[next(iter(_kept))]
        _kept[key] = (fields, positions)
    return source


def _copied(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with containers of their own: a source's are no other source's."""
    return {f: type(v)(v) if type(v) in (list, set) else v for f, v in fields.items()}


def clear() -> None:
    """Forget every kept source (a measure of preparation as a new process runs it)."""
    with _lock:
        _kept.clear()


def structure(
    loop: Loop,
    parallel: bool,
    vector_math: AbstractSet[tuple[str, str]],
    constants: dict[int, np.ndarray],
) -> tuple[tuple[Any, ...], list[Var]]:
    """(the key of `loop`'s structure, its values in the order the key numbers them)."""
    number: dict[int, int] = {}
    values: list[Var] = []
    level = loop.level
    parts: list[Any] = [parallel, vector_math, loop.shape, loop.reduce_axes]

    def numbered(v: Var) -> int:
        k = number[id(v)] = len(values)
        values.append(v)
        aval, constant = v.aval, constants.get(id(v))
        if constant is not None:  # (what the generator reads of a constant)
            constant = (constant.dtype, constant.shape, constant.size == 1 and constant.tobytes())
        parts.append((aval.shape, aval.dtype, aval.weak, level.get(id(v)), constant))
        return k

    seen = number.get
    parts.append(tuple([seen(id(v)) if id(v) in number else numbered(v) for v in loop.inputs]))
    for n in loop.nodes:
        operands = tuple([seen(id(v)) if id(v) in number else numbered(v) for v in n.inputs])
        out = seen(id(n.out))
        params = _exact(n.params) if n.params else ()
        parts.append((n.op, params, operands, numbered(n.out) if out is None else out))
    parts.append(tuple([seen(id(v)) if id(v) in number else numbered(v) for v in loop.outputs]))
    # Levels of values the loop does not hold would be read where the generator asks
    # whether any value is of a level (Loop.has_row_values): count them in.
    parts.append(len(level) - sum(id(v) in level for v in values))
    return tuple(parts), values


def _exact(value: Any) -> Any:
    """`value` (params, their items) as a key equal only to keys of values that print the
    same: its type beside each number (True == 1 == 1.0), floats by their bits (0.0 ==
    -0.0), arrays by dtype, shape and bytes."""
    kind = type(value)
    if kind is str or value is None:
        return value
    if kind is dict:
        return tuple((k, _exact(v)) for k, v in value.items())
    if kind is tuple or kind is list:
        return (kind, *map(_exact, value))
    if kind is float:
        return (float, value.hex())
    if kind is slice:
        return (slice, _exact(value.start), _exact(value.stop), _exact(value.step))
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        return (kind, array.dtype, array.shape, array.tobytes())
    return (kind, value)
