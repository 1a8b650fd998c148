"""The argument plumbing every op family uses, and the four functions every rule needs.

Broadcasting and dtype promotion are made explicit here, in one place: an elementwise
primitive always sees operands of one shape and one dtype. `astype`, `broadcast_to`,
`reshape` and `sum` are the functions VJP/JVP rules of every family build on; they find
their records (in fastgrad.ops.elementwise, .shape and .reduction) in the registry by name,
so any family can use them without importing another.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import REGISTRY
from fastgrad.core.tracing import Tracer, aval_of, bind, current_trace, static_error

# ---------------------------------------------------------------- broadcasting and dtypes


_STANDINS = {"b": False, "i": 0, "u": 0, "f": 0.0}
# Promotions met, by the operands' (dtype, weak) pairs: np.result_type costs ~2 us a call,
# and a program promotes the same few pairs over and over. Promotion depends on the
# dtypes alone (NumPy's rules, fixed for a process), so an entry never goes stale.
_PROMOTED: dict[tuple[tuple[np.dtype, bool], ...], tuple[np.dtype, bool]] = {}


def promote(avals: Sequence[Aval]) -> tuple[np.dtype, bool]:
    """(dtype, whether all operands are weak): NumPy's promotion, with Python scalars weak
    (they take the other operand's dtype)."""
    key = tuple([(a.dtype, a.weak) for a in avals])
    hit = _PROMOTED.get(key)
    if hit is None:
        strong = [d for d, weak in key if not weak]
        weak = [_STANDINS[d.kind] for d, weak in key if weak]
        hit = np.result_type(*strong, *weak), not strong
        if len(_PROMOTED) < 4096:  # (a bound against programs of many-operand calls)
            _PROMOTED[key] = hit
    return hit


def broadcast_shapes(*shapes: tuple[int, ...], what: str = "operands") -> tuple[int, ...]:
    """NumPy's broadcast of `shapes`, in Python for shapes of ints (np.broadcast_shapes
    makes an array per shape: ~5 us where this takes ~1), NumPy's own for anything else."""
    out = _broadcast(shapes)
    if out is not None:
        return out
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        shown = " and ".join(str(tuple(s)) for s in shapes)
        raise ValueError(
            f"{what}: shapes {shown} cannot be broadcast together (NumPy rules: trailing axes "
            "must be equal or 1)"
        ) from None


def _broadcast(shapes: tuple[tuple[int, ...], ...]) -> tuple[int, ...] | None:
    """The broadcast shape of tuples of non-negative ints; None where NumPy decides (an
    error, a negative size, a shape of another type)."""
    ndim = 0
    for shape in shapes:
        if type(shape) is not tuple:
            return None
        ndim = max(ndim, len(shape))
    out = [1] * ndim
    for shape in shapes:
        k = ndim - len(shape)
        for d in shape:
            if type(d) is not int or d < 0:
                return None
            if d != out[k]:
                if out[k] == 1:
                    out[k] = d
                elif d != 1:
                    return None
            k += 1
    return tuple(out)


def lift(x: Any) -> Any:
    # Inside a trace, a concrete operand becomes a graph constant before it is broadcast,
    # so the graph keeps a scalar constant rather than a full-size array.
    trace = current_trace()
    if trace is None or isinstance(x, Tracer):
        return x
    return Tracer(trace, trace.to_var(x))


def coerce(x: Any, aval: Aval, dtype: np.dtype, shape: tuple[int, ...], tracing: bool) -> Any:
    if not isinstance(x, Tracer):
        x = np.asarray(x, dtype=dtype)
        if tracing:
            x = lift(x)
    elif aval.dtype != dtype:
        x = bind(REGISTRY["astype"], x, dtype=dtype)
    if tuple(x.shape) != shape:
        x = bind(REGISTRY["broadcast_to"], x, shape=shape)
    return x


def apply_elementwise(name: str, *args: Any) -> Any:
    """Apply elementwise primitive `name` after promoting and broadcasting its operands."""
    if _alike(args):  # nothing to promote nor broadcast: most ops of a traced program
        return bind(REGISTRY[name], *args)
    avals = [aval_of(a) for a in args]
    shape = broadcast_shapes(*[a.shape for a in avals], what=name)
    dtype, weak = promote(avals)
    tracing = Tracer in map(type, args)
    if weak and not tracing:
        return bind(REGISTRY[name], *[np.asarray(a) for a in args])
    return bind(
        REGISTRY[name],
        *[coerce(a, v, dtype, shape, tracing) for a, v in zip(args, avals, strict=True)],
    )


def _alike(args: tuple[Any, ...]) -> bool:
    """Whether `args` are all tracers of one shape and one dtype, none weakly typed: what
    promotion and broadcasting leave as they are (~4 us an op at T=200 in the RNN)."""
    for a in args:
        if type(a) is not Tracer:
            return False
        aval = a._var.aval
        if aval.weak:
            return False
        first = args[0]._var.aval
        if aval.shape != first.shape or aval.dtype != first.dtype:
            return False
    return True


def is_traced(*xs: Any) -> bool:
    return any(isinstance(x, Tracer) for x in xs)


def tangent_sum(tangents: Any, *parts: Callable[[Any], Any]) -> Any:
    """The sum over inputs with a tangent t_i of parts[i](t_i): a JVP is linear in the
    tangents, and an input without one (None) adds no term. None if no term is left."""
    total = None
    for t, part in zip(tangents, parts, strict=True):
        if t is not None:
            total = part(t) if total is None else total + part(t)
    return total


# ---------------------------------------------------------------- axes and shapes


def _traced_entry(value: Any) -> Tracer | None:
    """`value` if it is a tracer, or the first tracer in it if it is a tuple or list."""
    if isinstance(value, Tracer):
        return value
    if isinstance(value, tuple | list):
        return next((v for v in value if isinstance(v, Tracer)), None)
    return None


def normalize_axis(axis: Any, ndim: int, what: str = "axis") -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    traced = _traced_entry(axis)
    if traced is not None:
        raise static_error(what, traced, "a Python int or a tuple of ints")
    axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
    out = []
    for a in axes:
        a = operator.index(a)
        if not -ndim <= a < builtins.max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            raise ValueError(f"{what} {a} is out of bounds for an array of {ndim} dimensions")
        out.append(a % builtins.max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {axis} repeats an axis")
    return tuple(sorted(out)) if ndim else ()


def shape_tuple(shape: Any, what: str) -> tuple[int, ...]:
    traced = _traced_entry(shape)
    if traced is not None:
        raise static_error(what, traced, "a tuple of Python ints")
    if isinstance(shape, int | np.integer):
        return (int(shape),)
    try:
        return tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"{what} must be a tuple of ints, got {shape!r}") from None


# ---------------------------------------------------------------- the functions rules build on


def astype(x: Any, dtype: Any) -> Any:
    """`x` converted to `dtype` (a no-op when it already has it).

    >>> astype(np.array([1.7, -1.7]), np.int64)
    array([ 1, -1])
    >>> fg.grad(lambda x: astype(x, np.float32) * 2)(1.0)
    array(2.)
    """
    dtype = np.dtype(dtype)
    if aval_of(x).dtype == dtype and not (isinstance(x, Tracer) and x.aval.weak):
        return x if isinstance(x, Tracer) else np.asarray(x)
    if not isinstance(x, Tracer):
        return np.asarray(x).astype(dtype)
    return bind(REGISTRY["astype"], x, dtype=dtype)


def broadcast_to(x: Any, shape: Any) -> Any:
    """`x` broadcast to `shape` by NumPy's rules.

    >>> broadcast_to(np.array([1.0, 2.0]), (2, 2))
    array([[1., 2.],
           [1., 2.]])
    >>> fg.grad(lambda x: fnp.sum(broadcast_to(x, (3, 2))))(np.zeros(2))
    array([3., 3.])
    """
    aval = aval_of(x)
    shape = shape_tuple(shape, "broadcast_to shape")
    if broadcast_shapes(aval.shape, shape, what="broadcast_to") != shape:
        raise ValueError(f"broadcast_to: cannot broadcast shape {aval.shape} to {shape}")
    if shape == aval.shape:
        return x if isinstance(x, Tracer) else np.asarray(x)
    return bind(
        REGISTRY["broadcast_to"],
        lift(np.asarray(x)) if not isinstance(x, Tracer) else x,
        shape=shape,
    )


def reshape(x: Any, shape: Any) -> Any:
    """`x` with a new shape of the same size; one dimension may be -1.

    >>> reshape(np.arange(6.0), (2, -1))
    array([[0., 1., 2.],
           [3., 4., 5.]])
    """
    aval = aval_of(x)
    shape = shape_tuple(shape, "reshape shape")
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"reshape: bad shape {shape} (at most one -1, no other negatives)")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or aval.size % known:
            raise ValueError(f"cannot reshape an array of shape {aval.shape} into shape {shape}")
        shape = tuple(aval.size // known if d == -1 else d for d in shape)
    if math.prod(shape) != aval.size:
        raise ValueError(f"cannot reshape an array of shape {aval.shape} into shape {shape}")
    if shape == aval.shape:
        return x if isinstance(x, Tracer) else np.asarray(x)
    return bind(REGISTRY["reshape"], x if isinstance(x, Tracer) else np.asarray(x), shape=shape)


def sum(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Sum over `axis` (an int, a tuple, or None for all).

    >>> sum(np.arange(6.0).reshape(2, 3), axis=1)
    array([ 3., 12.])
    """
    if not isinstance(x, Tracer):
        x = np.asarray(x)
    axes = normalize_axis(axis, x.ndim)
    return bind(REGISTRY["sum"], x, axis=axes, keepdims=bool(keepdims))


# ---------------------------------------------------------------- batching rules (vmap)


def batch_size(batched: Sequence[bool], args: Sequence[Any]) -> int:
    """The batch size: the leading axis of the batched operands (a rule gets at least one)."""
    return next(aval_of(a).shape[0] for a, b in zip(args, batched, strict=True) if b)


def with_batch(x: Any, size: int) -> Any:
    """One example `x` repeated along a new leading batch axis (a broadcast: in a fused loop
    it is a read of `x`, not a copy)."""
    aval = aval_of(x)
    return broadcast_to(x, (size, *aval.shape))


def all_batched(batched: Sequence[bool], args: Sequence[Any]) -> list[Any]:
    """`args` with the unbatched ones broadcast along the batch axis."""
    size = batch_size(batched, args)
    return [a if b else with_batch(a, size) for a, b in zip(args, batched, strict=True)]


def batch_shift_axis(name: str) -> Callable[..., Any]:
    """The batching rule of a one-operand op along `axis` (a sort, a scan): the batch axis
    leads, so the op runs once on the whole stack along axis + 1."""

    def rule(batched: Sequence[bool], x: Any, *, axis: int, **params: Any) -> Any:
        return bind(REGISTRY[name], x, axis=axis + 1, **params)

    return rule


def batch_stacked(name: str) -> Callable[..., Any]:
    """The batching rule of an op that maps over leading axes (elementwise ops, stacked
    linear algebra): unbatched operands are broadcast along the batch, and the op runs once
    on the whole stack, so an elementwise batch stays one fused loop."""

    def rule(batched: Sequence[bool], *args: Any, **params: Any) -> Any:
        return bind(REGISTRY[name], *all_batched(batched, args), **params)

    return rule
