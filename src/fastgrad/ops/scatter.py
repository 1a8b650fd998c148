"""Functional index updates: `x.at[idx].set(v)`, `.add`, `.multiply`, `.min`, `.max`, `.get`.

Each gives a new array, `x` with the indexed elements replaced by (or combined with) `v`,
as in JAX; traced arrays cannot be assigned to. `fnp.at(x)[idx].set(v)` is the same on any
array, plain NumPy ones included. Indices are those of `x[idx]` (basic,
slice and integer-array, see fastgrad.ops.indexing), in gather's `index` form; `v` is
broadcast to the indexed shape. `.add` is `x + scatter_add(v)`; the other updates are the
primitives below. Derivatives, in both `x` and `v`, at repeated indices and at ties:

- set: of several updates to one element, the one that lands (the last, as in NumPy) gets
  its gradient, the others none; an overwritten element of `x` gets none (as in JAX).
- add: every update gets its element's gradient; repeated indices accumulate.
- multiply: exact, repeated indices too (where JAX raises): an update's derivative is the
  product of `x` and the other updates to its element, built without division so that
  every order is exact where updates are 0 (the primitive segment_others, below).
- min/max: the element of `x` and the updates equal to the result share its gradient
  equally (as in JAX, and as max/min reductions do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import REGISTRY, Primitive, register
from fastgrad.core.primitive import at as point  # `at` is x.at below
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.ops.base import (
    astype,
    batch_size,
    broadcast_to,
    reshape,
    tangent_sum,
    with_batch,
)
from fastgrad.ops.elementwise import add, maximum, minimum, multiply, where
from fastgrad.ops.indexing import (
    batch_index,
    format_index,
    gather,
    gather_shape,
    getitem,
    index_spec,
    index_tuple,
    scatter_add,
)
from fastgrad.ops.shape import full_like, ones_like, transpose, zeros_like

__all__ = ["at"]  # and `x.at` on traced arrays, which fastgrad.ops installs

# ---------------------------------------------------------------- records


def _update_eval(x: Aval, v: Aval, *idx: Aval, index: Any) -> Aval:
    for a in idx:
        if a.dtype.kind not in "iu":
            raise IndexError(f"index arrays must be integers, got {a}")
    target = Aval(gather_shape(x.shape, index, [a.shape for a in idx]), x.dtype)
    if v.shape != target.shape or v.dtype != x.dtype:
        raise ValueError(f"index update: the values {v} do not match the indexed part {target}")
    return Aval(x.shape, x.dtype, x.weak)


def _update_impl(ufunc: Any) -> Callable[..., np.ndarray]:
    def impl(x: np.ndarray, v: np.ndarray, *idx: np.ndarray, index: Any) -> np.ndarray:
        out = np.array(x, copy=True)
        where_ = index_tuple(index, idx)
        if ufunc is None:
            out[where_] = v
        else:
            ufunc.at(out, where_, v)  # repeated indices combine
        return out

    return impl


def _none(idx: Sequence[Any]) -> tuple[None, ...]:
    return (None,) * len(idx)  # integer index arrays get no gradient


def _landed(v: Any, idx: Sequence[Any], x: Any, index: Any) -> Any:
    """Per update, whether it is the one that lands in its element (the others, repeats
    overwritten by a later update, do not): number the updates and scatter the numbers."""
    numbers = np.arange(aval_of(v).size).reshape(aval_of(v).shape)
    owner = scatter_set(full_like(x, -1, np.int64), numbers, idx, index)
    return gather(owner, idx, index) == numbers


def _set_vjp(g: Any, out: Any, x: Any, v: Any, *idx: Any, index: Any) -> tuple[Any, ...]:
    kept = scatter_set(g, zeros_like(v), idx, index)
    landed = where(_landed(v, idx, x, index), gather(g, idx, index), 0.0)
    return (kept, landed, *_none(idx))


def _set_jvp(t: Any, out: Any, x: Any, v: Any, *idx: Any, index: Any) -> Any:
    # set is linear in (x, v) together: its tangent is the same update of the tangents.
    tx = zeros_like(x) if t[0] is None else t[0]
    tv = zeros_like(v) if t[1] is None else t[1]
    return scatter_set(tx, tv, idx, index)


# ---------------------------------------------------------------- products of the others
# Per update, the product of the other updates to its element: without division, so that
# its derivatives are exact at every order where updates are 0. One primitive for a family
# closed under differentiation: `segment_others(seg, w, t1, ..., tm)` is, per entry k, the
# coefficient of e1 e2 ... em in the product over the other entries l of k's segment (equal
# `seg`) of (w_l + e1 t1_l + ... + em tm_l), where e_i e_i = 0 (m = 0: the plain product).
# It is linear in each t_i and its derivative in w is the family's next member; the
# cotangent g of a sum_k g_k Q(k) enters like a t (see _others_vjp).


def _others_eval(seg: Aval, w: Aval, *ts: Aval) -> Aval:
    if seg.dtype.kind not in "iu" or seg.ndim != 1:
        raise TypeError(f"segment_others: the segment ids must be 1-D integers, got {seg}")
    for t in (w, *ts):
        if t.shape != seg.shape or t.dtype != w.dtype or w.dtype.kind != "f":
            raise TypeError(f"segment_others: the factors must be floats of shape {seg.shape}")
    return Aval(w.shape, w.dtype)


def _times(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Products of truncated polynomials in e1..em (e_i e_i = 0): row S of (2**m, n) holds
    the coefficient of the monomial whose e's are the bits of S."""
    if len(a) == 1:
        return a * b
    out = np.zeros(np.broadcast_shapes(a.shape, b.shape), a.dtype)
    for whole in range(len(out)):
        part = whole
        while True:  # every part of `whole`, 0 included
            out[whole] += a[part] * b[whole ^ part]
            if part == 0:
                break
            part = (part - 1) & whole
    return out


