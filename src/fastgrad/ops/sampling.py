"""Random numbers from explicit keys (fastgrad.random): the counter-based primitives and the
key functions and distributions built on them.

A key is a uint32 array of shape (2,). Element i of a sample is Threefry-2x32 of the key and
the counter (stream, i) (fastgrad.ops.threefry), so a fused loop computes it in place, with
no array of random bits in memory, and every path gives the same bits. The primitives are
"positional": their value depends on the element's flat index, so fusion places them only
where the loop runs over exactly their shape (compiler.fusion).
"""

from __future__ import annotations

import math
import operator
import string
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import REGISTRY, Primitive, register
from fastgrad.core.tracing import Tracer, aval_of, bind, current_trace, static_error
from fastgrad.ops import threefry
from fastgrad.ops.base import (
    astype,
    batch_size,
    broadcast_to,
    lift,
    reshape,
    shape_tuple,
    with_batch,
)
from fastgrad.ops.elementwise import floor, less, maximum, minimum, where
from fastgrad.ops.shape import slice_array

__all__: list[str] = []  # fastgrad.random lists the public names

# Counter streams (the counter's first word), so that split and fold_in never give the
# blocks a sample of the same key uses.
SPLIT_STREAM = 2
FOLD_STREAM = 3
_MAX_ELEMENTS = 2**32  # the counter's second word is the element index

# ---------------------------------------------------------------- records


def check_key(key: Aval, what: str = "key") -> None:
    if key.shape != (2,) or key.dtype != np.uint32:
        raise TypeError(
            f"{what} must be a uint32 array of shape (2,), made by fg.random.key(seed), "
            f"split or fold_in; got {key.dtype.name}{list(key.shape)}"
        )


def _sample_eval(key: Aval, *rest: Aval, shape: tuple[int, ...], dtype: np.dtype, **_: Any) -> Aval:
    check_key(key)
    if math.prod(shape) > _MAX_ELEMENTS:
        raise ValueError(f"a sample has at most 2^32 elements per key; shape {shape} has more")
    return Aval(shape, dtype)


