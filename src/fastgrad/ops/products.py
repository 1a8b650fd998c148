"""Products: matmul (BLAS) and the contractions built on it: dot, tensordot, vdot, inner,
outer; and kron and cross, built from broadcast multiplies.

The `matmul` primitive takes operands of equal rank >= 2 with equal batch axes; the
`matmul` function promotes 1-D operands and broadcasts batch axes first, as NumPy does.
"""

from __future__ import annotations

import builtins
import math
import warnings
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import REGISTRY, Primitive, at, register
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.ops.base import (
    all_batched,
    broadcast_shapes,
    broadcast_to,
    coerce,
    normalize_axis,
    promote,
    reshape,
    sum,
    tangent_sum,
)
from fastgrad.ops.elementwise import multiply, subtract
from fastgrad.ops.indexing import getitem
from fastgrad.ops.manipulation import moveaxis
from fastgrad.ops.shape import ravel, stack, transpose
from fastgrad.ops.ufunc_records import format_infix

__all__ = ["cross", "dot", "inner", "kron", "matmul", "outer", "tensordot", "vdot"]

# ---------------------------------------------------------------- records

_A = np.array([[1.5, -2.0, 0.5], [3.0, 0.0, -1.0]])


def _matmul_eval(a: Aval, b: Aval) -> Aval:
    if a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul needs equal dtypes, got {a.dtype} and {b.dtype}")
    return Aval(a.shape[:-1] + b.shape[-1:], a.dtype, a.weak and b.weak)


def _swap_last(x: Any) -> Any:
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return transpose(x, axes)


def _matmul_batch(batched: tuple[bool, bool], a: Any, b: Any) -> Any:
    """A batch of matrix products as one BLAS call where one operand is shared: the
    batch joins the rows of `a`, or the columns of `b`; else a stacked matmul."""
    op = REGISTRY["matmul"]
    sa, sb = aval_of(a).shape, aval_of(b).shape
    if sb[-2] == 1:  # outer products (a per-example weight gradient): one fused loop
        return multiply(*all_batched(batched, (a, b)))
    if batched == (True, False) and len(sb) == 2:  # (B, n, k) @ (k, m)
        size, n, k = sa
        return reshape(bind(op, reshape(a, (size * n, k)), b), (size, n, sb[1]))
    if batched == (False, True) and len(sa) == 2:  # (n, k) @ (B, k, m)
        size, k, m = sb
        out = bind(op, a, reshape(transpose(b, (1, 0, 2)), (k, size * m)))
        return transpose(reshape(out, (sa[0], size, m)), (1, 0, 2))
    return bind(op, *all_batched(batched, (a, b)))


register(
    Primitive(
        "matmul",
        _matmul_eval,
        np.matmul,
        lambda g, out, a, b: (matmul(g, _swap_last(b)), matmul(_swap_last(a), g)),
        lambda t, out, a, b: tangent_sum(t, lambda ta: matmul(ta, b), lambda tb: matmul(a, tb)),
        _matmul_batch,
        kind="other",
        format=format_infix("@"),
        # Size-0 and size-1 contractions, zeros, infinities and nan.
        special_points=(
            at(_A, _A.T),
            at(_A[:, :1], _A[:1]),
            at(np.zeros((2, 0)), np.zeros((0, 3))),
            at(np.zeros((0, 2)), _A[:, :1] * 0.0),
            at(_A.reshape(2, 1, 3), _A.reshape(2, 3, 1)),
            at(np.array([[0.0, np.inf]]), np.array([[1.0], [2.0]])),
            at(np.array([[np.nan, 1.0]]), np.array([[0.0], [2.0]])),
        ),
    )
)


# ---------------------------------------------------------------- functions


