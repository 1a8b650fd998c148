"""The steps a partitioned graph runs (compiler.fusion makes them): a fused `Loop` of
elementwise work and the reductions it feeds, or a library `Call` of one node."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastgrad.core.ir import Node, Var

REDUCTIONS = frozenset({"sum", "max", "min", "prod"})


def row_keep(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if a in axes else d for a, d in enumerate(shape))


def row_drop(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for a, d in enumerate(shape) if a not in axes)


@dataclass(eq=False)
class Loop:
    """A fused loop: nodes in order, the level of each value, and what it reads and writes."""

    shape: tuple[int, ...]
    position: int
    reduce_axes: tuple[int, ...] = ()
    nodes: list[Node] = field(default_factory=list)
    level: dict[int, str] = field(default_factory=dict)
    inputs: list[Var] = field(default_factory=list)
    outputs: list[Var] = field(default_factory=list)

    def row_shapes(self) -> tuple[tuple[int, ...], ...]:
        if not self.reduce_axes:
            return ()
        return (row_keep(self.shape, self.reduce_axes), row_drop(self.shape, self.reduce_axes))

    def level_of_shape(self, shape: tuple[int, ...]) -> str | None:
        if shape == self.shape:
            return "elem"
        if shape in self.row_shapes():
            return "row"
        if shape == ():
            return "scalar"
        return None

    def has_row_values(self) -> bool:
        return "row" in self.level.values()


@dataclass(eq=False)
class Call:
    """One node run by its op's NumPy implementation."""

    node: Node
    position: int


Step = Loop | Call