def _format(args: list[str], params: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={v.name if isinstance(v, np.dtype) else v}" for k, v in params.items())
    return f"{args[0]}, {shown}" if len(args) == 1 else f"{', '.join(args)}, {shown}"


def _batch_by_key(name: str) -> Any:
    """The batching rule of a sampler (vmap over keys, or over its other operands): one
    node of its keyed twin, whose loop runs over the whole batch."""

    def rule(batched: Any, key: Any, *operands: Any, **params: Any) -> Any:
        size = batch_size(batched, (key, *operands))
        keys = key if batched[0] else with_batch(key, size)
        full = (size, *params["shape"])
        rest = []
        for x, b in zip(operands, batched[1:], strict=True):
            if not b:  # a scalar stays one; an elementwise operand is the same per example
                rest.append(x if aval_of(x).shape == () else with_batch(x, size))
            elif aval_of(x).shape == (size,):  # a scalar per example
                rest.append(_per_example(x, full))
            else:
                rest.append(x)
        return keyed_sample(REGISTRY[f"{name}_keys"], keys, rest, **params)

    return rule


def keyed_sample(twin: Primitive, keys: Any, operands: list[Any], **params: Any) -> Any:
    """A sample per key of `keys` (B, 2) in one node: element (b, j) is element j of the
    sampler on key b. The loop reads each element's key words and the offset b * size of
    its example from operands broadcast over the batch (small loops before the sampling
    loop write them: fusion reads a sampler's operands from outside its loop).
    `operands` are scalars or have the output's shape (B, *shape)."""
    size, shape = aval_of(keys).shape[0], params["shape"]
    full = (size, *shape)
    words = [_per_example(reshape(slice_array(keys, ((0, size, 1), (w, w + 1, 1))), (size,)), full)
             for w in (0, 1)]  # fmt: skip
    offset = np.arange(size, dtype=np.uint64) * np.uint64(math.prod(shape))
    offset = _per_example(lift(offset) if current_trace() is not None else offset, full)
    return bind(twin, keys, *operands, *words, offset, **params)


def _per_example(x: Any, full: tuple[int, ...]) -> Any:
    """A value per example, (B,), at every element of its example: (B, *shape) = full."""
    return broadcast_to(reshape(x, (full[0],) + (1,) * (len(full) - 1)), full)


class _Kept(dict[str, str]):
    """Format fields: the given ones replaced, any other kept as a field."""

    def __missing__(self, name: str) -> str:
        return f"{{{name}}}"


def _example(x: np.ndarray, b: int, scalar: bool) -> np.ndarray:
    """Example b's operand: a scalar operand is the same at every element of its example."""
    if np.ndim(x) == 0:
        return x
    return x[b].reshape(-1)[0] if scalar else x[b]


def _keyed_twin(base: Primitive) -> Primitive:
    """`base` (a sampler of one key) over a batch of keys: inputs keys (B, 2), base's
    operands batched (or scalars), the key's two words and the example's offset per
    element; output (B, *shape)."""
    assert base.loop is not None
    fields = [f for _, f, _, _ in string.Formatter().parse(base.loop) if f]
    n = max((int(f) for f in fields if f.isdigit()), default=0)  # base's operands after the key
    scalar = base.extra["scalar_operands"] or (False,) * n
    kept = _Kept(K0=f"np.uint64({{{n + 1}}})", K1=f"np.uint64({{{n + 2}}})")
    kept["I"] = f"({{I}} - {{{n + 3}}})"
    loop = string.Formatter().vformat(base.loop, [f"{{{j}}}" for j in range(n + 1)], kept)

    def unbatched(x: Aval) -> Aval:
        return x if x.shape == () else Aval(x.shape[1:], x.dtype, x.weak)

    def abstract_eval(keys: Aval, *rest: Aval, **params: Any) -> Aval:
        if len(keys.shape) != 2 or keys.shape[1:] != (2,) or keys.dtype != np.uint32:
            raise TypeError(f"keys must be a uint32 array of shape (B, 2), got {keys}")
        one = base.abstract_eval(Aval((2,), keys.dtype), *map(unbatched, rest[:n]), **params)
        return Aval((keys.shape[0], *one.shape), one.dtype)

    def impl(keys: np.ndarray, *rest: np.ndarray, **params: Any) -> np.ndarray:
        examples = [
            base.impl(
                k, *(_example(x, b, s) for x, s in zip(rest[:n], scalar, strict=True)), **params
            )
            for b, k in enumerate(keys)
        ]
        return np.stack(examples).reshape(len(keys), *params["shape"])

    def vjp(g: Any, out: Any, keys: Any, *rest: Any, **params: Any) -> Any:
        assert base.vjp is not None
        return (*base.vjp(g, out, keys, *rest[:n], **params), None, None, None)

    def jvp(tangents: Any, out: Any, keys: Any, *rest: Any, **params: Any) -> Any:
        assert base.jvp is not None
        return base.jvp(tangents[: n + 1], out, keys, *rest[:n], **params)

    def batch(batched: Any, keys: Any, *rest: Any, **params: Any) -> Any:
        # vmap of vmap: the two batch axes become one.
        outer = batch_size(batched, (keys, *rest))
        keys = keys if batched[0] else with_batch(keys, outer)
        inner = aval_of(keys).shape[1]
        flat = reshape(keys, (outer * inner, 2))
        ops = [x if aval_of(x).shape == () else
               reshape(x if b else with_batch(x, outer), (outer * inner, *params["shape"]))
               for x, b in zip(rest[:n], batched[1 : n + 1], strict=True)]  # fmt: skip
        out = keyed_sample(twin, flat, ops, **params)
        return reshape(out, (outer, inner, *params["shape"]))

    name = f"{base.name}_keys"
    twin = register(
        Primitive(
            name,
            impl=impl,
            abstract_eval=abstract_eval,
            vjp=vjp if base.vjp is not None else None,
            jvp=jvp if base.jvp is not None else None,
            batch=batch,
            kind="elementwise",
            domain=(*base.domain, "key", "key", "key"),
            format=lambda args, params: f"{name}({_format(args, params)})",
            loop=loop,
            extra={**base.extra, "pairs": None},  # an example's pairs need not align
        )
    )
    return twin


def positional(
    name: str,
    impl: Any,
    loop: str,
    names: tuple[str, ...],
    scalar_operands: tuple[bool, ...] = (),
    pairs: dict[str, tuple[str, str]] | None = None,
    **fields: Any,
) -> Primitive:
    """A sampler's record. `loop` is formatted with K0, K1 (the key's words as uint64), I
    (the element's flat index as uint64), T (the output's scalar type), {1}, {2}, ... (the
    operands after the key, read at the element) and the node's params; codegen imports
    `names` from fastgrad.ops.threefry. `scalar_operands` flags the operands that are one
    scalar per sample (the rest have the sample's shape). `fields` override the record's
    defaults. `pairs` maps a dtype to a function of (K0, K1, j) giving elements 2j and 2j + 1
    at once and the element function it replaces (loops over consecutive elements call it
    once per two: codegen.pairs; `names` + "_call" must hold that element function). Registers
    the record's keyed twin too (`name` + "_keys": vmap over keys)."""
    record: dict[str, Any] = {
        "abstract_eval": _sample_eval,
        "vjp": None,  # integers, or floats that depend on the key alone: no gradient
        "batch": _batch_by_key(name),
        "kind": "elementwise",
        "domain": ("key",),
        "format": lambda args, params: f"{name}({_format(args, params)})",
        "loop": loop,
        "extra": {
            "positional": True,
            "imports": ("fastgrad.ops.threefry", names),
            "scalar_operands": scalar_operands,
            "pairs": pairs,
        },
    }
    base = register(Primitive(name, impl=impl, **(record | fields)))
    _keyed_twin(base)
    return base


RANDOM_BITS = positional(
    "random_bits",
    lambda key, base, *, shape, dtype, stream: threefry.bits_array(key, base, shape, stream),
    "bits32({K0}, {K1}, np.uint64({stream}), np.uint64({1}), {I})",
    ("bits32",),
    scalar_operands=(True,),  # the counter's base: one per sample
)


def _sampler(name: str, pairs: dict[str, tuple[str, str]] | None = None) -> Primitive:
    def impl(key: np.ndarray, *, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        suffix = "f64" if dtype == np.float64 else "f32"
        return threefry.sample_array(f"{name}_{suffix}", key, shape, dtype)

    return positional(
        f"random_{name}",
        impl,
        f"{name}_{{T}}({{K0}}, {{K1}}, {{I}})",
        (f"{name}_f64", f"{name}_f32"),
        pairs=pairs,
    )


RANDOM_UNIFORM = _sampler("uniform")
# float64: the cos and sin of one Box-Muller pair
RANDOM_NORMAL = _sampler("normal", {"float64": ("normal_pair_f64", "normal_f64")})
RANDOM_EXPONENTIAL = _sampler("exponential")

# ---------------------------------------------------------------- argument checks


def key_arg(key: Any) -> Any:
    """`key` checked; inside a trace a concrete key becomes a graph constant, so samples are
    computed by the compiled function (fused) rather than frozen in at trace time."""
    if not isinstance(key, Tracer):
        key = np.asarray(key)
        if key.dtype.kind in "iu" and key.shape == (2,) and key.dtype != np.uint32:
            raise TypeError(f"key must have dtype uint32, got {key.dtype.name}")
    check_key(aval_of(key))
    return lift(key) if current_trace() is not None else key


def float_dtype(dtype: Any, what: str = "dtype") -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"{what} must be float32 or float64, got {dtype.name}")
    return dtype


def sample_shape(shape: Any) -> tuple[int, ...]:
    shape = shape_tuple(shape, "shape")
    if any(d < 0 for d in shape):
        raise ValueError(f"shape must not have negative dimensions, got {shape}")
    return shape


# ---------------------------------------------------------------- keys


def key(seed: Any) -> np.ndarray:
    """A key from an integer seed: a uint32 array of shape (2,) (the seed's two 32-bit halves).

    >>> key(42)
    array([ 0, 42], dtype=uint32)
    """
    if isinstance(seed, Tracer):
        raise static_error("seed", seed, "a Python int (make a key outside the traced function)")
    seed = operator.index(seed) % 2**64  # a negative seed as its two's complement
    return np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32)