def _before(c: np.ndarray, s: np.ndarray, longest: int) -> np.ndarray:
    """Per column k of `c`, grouped by the ids `s`, the product of the columns before it in
    its group (1 if none): a scan by doubling, ceil(log2(longest)) rounds of slices."""
    one = np.zeros((len(c), 1), c.dtype)
    one[0] = 1
    acc = np.concatenate([one, c[:, :-1]], axis=1)
    np.copyto(acc[:, 1:], one, where=s[1:] != s[:-1])
    d = 1
    while d < longest:
        # Entries d apart in one group: products of up to 2d entries now.
        np.copyto(acc[:, d:], _times(acc[:, :-d], acc[:, d:]), where=s[d:] == s[:-d])
        d *= 2
    return acc


def _others_impl(seg: np.ndarray, w: np.ndarray, *ts: np.ndarray) -> np.ndarray:
    n = w.size
    if n == 0:
        return w.copy()
    # Grouped by id: a 16-bit radix sort where the ids allow (13x faster than int64's).
    low, high = seg.min(), seg.max()
    key = (seg - low).astype(np.uint16) if high - low < 1 << 16 else seg
    order = np.argsort(key, kind="stable")
    s = key[order]  # only compared: the narrow ids compare faster
    # Rows by monomial: w (row 0), t1 the coefficient of e1 (row 1), t2 of e2 (row 2), ...
    c = np.zeros((1 << len(ts), n), w.dtype) if ts else np.empty((1, n), w.dtype)
    c[0] = w[order]
    for i, t in enumerate(ts):
        c[1 << i] = t[order]
    starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1], [True]]))
    longest = int(np.max(np.diff(starts)))
    out = np.empty_like(w)
    with np.errstate(all="ignore"):  # products across groups are computed and dropped
        before = _before(c, s, longest)
        after = _before(c[:, ::-1], s[::-1], longest)[:, ::-1]
        out[order] = _times(before, after)[-1]
    return out


def _others_vjp(g: Any, out: Any, seg: Any, w: Any, *ts: Any) -> tuple[Any, ...]:
    # g enters as the cotangent's own e: in w, the next member; in t_i, t_i replaced by g.
    g_ts = [segment_others(seg, w, *ts[:i], g, *ts[i + 1 :]) for i in range(len(ts))]
    return (None, segment_others(seg, w, *ts, g), *g_ts)


def _others_jvp(t: Any, out: Any, seg: Any, w: Any, *ts: Any) -> Any:
    terms = [lambda tw: segment_others(seg, w, *ts, tw)]
    terms += [lambda ti, i=i: segment_others(seg, w, *ts[:i], ti, *ts[i + 1 :])
              for i in range(len(ts))]  # fmt: skip
    return tangent_sum(t[1:], *terms)


