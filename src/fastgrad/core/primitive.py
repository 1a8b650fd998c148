"""The op record: a `Primitive` holds everything about one op, and `REGISTRY` holds them all.

Records are built and registered by the op families in fastgrad.ops (and, for ops whose
params are graphs, by fastgrad.transforms); everything else finds an op here by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastgrad.core.ir import Aval


@dataclass(eq=False)
class Primitive:
    """One op, defined in one place: its type rule, NumPy reference, VJP and JVP rules.

    - `abstract_eval(*avals, **params) -> Aval` checks inputs and gives the output type.
    - `impl(*arrays, **params) -> ndarray` is the NumPy reference implementation.
    - `vjp(g, out, *inputs, **params)` returns one cotangent (or None for "no gradient")
      per input; it is written with ops, so the backward pass is itself a graph. `vjp=None`
      means the op has no gradient at all (integer or boolean results).
    - `jvp(tangents, out, *inputs, **params)` returns the output's tangent, or None for a
      zero one; `tangents` holds one tangent per input, None where it is zero (at least one
      is not). Also written with ops. `jvp=None` goes with `vjp=None`: the tangent is zero.
    - `kind` is "elementwise", "reduction", "structural" or "other": fusion reads it.
    - `loop` is an elementwise op's scalar expression inside a fused loop.
    - `domain` names, per input, the range tests sample from ("real" where empty; see
      fastgrad.testing.strategies).
    - `effect` marks an op run for what it does (debug printing), not for its value: its
      node is never pruned, merged or folded, and its first input is a token, the output
      of the effect before it, so that effects run in program order (core.tracing).
    """

    name: str
    abstract_eval: Callable[..., Aval]
    impl: Callable[..., Any]
    vjp: Callable[..., Sequence[Any]] | None
    jvp: Callable[..., Any] | None = None
    kind: str = "other"
    domain: tuple[str, ...] = ()
    format: Callable[[list[str], dict[str, Any]], str] | None = None
    # Elementwise ops: the NumPy ufunc the op mirrors (for dtype rules), and the scalar
    # expression a fused loop computes: a template over operands {0}, {1}, ... where {T} is
    # the output's scalar type, or "call:NAME" for a math function (see codegen.loops).
    ufunc: Any = None
    loop: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    effect: bool = False

    def __repr__(self) -> str:
        return f"<primitive {self.name}>"


REGISTRY: dict[str, Primitive] = {}


def register(prim: Primitive) -> Primitive:
    """Add `prim` to the registry under its name (each name once)."""
    if prim.name in REGISTRY:
        raise ValueError(f"a primitive named {prim.name!r} is already registered")
    REGISTRY[prim.name] = prim
    return prim