def random_bits(key: Any, shape: Any, stream: int = 0, base: Any = 0) -> Any:
    """uint32 words: element i is word i % 2 of Threefry(key, (stream, base + i // 2))."""
    key = key_arg(key)
    if not isinstance(base, Tracer):
        base = np.uint32(operator.index(base) % 2**32)
        base = lift(np.asarray(base)) if isinstance(key, Tracer) else np.asarray(base)
    elif aval_of(base).shape != () or aval_of(base).dtype.kind not in "iu":
        raise TypeError(f"data must be an integer scalar, got {aval_of(base)}")
    else:
        base = astype(base, np.uint32)
    return bind(
        RANDOM_BITS, key, base, shape=sample_shape(shape), dtype=np.dtype(np.uint32), stream=stream
    )


def split(key: Any, num: int = 2) -> Any:
    """`num` new keys (an array of shape (num, 2)) that are independent of `key` and of each
    other; use each for one purpose and `key` no more.

    >>> k1, k2 = split(key(0))
    >>> bool((k1 != k2).any())
    True
    """
    num = operator.index(num)
    if num < 0:
        raise ValueError(f"split: num must be >= 0, got {num}")
    return random_bits(key, (num, 2), stream=SPLIT_STREAM)


def fold_in(key: Any, data: Any) -> Any:
    """A new key from `key` and an integer `data` (a step number, a worker's index; it may
    be traced): different data give independent keys.

    >>> bool((fold_in(key(0), 1) != fold_in(key(0), 2)).any())
    True
    """
    return random_bits(key, (2,), stream=FOLD_STREAM, base=data)