def _others_batch(batched: Sequence[bool], seg: Any, *factors: Any) -> Any:
    # The batch's entries become segments of their own: ids seg * size + b.
    size = batch_size(batched, (seg, *factors))
    inputs = (seg, *factors)
    arrays = [a if b else with_batch(a, size) for b, a in zip(batched, inputs, strict=True)]
    n = aval_of(arrays[0]).shape[1]
    ids = arrays[0] * size + np.arange(size).reshape(size, 1)
    flat = [reshape(a, (size * n,)) for a in (ids, *arrays[1:])]
    return reshape(segment_others(*flat), (size, n))


def segment_others(seg: Any, w: Any, *ts: Any) -> Any:
    """Per entry of the 1-D `w`, the product of the other entries with the same `seg` id
    (with tangents `ts`: see the banner above)."""
    return bind(REGISTRY["segment_others"], seg, w, *ts)


register(
    Primitive(
        "segment_others", _others_eval, _others_impl, _others_vjp, _others_jvp,
        _others_batch, kind="other",
        # Zeros (one and two in a segment), a segment of one, of three, unsorted ids; a
        # tangent; nothing at all.
        special_points=(
            point(np.array([2, 0, 2, 1, 0, 2]), np.array([1.5, 0.0, -2.0, 3.0, 0.0, 0.5])),
            point(np.array([0, 1, 0]), np.array([0.0, 2.0, -0.5])),
            point(np.array([1, 0, 1, 1]), np.array([2.0, -1.0, 0.5, 3.0]),
                  np.array([0.5, 1.0, -1.5, 2.0])),
            point(np.zeros(0, np.int64), np.zeros(0)),
        ),
    )
)  # fmt: skip


def _others(v: Any, idx: Sequence[Any], x: Any, index: Any) -> Any:
    """Per update, the product of the other updates to its element (segment_others)."""
    shape, n = aval_of(v).shape, aval_of(v).size
    elements = np.arange(aval_of(x).size).reshape(aval_of(x).shape)
    seg = reshape(gather(elements, idx, index), (n,))
    return reshape(segment_others(seg, reshape(v, (n,))), shape)


def _multiply_vjp(g: Any, out: Any, x: Any, v: Any, *idx: Any, index: Any) -> tuple[Any, ...]:
    factor = scatter_multiply(ones_like(x), v, idx, index)
    g_v = gather(g * x, idx, index) * _others(v, idx, x, index)
    return (g * factor, g_v, *_none(idx))


def _multiply_jvp(t: Any, out: Any, x: Any, v: Any, *idx: Any, index: Any) -> Any:
    return tangent_sum(
        t[:2],
        lambda tx: scatter_multiply(tx, v, idx, index),
        lambda tv: x * scatter_add(tv * _others(v, idx, x, index), idx, x.shape, index),
    )


def _ties(out: Any, x: Any, v: Any, idx: Sequence[Any], index: Any) -> tuple[Any, Any, Any]:
    """Where x and where each update equal the result (as 0/1 floats), and per element how
    many of them do: a min or max shares its gradient among those."""
    at_x = astype(x == out, x.dtype)
    at_v = astype(v == gather(out, idx, index), x.dtype)
    return at_x, at_v, at_x + scatter_add(at_v, idx, x.shape, index)


def _extremum_vjp(g: Any, out: Any, x: Any, v: Any, *idx: Any, index: Any) -> tuple[Any, ...]:
    at_x, at_v, count = _ties(out, x, v, idx, index)
    share = g / count
    return (share * at_x, gather(share, idx, index) * at_v, *_none(idx))


def _extremum_jvp(t: Any, out: Any, x: Any, v: Any, *idx: Any, index: Any) -> Any:
    at_x, at_v, count = _ties(out, x, v, idx, index)
    total = tangent_sum(
        t[:2],
        lambda tx: tx * at_x,
        lambda tv: scatter_add(tv * at_v, idx, x.shape, index),
    )
    return total / count


def _update_batch(name: str) -> Callable[..., Any]:
    # The result has x's shape, so x gets the batch axis; the updates are put in the
    # order of the batched gather's output (see indexing.batch_index).
    def rule(batched: Sequence[bool], x: Any, v: Any, *idx: Any, index: Any) -> Any:
        size = batch_size(batched, (x, v, *idx))
        x = x if batched[0] else with_batch(x, size)
        v = v if batched[1] else with_batch(v, size)
        x_ndim = aval_of(x).ndim - 1
        arrays, index2, perm = batch_index(True, idx, batched[2:], index, size, x_ndim)
        v = transpose(v, [int(a) for a in np.argsort(perm)])
        return bind(REGISTRY[name], x, v, *arrays, index=index2)

    return rule


