"""Hypothesis strategies: shapes, arrays within an op's domain, random programs.

`programs()` draws small random differentiable programs (DAGs of registered ops over
mutually broadcastable inputs). A `Program` runs on arrays or traced values alike, and
`Program.frozen(args)` gives the same function with every stop_gradient'ed value fixed at
its value at `args`: its finite differences are what the program's gradient must equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fastgrad import numpy as fnp
from fastgrad.core.primitive import REGISTRY

# Open intervals that keep each domain away from singular points, so finite differences
# are well conditioned.
DOMAINS: dict[str, tuple[float, float]] = {
    "real": (-2.0, 2.0),
    "positive": (0.2, 3.0),
    "nonzero": (0.2, 3.0),  # sampled with a random sign
    "unit": (-0.8, 0.8),
    "above_one": (1.2, 3.0),
    "above_minus_one": (-0.7, 3.0),
    "unit_interval": (0.02, 0.98),
    "below_two": (0.05, 1.95),
}
# Nonnegative whole numbers stored as floats: the order of polygamma.
ORDERS = (0, 3)


def shapes(
    min_dims: int = 0, max_dims: int = 3, max_side: int = 4
) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes, including 0-d, with sides from 1 to `max_side`."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side)


def broadcastable_shapes(
    num_shapes: int, max_dims: int = 3, max_side: int = 4
) -> st.SearchStrategy[tuple[tuple[int, ...], ...]]:
    """`num_shapes` shapes that broadcast together under NumPy's rules."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=0, max_dims=max_dims, min_side=1, max_side=max_side
    ).map(lambda b: tuple(b.input_shapes))


def arrays(
    shape: tuple[int, ...], dtype: Any = np.float64, domain: str = "real"
) -> st.SearchStrategy[np.ndarray]:
    """Arrays of `shape` and `dtype` with values inside `domain` (a name in DOMAINS, "bool",
    or "order" for whole numbers 0 to 3)."""
    dtype = np.dtype(dtype)
    if domain == "bool":
        return hnp.arrays(np.bool_, shape)
    if domain == "order":
        return hnp.arrays(dtype, shape, elements=st.integers(*ORDERS).map(float))
    lo, hi = DOMAINS[domain]
    width: Literal[32, 64] = 32 if dtype == np.float32 else 64
    lo, hi = float(dtype.type(lo)), float(dtype.type(hi))  # representable in `dtype`
    elements = st.floats(lo, hi, width=width, exclude_min=True, exclude_max=True)
    base = hnp.arrays(dtype, shape, elements=elements)
    if domain != "nonzero":
        return base
    signs = hnp.arrays(np.bool_, shape)
    return st.tuples(base, signs).map(lambda p: np.where(p[1], p[0], -p[0]).astype(dtype))


# ---------------------------------------------------------------- random programs

# Smooth ops with a "real" domain that cannot blow up on bounded inputs.
_UNARY = ["negative", "sin", "cos", "tanh", "arctan", "sigmoid", "square", "exp", "sinh",
          "arcsinh", "log", "sqrt", "log1p", "reciprocal", "arcsin", "abs", "cosh"]  # fmt: skip
_BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "logaddexp"]
_REDUCE = ["sum", "max", "min", "mean", "prod", "logsumexp"]


def _into(domain: str, v: Any) -> Any:
    """Map any real value into `domain`, smoothly, so programs stay within every op's domain
    and bounded."""
    t = fnp.tanh(v)
    if domain == "real":
        return 2.0 * t
    if domain in ("positive", "nonzero"):
        return 1.5 + t
    if domain == "unit":
        return 0.8 * t
    if domain == "above_one":
        return 2.5 + t
    if domain == "above_minus_one":
        return 0.5 + t
    raise ValueError(domain)


# Where a program's `where` steps jump. An odd value, so that inputs rarely sit on it;
# hypothesis still finds it now and then (Program.clear_of_jumps).
_THRESHOLD = 0.123457


