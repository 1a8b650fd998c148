"""The IR: a small typed graph of primitive nodes.

An `Aval` is a shape, a dtype and a weak-type flag; a `Var` carries one; a `Node` applies
a `Primitive` (core.primitive) to input vars and defines one output var; a `Graph` lists
its inputs, its nodes in a valid order, and its outputs. `Graph.verify` type-checks a
graph; `str(graph)` prints it (core.printer) so that it reads like the code it came from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fastgrad.core.printer import format_graph

if TYPE_CHECKING:
    from fastgrad.core.primitive import Primitive

SUPPORTED_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        "bool", "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64", "float32", "float64",
    )
)  # fmt: skip

_SHORT = {
    "bool": "bool", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "float16": "f16", "float32": "f32", "float64": "f64",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Aval:
    """The abstract value of an array: what tracing knows about it.

    `weak` marks a value that came from a Python scalar: in arithmetic it takes the dtype
    of the other operand (so ``x * 2.0`` keeps a float32 ``x`` float32), as in JAX.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    weak: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))  # asked at every traced op: no NumPy call

    @property
    def is_float(self) -> bool:
        return self.dtype.kind == "f"

    def __str__(self) -> str:
        name = _SHORT.get(self.dtype.name, self.dtype.name)
        return f"{name}[{','.join(map(str, self.shape))}]" + ("~" if self.weak else "")


def aval_of_array(x: np.ndarray | np.generic) -> Aval:
    return Aval(tuple(x.shape), x.dtype)


class Var:
    """A value in a graph; identity is the object itself. `hint` names it when printed."""

    __slots__ = ("aval", "hint")

    def __init__(self, aval: Aval, hint: str | None = None):
        self.aval = aval
        self.hint = hint

    def __repr__(self) -> str:
        return f"Var({self.hint or hex(id(self))}: {self.aval})"


class Node:
    """`out = op(*inputs, **params)`. Params are hashable Python values."""

    __slots__ = ("op", "inputs", "params", "out")

    def __init__(self, op: Primitive, inputs: Sequence[Var], params: dict[str, Any], out: Var):
        self.op = op
        self.inputs = tuple(inputs)
        self.params = params
        self.out = out

    def __repr__(self) -> str:
        return f"Node({self.op.name}, {self.inputs}, {self.params})"


class Graph:
    """Inputs, nodes in dependency order, outputs. Constants are nodes of op `const`.

    `fg.make_graph` traces a function into one; printing it shows the program.

    >>> graph = fg.make_graph(lambda x: fnp.sin(x) * 2.0)(np.ones(2))
    >>> [node.op.name for node in graph.nodes]
    ['sin', 'const', 'broadcast_to', 'multiply']
    >>> print(graph)
    graph(x: f64[2]):
        a: f64[2] = sin(x)
        b: f64[2] = broadcast_to(2.0, shape=(2,))
        c: f64[2] = a * b
        return (c,)
    """

    def __init__(self, inputs: Sequence[Var], nodes: Sequence[Node], outputs: Sequence[Var]):
        self.inputs = list(inputs)
        self.nodes = list(nodes)
        self.outputs = list(outputs)

    def verify(self, types: bool = True) -> Graph:
        """Check that every var is defined once before use and (with `types`) that every
        node's type is what its op's type rule gives. The type check re-derives each
        node's type (~3 us a node: 20 ms of a 6,600-node trace); tracing gives each
        node its rule's type as it binds it, so a trace checks its wiring alone unless
        `config.check_graphs` asks for types too (tests, debugging)."""
        defined: set[int] = set()
        for v in self.inputs:
            if id(v) in defined:
                raise ValueError(f"graph input {v!r} is listed twice")
            defined.add(id(v))
        for node in self.nodes:
            if not defined.issuperset(map(id, node.inputs)):
                v = next(v for v in node.inputs if id(v) not in defined)
                raise ValueError(f"{node!r} uses {v!r} before it is defined")
            if id(node.out) in defined:
                raise ValueError(f"{node.out!r} is defined twice")
            if not types:
                defined.add(id(node.out))
                continue
            expected = node.op.abstract_eval(*(v.aval for v in node.inputs), **node.params)
            if expected != node.out.aval:
                raise TypeError(
                    f"{node.op.name} should give {expected}, but its output is typed "
                    f"{node.out.aval}"
                )
            defined.add(id(node.out))
        for v in self.outputs:
            if id(v) not in defined:
                raise ValueError(f"graph output {v!r} is not defined")
        return self

    def __str__(self) -> str:
        return format_graph(self)

    __repr__ = __str__


def consumers(graph: Graph) -> dict[int, list[Node]]:
    """Map id(var) to the nodes that read it."""
    users: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            users.setdefault(id(v), []).append(node)
    return users


def live_nodes(nodes: Iterable[Node], outputs: Iterable[Var]) -> list[Node]:
    """The nodes that some output or some effect (debug printing) depends on, in their
    original order (dead-code elimination)."""
    nodes = list(nodes)
    needed = {id(v) for v in outputs}
    keep = []
    for node in reversed(nodes):
        if id(node.out) in needed or node.op.effect:
            keep.append(node)
            needed.update(map(id, node.inputs))  # (a generator: 2x the time, per node)
    keep.reverse()
    return keep