def _format(method: str) -> Callable[[list[str], dict[str, Any]], str]:
    def fmt(args: list[str], params: dict[str, Any]) -> str:
        return f"{args[0]}.at[{format_index(args, params['index'], 2)}].{method}({args[1]})"

    return fmt


# Special points: repeated indices (element (0, 1) updated twice), zeros for multiply
# (one and two at an element, and in x), ties of x and updates for min and max, infinite
# and nan entries, no updates at all.
_X = np.array([[1.5, -2.0, 0.5], [3.0, 0.0, -1.0]])
_I, _J, _BOTH = np.array([0, 1, 0]), np.array([1, 2, 1]), (("array", 0), ("array", 1))
_ROWS = (("array", 0), ("slice", 0, 3, 1))
_COMMON = (
    point(_X, np.array([2.5, -0.5, 4.0]), _I, _J, index=_BOTH),
    point(_X, np.array([[0.5, 2.0, -1.5]]), np.array([1]), index=_ROWS),
    point(_X, np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), index=_BOTH),
)
_SPECIAL_POINTS = {
    "scatter": _COMMON
    + (point(np.array([[np.nan, np.inf, 1.0], [2.0, 3.0, 4.0]]), np.array([5.0, 6.0, 7.0]),
          np.array([0, 0, 0]), np.array([0, 1, 0]), index=_BOTH),),
    # One zero among the updates to an element, then two (x is 0 at (1, 1) in both).
    "scatter_multiply": _COMMON
    + (
        point(_X, np.array([0.0, -0.5, 3.0]), _I, _J, index=_BOTH),
        point(_X, np.array([0.0, 2.0, 0.0, 1.5]), np.array([0, 1, 0, 0]),
              np.array([1, 1, 1, 1]), index=_BOTH),
    ),
    **{
        name: _COMMON
        + (
            point(_X, np.array([-2.0, 5.0, -2.0]), _I, _J, index=_BOTH,
               convention="max-min-reduction-ties"),
            point(_X, np.array([np.inf, -np.inf, 1.0]), np.array([0, 0, 1]), np.array([0, 1, 1]),
               index=_BOTH),
        )
        for name in ("scatter_min", "scatter_max")
    },
}  # fmt: skip

for _name, _method, _ufunc, _vjp, _jvp in (
    ("scatter", "set", None, _set_vjp, _set_jvp),
    ("scatter_multiply", "multiply", np.multiply, _multiply_vjp, _multiply_jvp),
    ("scatter_min", "min", np.minimum, _extremum_vjp, _extremum_jvp),
    ("scatter_max", "max", np.maximum, _extremum_vjp, _extremum_jvp),
):
    register(
        Primitive(
            _name,
            _update_eval,
            _update_impl(_ufunc),
            _vjp,
            _jvp,
            _update_batch(_name),
            kind="other",
            format=_format(_method),
            special_points=_SPECIAL_POINTS.get(_name, ()),
        )
    )


# ---------------------------------------------------------------- functions


def scatter_set(x: Any, v: Any, idx: Sequence[Any], index: Any) -> Any:
    """`x` with `v` written at the indexed elements (`index` in gather's form)."""
    return bind(REGISTRY["scatter"], x, v, *idx, index=tuple(index))


def scatter_multiply(x: Any, v: Any, idx: Sequence[Any], index: Any) -> Any:
    """`x` with the indexed elements multiplied by `v` (repeats multiply in turn)."""
    return bind(REGISTRY["scatter_multiply"], x, v, *idx, index=tuple(index))


_PRIMITIVES = {
    "set": "scatter",
    "multiply": "scatter_multiply",
    "min": "scatter_min",
    "max": "scatter_max",
}