def matmul(a: Any, b: Any) -> Any:
    """NumPy's matmul: 1-D operands are promoted to matrices, batch axes broadcast.

    >>> matmul(np.ones((2, 3)), np.ones(3))
    array([3., 3.])
    >>> fg.grad(lambda a: fnp.sum(matmul(a, np.array([1.0, 2.0]))))(np.ones((1, 2)))
    array([[1., 2.]])
    """
    if _matrices(a, b):  # most products: nothing to promote, reshape nor broadcast
        return bind(REGISTRY["matmul"], a, b)
    av, bv = aval_of(a), aval_of(b)
    if av.ndim == 0 or bv.ndim == 0:
        raise ValueError("matmul: operands must be at least 1-D (use multiply for scalars)")
    dtype, _ = promote([av, bv])
    tracing = isinstance(a, Tracer) or isinstance(b, Tracer)
    a = coerce(a, av, dtype, av.shape, tracing)
    b = coerce(b, bv, dtype, bv.shape, tracing)
    a2 = reshape(a, (1,) + av.shape) if av.ndim == 1 else a
    b2 = reshape(b, bv.shape + (1,)) if bv.ndim == 1 else b
    sa, sb = aval_of(a2).shape, aval_of(b2).shape
    if sa[-1] != sb[-2]:
        raise ValueError(
            f"matmul: shapes {av.shape} and {bv.shape} do not align: the last axis of the "
            f"first ({sa[-1]}) must equal the {'only' if bv.ndim == 1 else 'second-to-last'} "
            f"axis of the second ({sb[-2]})"
        )
    batch = broadcast_shapes(sa[:-2], sb[:-2], what="matmul batch axes")
    if len(sb) == 2 and len(sa) > 2:
        # A stack of rows times one matrix (`x @ w` in a layer): one gemm over all the
        # rows, not w broadcast to a stack and multiplied per matrix. Its VJP is a gemm
        # too: w's gradient comes summed over the rows (no stack of products, no sum of
        # them). The transformer block (bench M2) ran 1.4x faster on one thread.
        rows = bind(REGISTRY["matmul"], reshape(a2, (math.prod(sa[:-1]), sa[-1])), b2)
        a2 = reshape(rows, sa[:-1] + sb[-1:])
        return reshape(a2, aval_of(a2).shape[:-1]) if bv.ndim == 1 else a2
    a2 = broadcast_to(a2, batch + sa[-2:])
    b2 = broadcast_to(b2, batch + sb[-2:])
    out = bind(REGISTRY["matmul"], a2, b2)
    shape = aval_of(out).shape
    if av.ndim == 1:
        shape = shape[:-2] + shape[-1:]
    if bv.ndim == 1:
        shape = shape[:-1]
    return reshape(out, shape)


def _matrices(a: Any, b: Any) -> bool:
    """Whether `a @ b` is of two traced matrices that align, of one dtype, neither weak."""
    if type(a) is not Tracer or type(b) is not Tracer:
        return False
    av, bv = a._var.aval, b._var.aval
    return (
        len(av.shape) == len(bv.shape) == 2
        and av.shape[1] == bv.shape[0]
        and av.dtype == bv.dtype
        and not (av.weak or bv.weak)
    )


def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    """Sum products over the given axes of `a` and `b` (NumPy's tensordot): `axes` is a
    number n (the last n of `a` with the first n of `b`) or a pair of axis lists.

    >>> tensordot(np.ones((2, 3)), np.ones((3, 4)), 1).shape
    (2, 4)
    """
    av, bv = aval_of(a), aval_of(b)
    if isinstance(axes, int | np.integer):
        if axes < 0:
            raise ValueError(f"tensordot: axes must be non-negative, got {axes}")
        if axes > builtins.min(av.ndim, bv.ndim):
            raise ValueError(
                f"tensordot: cannot sum over {axes} axes of arrays of shapes {av.shape} and "
                f"{bv.shape}"
            )
        axes_a, axes_b = list(range(av.ndim - axes, av.ndim)), list(range(axes))
    else:
        try:
            first, second = axes
        except (TypeError, ValueError):
            raise ValueError(
                f"tensordot: axes must be an int or a pair of axis lists, got {axes!r}"
            ) from None
        axes_a = [int(first)] if isinstance(first, int | np.integer) else list(first)
        axes_b = [int(second)] if isinstance(second, int | np.integer) else list(second)
        if len(axes_a) != len(axes_b):
            raise ValueError(f"tensordot: {len(axes_a)} axes of a but {len(axes_b)} of b")
    axes_a = [normalize_axis(x, av.ndim)[0] for x in axes_a]
    axes_b = [normalize_axis(x, bv.ndim)[0] for x in axes_b]
    if len(set(axes_a)) != len(axes_a) or len(set(axes_b)) != len(axes_b):
        raise ValueError(f"tensordot: axes {axes} repeat an axis")
    if [av.shape[i] for i in axes_a] != [bv.shape[i] for i in axes_b]:
        raise ValueError(f"tensordot: shapes {av.shape} and {bv.shape} do not align on {axes}")
    free_a = [i for i in range(av.ndim) if i not in axes_a]
    free_b = [i for i in range(bv.ndim) if i not in axes_b]
    k = math.prod(av.shape[i] for i in axes_a)
    out_a = tuple(av.shape[i] for i in free_a)
    out_b = tuple(bv.shape[i] for i in free_b)
    a2 = reshape(transpose(a, free_a + axes_a), (math.prod(out_a), k))
    b2 = reshape(transpose(b, axes_b + free_b), (k, math.prod(out_b)))
    return reshape(matmul(a2, b2), out_a + out_b)