@dataclass
class Step:
    op: str
    operands: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Program:
    """Inputs of `shapes`; each step appends one value; the output is the last value."""

    shapes: tuple[tuple[int, ...], ...]
    steps: list[Step]

    def __call__(self, *xs: Any) -> Any:
        return self._run(xs, frozen=None)

    def clear_of_jumps(self, xs: Sequence[np.ndarray], margin: float = 1e-4) -> bool:
        """Whether every `where` condition at `xs` is further than `margin` from the
        threshold where the program jumps: finite differences taken closer cross it
        (tests `assume` this before comparing against them)."""
        conditions: list[np.ndarray] = []
        self._run([np.asarray(x) for x in xs], frozen=None, conditions=conditions)
        return all(np.all(np.abs(c - _THRESHOLD) > margin) for c in conditions)

    def _run(
        self,
        xs: Sequence[Any],
        frozen: dict[int, np.ndarray] | None,
        conditions: list[np.ndarray] | None = None,
    ) -> Any:
        values = list(xs)
        for k, step in enumerate(self.steps):
            args = [values[i] for i in step.operands]
            if step.op == "stop_gradient":
                if frozen is None:
                    out = fnp.stop_gradient(args[0])
                else:  # the first run, on concrete inputs, records the frozen value
                    if k not in frozen:
                        frozen[k] = np.asarray(args[0])
                    out = frozen[k]
            elif step.op in _UNARY or step.op in _BINARY:
                prim = REGISTRY[step.op]
                domains = prim.domain or ("real",) * len(args)
                bounded = [_into(d, a) for d, a in zip(domains, args, strict=True)]
                out = getattr(fnp, step.op)(*bounded)
            elif step.op in _REDUCE:
                out = getattr(fnp, step.op)(args[0], **step.params)
            elif step.op == "where":
                if conditions is not None:
                    conditions.append(np.asarray(args[0]))
                out = fnp.where(fnp.greater(args[0], _THRESHOLD), args[1], args[2])
            else:  # pragma: no cover - the strategy draws only the ops above
                raise ValueError(step.op)
            values.append(out)
        return values[-1]

    def frozen(self, xs: Sequence[np.ndarray]) -> Any:
        """This program with stop_gradient'ed values fixed at their values at `xs`."""
        fixed: dict[int, np.ndarray] = {}
        self._run([np.asarray(x) for x in xs], frozen=fixed)
        return lambda *ys: self._run(ys, frozen=fixed)

    def __repr__(self) -> str:
        names = [f"x{i}" for i in range(len(self.shapes))]
        inputs = ", ".join(f"{n}{list(s)}" for n, s in zip(names, self.shapes, strict=True))
        lines = [f"Program({inputs})"]
        for k, step in enumerate(self.steps):
            args = ", ".join(names[i] for i in step.operands)
            extra = "".join(f", {p}={v!r}" for p, v in step.params.items())
            names.append(f"v{k}")
            lines.append(f"  v{k} = {step.op}({args}{extra})")
        return "\n".join(lines)


@st.composite
def programs(
    draw: Any,
    max_inputs: int = 3,
    max_steps: int = 6,
    stop_gradient: bool = True,
    shapes: tuple[tuple[int, ...], ...] | None = None,
) -> Program:
    """Random differentiable programs over 1 to `max_inputs` broadcastable inputs, or over
    inputs of the given `shapes`."""
    if shapes is None:
        n_in = draw(st.integers(1, max_inputs))
        shapes = draw(broadcastable_shapes(n_in, max_dims=3, max_side=3))
    in_shapes = tuple(shapes)
    shapes = list(in_shapes)
    steps: list[Step] = []
    ops = ["unary", "binary", "reduce", "where"] + (["stop_gradient"] if stop_gradient else [])
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(ops))
        a = draw(st.integers(0, len(shapes) - 1))
        if kind in ("binary", "where"):
            partners = [i for i, s in enumerate(shapes) if _broadcasts(s, shapes[a])]
            b = draw(st.sampled_from(partners))
            if kind == "binary":
                step = Step(draw(st.sampled_from(_BINARY)), (a, b))
                out_shape = np.broadcast_shapes(shapes[a], shapes[b])
            else:
                c = draw(
                    st.sampled_from(
                        [
                            i
                            for i in partners
                            if _broadcasts(shapes[i], np.broadcast_shapes(shapes[a], shapes[b]))
                        ]
                    )
                )
                step = Step("where", (a, b, c))
                out_shape = np.broadcast_shapes(shapes[a], shapes[b], shapes[c])
        elif kind == "reduce":
            ndim = len(shapes[a])
            axis = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1))) if ndim else None
            keepdims = draw(st.booleans())
            step = Step(draw(st.sampled_from(_REDUCE)), (a,), {"axis": axis, "keepdims": keepdims})
            out_shape = np.sum(np.zeros(shapes[a]), axis=axis, keepdims=keepdims).shape
        elif kind == "stop_gradient":
            step = Step("stop_gradient", (a,))
            out_shape = shapes[a]
        else:
            step = Step(draw(st.sampled_from(_UNARY)), (a,))
            out_shape = shapes[a]
        steps.append(step)
        shapes.append(tuple(out_shape))
    return Program(tuple(in_shapes), steps)


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False