def update(x: Any, index: Any, method: str, values: Any) -> Any:
    """`x.at[index].<method>(values)` for method set, add, multiply, min or max.

    >>> update(np.zeros(4), np.array([0, 2, 2]), "add", 1.0)
    array([1., 0., 2., 0.])
    >>> update(np.arange(6.0).reshape(2, 3), (slice(None), 1), "set", -1.0)
    array([[ 0., -1.,  2.],
           [ 3., -1.,  5.]])
    """
    aval = aval_of(x)
    what = f"x.at[...].{method}"
    mask = index[0] if isinstance(index, tuple) and len(index) == 1 else index
    if isinstance(mask, Tracer) and mask.dtype == np.bool_:
        return _masked_update(x, mask, method, values, what)
    spec, arrays = index_spec(aval.shape, index, what)
    shape = gather_shape(aval.shape, spec, [aval_of(a).shape for a in arrays])
    v = _values(values, aval.dtype, shape, what, "the indexed part of x")
    if method == "add":
        return add(x, scatter_add(v, arrays, aval.shape, spec))
    return bind(REGISTRY[_PRIMITIVES[method]], x, v, *arrays, index=spec)


def _values(values: Any, dtype: np.dtype, shape: tuple[int, ...], what: str, into: str) -> Any:
    v = astype(values, dtype)
    try:
        return broadcast_to(v, shape)
    except ValueError:
        raise ValueError(
            f"{what}: values of shape {aval_of(values).shape} cannot be broadcast to {into}, "
            f"of shape {shape}"
        ) from None


def _masked_update(x: Any, mask: Tracer, method: str, values: Any, what: str) -> Any:
    """x.at[mask] with a traced boolean mask: which elements it picks is known only when the
    code runs, so the update is elementwise, `where(mask, new, x)`, with `values`
    broadcast to x's shape (a scalar, typically)."""
    shape = aval_of(x).shape
    if mask.shape != shape:
        raise IndexError(
            f"{what}: a traced boolean mask must have the shape of x, {shape}, got "
            f"{mask.shape}; or pass the mask as a static (concrete) value"
        )
    v = _values(
        values,
        aval_of(x).dtype,
        shape,
        what,
        "x (with a traced mask, how many elements it picks is known only at run time)",
    )
    combine = {"set": lambda: v, "add": lambda: add(x, v), "multiply": lambda: multiply(x, v)}
    combine |= {"min": lambda: minimum(x, v), "max": lambda: maximum(x, v)}
    return where(mask, combine[method](), x)


class IndexedUpdate:
    """`x.at[index]`: call `.set(v)`, `.add(v)`, `.multiply(v)`, `.min(v)`, `.max(v)` or
    `.get()` on it."""

    __slots__ = ("x", "index")

    def __init__(self, x: Any, index: Any):
        self.x = x
        self.index = index

    def get(self) -> Any:
        """`x[index]`."""
        return getitem(self.x, self.index)

    def set(self, values: Any) -> Any:
        """A copy of `x` with `values` at `index`."""
        return update(self.x, self.index, "set", values)

    def add(self, values: Any) -> Any:
        """A copy of `x` with `values` added at `index` (repeated indices accumulate)."""
        return update(self.x, self.index, "add", values)

    def multiply(self, values: Any) -> Any:
        """A copy of `x` with the elements at `index` multiplied by `values`."""
        return update(self.x, self.index, "multiply", values)

    def min(self, values: Any) -> Any:
        """A copy of `x` with the elements at `index` lowered to `values` where larger."""
        return update(self.x, self.index, "min", values)

    def max(self, values: Any) -> Any:
        """A copy of `x` with the elements at `index` raised to `values` where smaller."""
        return update(self.x, self.index, "max", values)


class IndexUpdates:
    """`x.at`, JAX's functional index updates: `x.at[idx].set(v)` and friends.

    >>> import fastgrad as fg
    >>> f = fg.jit(lambda x, v: x.at[1:, 0].add(v))
    >>> f(np.zeros((3, 2)), np.array([1.0, 2.0]))
    array([[0., 0.],
           [1., 0.],
           [2., 0.]])
    """

    __slots__ = ("x",)

    def __init__(self, x: Any):
        self.x = x

    def __getitem__(self, index: Any) -> IndexedUpdate:
        return IndexedUpdate(self.x, index)


def at(x: Any) -> IndexUpdates:
    """`x.at` for any array, plain NumPy ones too: `fnp.at(x)[idx].set(v)` is a copy of `x`
    with `v` at `idx` (also `.add`, `.multiply`, `.min`, `.max`, `.get`), as `x.at[idx]` is
    on a traced array.

    >>> at(np.zeros(3))[np.array([0, 0, 2])].add(1.0)
    array([2., 0., 1.])
    """
    return IndexUpdates(x)