def dot(a: Any, b: Any) -> Any:
    """NumPy's dot: a product for scalars, matmul for 1-D/2-D, tensordot beyond.

    >>> dot(np.array([1.0, 2.0]), np.array([3.0, 4.0]))
    array(11.)
    >>> fg.grad(dot)(np.array([1.0, 2.0]), np.array([3.0, 4.0]))
    array([3., 4.])
    """
    av, bv = aval_of(a), aval_of(b)
    if av.ndim == 0 or bv.ndim == 0:
        return multiply(a, b)
    if av.ndim <= 2 and bv.ndim <= 2:
        return matmul(a, b)
    return tensordot(a, b, ([av.ndim - 1], [builtins.max(bv.ndim - 2, 0)]))


def vdot(a: Any, b: Any) -> Any:
    """The dot product of `a` and `b` flattened to vectors, as numpy.vdot (real values).

    >>> import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    >>> float(fnp.vdot(np.ones((2, 2)), np.arange(4.0)))
    6.0
    >>> fg.grad(fnp.vdot)(np.ones(2), np.array([3.0, 4.0]))
    array([3., 4.])
    """
    return sum(multiply(ravel(a), ravel(b)))


def outer(a: Any, b: Any) -> Any:
    """The outer product of `a` and `b` flattened to vectors, as numpy.outer.

    >>> import numpy as np, fastgrad.numpy as fnp
    >>> fnp.outer(np.array([1.0, 2.0]), np.array([1.0, 10.0, 100.0]))
    array([[  1.,  10., 100.],
           [  2.,  20., 200.]])
    """
    return multiply(reshape(ravel(a), (-1, 1)), reshape(ravel(b), (1, -1)))


def inner(a: Any, b: Any) -> Any:
    """Sum of products over the last axes of `a` and `b` (a product when one is a scalar).

    >>> inner(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([1.0, 1.0]))
    array([3., 7.])
    """
    if aval_of(a).ndim == 0 or aval_of(b).ndim == 0:
        return multiply(a, b)
    return tensordot(a, b, ([-1], [-1]))


def kron(a: Any, b: Any) -> Any:
    """The Kronecker product: blocks a[i, j] * b, as ``numpy.kron``.

    >>> kron(np.array([1.0, 10.0]), np.array([1.0, 2.0, 3.0]))
    array([ 1.,  2.,  3., 10., 20., 30.])
    """
    av, bv = aval_of(a), aval_of(b)
    ndim = builtins.max(av.ndim, bv.ndim)
    sa = (1,) * (ndim - av.ndim) + av.shape
    sb = (1,) * (ndim - bv.ndim) + bv.shape
    # Interleaved axes (a0, b0, a1, b1, ...), multiplied by broadcasting, then merged.
    x = reshape(a, tuple(d for n in sa for d in (n, 1)))
    y = reshape(b, tuple(d for n in sb for d in (1, n)))
    return reshape(multiply(x, y), tuple(m * n for m, n in zip(sa, sb, strict=True)))


def cross(
    a: Any, b: Any, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis: int | None = None
) -> Any:
    """The cross product of 3-vectors (or 2-vectors: the z component) along the given
    axes, broadcasting the others, as ``numpy.cross``.

    >>> cross(np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0]))
    array([0., 0., 1.])
    """
    if axis is not None:
        axisa = axisb = axisc = axis
    a = moveaxis(a if isinstance(a, Tracer) else np.asarray(a), axisa, -1)
    b = moveaxis(b if isinstance(b, Tracer) else np.asarray(b), axisb, -1)
    na, nb = aval_of(a).shape[-1], aval_of(b).shape[-1]
    if na not in (2, 3) or nb not in (2, 3):
        raise ValueError(
            f"cross: vectors must have 2 or 3 components, got {na} and {nb} along the given axes"
        )
    if 2 in (na, nb):
        warnings.warn(
            "cross: arrays of 2-dimensional vectors are deprecated, as in NumPy 2.0; use "
            "3-dimensional vectors",
            DeprecationWarning,
            stacklevel=2,
        )
    a0, a1, b0, b1 = (getitem(v, (Ellipsis, k)) for v in (a, b) for k in (0, 1))
    z = subtract(multiply(a0, b1), multiply(a1, b0))
    if na == nb == 2:
        return z
    a2 = getitem(a, (Ellipsis, 2)) if na == 3 else None
    b2 = getitem(b, (Ellipsis, 2)) if nb == 3 else None
    # A missing third component is 0.
    x = _minus(_times(a1, b2), _times(a2, b1))
    y = _minus(_times(a2, b0), _times(a0, b2))
    out = stack([x, y, z], axis=-1)
    return moveaxis(out, -1, axisc)


def _times(u: Any, v: Any) -> Any:
    return None if u is None or v is None else multiply(u, v)


def _minus(u: Any, v: Any) -> Any:
    return -v if u is None else (u if v is None else subtract(u, v))
