"""The op record: a `Primitive` holds everything about one op, and `REGISTRY` holds them all.

Records are built and registered by the op families in fastgrad.ops (and, for ops whose
params are graphs, by fastgrad.transforms); everything else finds an op here by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval


@dataclass(frozen=True, eq=False)
class Point:
    """Inputs (and params) at which an op's derivatives are hard to get right.

    `args` holds one value per input (a float, or an array; integer arrays are indices and
    are not differentiated), `params` the op's params. `convention` names the row of
    docs/conventions.md that fixes the derivative where it is not defined by the function
    alone (a kink, a tie, a jump, an edge of the domain taken by convention).
    """

    args: tuple[Any, ...]
    params: dict[str, Any] = field(default_factory=dict)
    convention: str | None = None

    def __repr__(self) -> str:
        args = ", ".join(_short(a) for a in self.args)
        params = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"at({args}{params})"


def _short(a: Any) -> str:
    if isinstance(a, float | int):
        return repr(a)
    arr = np.asarray(a)
    if arr.ndim == 0:
        return repr(arr.item())
    body = np.array2string(arr, threshold=8, separator=", ").replace("\n", "")
    return f"{body}:{arr.dtype.name}[{','.join(map(str, arr.shape))}]"


def at(*args: Any, convention: str | None = None, **params: Any) -> Point:
    """A special point of an op: `at(0.0)`, `at(1.0, 1.0, convention="ties")`,
    `at(x, axis=(0,), keepdims=False)`."""
    return Point(tuple(args), dict(params), convention)


def points(*entries: Any) -> tuple[Point, ...]:
    """Special points of an elementwise op: each entry a number (one input), a tuple of
    numbers (one per input), or a `Point` (`at(...)`, for one with a convention)."""
    return tuple(
        e if isinstance(e, Point) else at(*(e if isinstance(e, tuple) else (e,))) for e in entries
    )


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
    - `batch(batched, *inputs, **params)` is the batching rule (vmap): `batched` says per
      input whether it carries a batch axis, always its leading one (at least one does);
      it returns the output with the batch axis leading. Written with ops, and so that
      the batch joins the op's own work (one fused loop, one BLAS call), never a loop.
    - `kind` is "elementwise", "reduction", "structural" or "other": fusion reads it.
    - `loop` is an elementwise op's scalar expression inside a fused loop.
    - `domain` names, per input, the range tests sample from ("real" where empty; see
      fastgrad.testing.strategies).
    - `special_points` are the `Point`s where the op is awkward: ties, kinks, zeros, domain
      edges, huge and non-finite values, size-0 and size-1 axes. Tests check the value and
      the derivatives at orders 1 to 3, in every mode, against an arbitrary-precision oracle
      there (tests/test_special_points.py); every op must list some.
    - `held_fixed` lists the positions of the inputs the op has no derivative in (the
      order of a Bessel function, the shape of an incomplete gamma function): its VJP
      gives `NoDerivative` there. Tests differentiate the other float inputs and check
      that asking for these raises.
    - `effect` marks an op run for what it does (debug printing), not for its value: its
      node is never pruned, merged or folded, and its first input is a token, the output
      of the effect before it, so that effects run in program order (core.tracing).
    """

    name: str
    abstract_eval: Callable[..., Aval]
    impl: Callable[..., Any]
    vjp: Callable[..., Sequence[Any]] | None
    jvp: Callable[..., Any] | None = None
    batch: Callable[..., Any] | None = None
    kind: str = "other"
    domain: tuple[str, ...] = ()
    format: Callable[[list[str], dict[str, Any]], str] | None = None
    # Elementwise ops: the NumPy ufunc the op mirrors (for dtype rules), and the scalar
    # expression a fused loop computes: a template over operands {0}, {1}, ... where {T} is
    # the output's scalar type, or "call:NAME" for a math function (see codegen.loops).
    ufunc: Any = None
    loop: str | None = None
    special_points: tuple[Point, ...] = ()
    held_fixed: tuple[int, ...] = ()
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


@dataclass(frozen=True)
class NoDerivative:
    """What a VJP rule gives for an input the op has no derivative by (the order of a Bessel
    function, the shape of an incomplete gamma function). Reverse mode raises `message` when
    a gradient would flow to that input, and ignores it otherwise; a JVP rule raises the
    same error itself when that input's tangent is not None."""

    message: str

    def error(self) -> ValueError:
        return ValueError(self.message)