def bits(key: Any, shape: Any = ()) -> Any:
    """Uniformly random uint32 words of `shape`.

    >>> bits(key(0), (2,)).dtype
    dtype('uint32')
    """
    return random_bits(key, shape)


# ---------------------------------------------------------------- distributions


def uniform(
    key: Any, shape: Any = (), dtype: Any = np.float64, minval: Any = 0.0, maxval: Any = 1.0
) -> Any:
    """Uniform floats in [minval, maxval) of `shape` (maxval itself only by rounding),
    differentiable in minval and maxval.

    >>> x = uniform(key(0), (1000,))
    >>> bool((0 <= x).all() and (x < 1).all())
    True
    """
    dtype = float_dtype(dtype)
    u = bind(RANDOM_UNIFORM, key_arg(key), shape=sample_shape(shape), dtype=dtype)
    if _is_default(minval, 0.0) and _is_default(maxval, 1.0):
        return u
    minval, maxval = astype(minval, dtype), astype(maxval, dtype)
    # As JAX: rounding may not take a value below minval (it may reach maxval).
    return maximum(minval, minval + u * (maxval - minval))


def _is_default(value: Any, default: float) -> bool:
    return not isinstance(value, Tracer) and np.ndim(value) == 0 and float(value) == default


def normal(key: Any, shape: Any = (), dtype: Any = np.float64) -> Any:
    """Standard normal floats of `shape` (scale and shift them for other means and
    variances: gradients flow through that reparameterization).

    >>> normal(key(0), (2, 3)).shape
    (2, 3)
    """
    return bind(RANDOM_NORMAL, key_arg(key), shape=sample_shape(shape), dtype=float_dtype(dtype))


def exponential(key: Any, shape: Any = (), dtype: Any = np.float64) -> Any:
    """Standard exponential floats of `shape`, -ln(u) for uniform u in (0, 1] (divide by a
    rate for other rates).

    >>> x = exponential(key(0), (1000,))
    >>> bool((x >= 0).all())
    True
    """
    return bind(
        RANDOM_EXPONENTIAL, key_arg(key), shape=sample_shape(shape), dtype=float_dtype(dtype)
    )


def bernoulli(key: Any, p: Any = 0.5, shape: Any = None) -> Any:
    """Booleans that are True with probability `p` (broadcast to `shape`, by default p's).

    >>> bernoulli(key(0), 0.5, (3,)).dtype
    dtype('bool')
    """
    p_aval = aval_of(p)
    shape = p_aval.shape if shape is None else sample_shape(shape)
    dtype = p_aval.dtype if p_aval.dtype.kind == "f" and not p_aval.weak else np.dtype(np.float64)
    return less(uniform(key, shape, dtype), astype(p, dtype))


def randint(key: Any, shape: Any, minval: Any, maxval: Any, dtype: Any = np.int64) -> Any:
    """Integers in [minval, maxval) of `shape`, uniformly (minval where maxval <= minval).

    Built on one float64 uniform per element: the bias is below (maxval - minval) / 2^53.

    >>> x = randint(key(0), (100,), 3, 7)
    >>> sorted(set(x.tolist()))
    [3, 4, 5, 6]
    """
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu":
        raise TypeError(f"randint: dtype must be an integer dtype, got {dtype.name}")
    lo, hi = astype(minval, np.float64), astype(maxval, np.float64)
    span = maximum(hi - lo, 0.0)
    u = uniform(key, shape, np.float64)
    offset = minimum(floor(u * span), maximum(span - 1.0, 0.0))
    return astype(where(span > 0, lo + offset, lo), dtype)
