"""Products: matmul (BLAS) and the contractions built on it: dot, tensordot, vdot, outer.

The `matmul` primitive takes operands of equal rank >= 2 with equal batch axes; the
`matmul` function promotes 1-D operands and broadcasts batch axes first, as NumPy does.
"""

from __future__ import annotations

import builtins
import math
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
from fastgrad.ops.elementwise import format_infix, multiply
from fastgrad.ops.shape import ravel, transpose

__all__ = ["dot", "matmul", "outer", "tensordot", "vdot"]

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
    """NumPy's matmul: 1-D operands are promoted to matrices, batch axes broadcast."""
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
    a2 = broadcast_to(a2, batch + sa[-2:])
    b2 = broadcast_to(b2, batch + sb[-2:])
    out = bind(REGISTRY["matmul"], a2, b2)
    shape = aval_of(out).shape
    if av.ndim == 1:
        shape = shape[:-2] + shape[-1:]
    if bv.ndim == 1:
        shape = shape[:-1]
    return reshape(out, shape)


def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    """Sum products over the given axes of `a` and `b` (NumPy's tensordot)."""
    av, bv = aval_of(a), aval_of(b)
    if isinstance(axes, int):
        axes_a, axes_b = list(range(av.ndim - axes, av.ndim)), list(range(axes))
    else:
        axes_a, axes_b = (
            ([axes[0]] if isinstance(axes[0], int) else list(axes[0])),
            ([axes[1]] if isinstance(axes[1], int) else list(axes[1])),
        )
    axes_a = [normalize_axis(x, av.ndim)[0] for x in axes_a]
    axes_b = [normalize_axis(x, bv.ndim)[0] for x in axes_b]
    if [av.shape[i] for i in axes_a] != [bv.shape[i] for i in axes_b]:
        raise ValueError(f"tensordot: shapes {av.shape} and {bv.shape} do not align on {axes}")
    free_a = [i for i in range(av.ndim) if i not in axes_a]
    free_b = [i for i in range(bv.ndim) if i not in axes_b]
    k = math.prod(av.shape[i] for i in axes_a)
    a2 = reshape(transpose(a, free_a + axes_a), (-1, k))
    b2 = reshape(transpose(b, axes_b + free_b), (k, -1))
    out_shape = tuple(av.shape[i] for i in free_a) + tuple(bv.shape[i] for i in free_b)
    return reshape(matmul(a2, b2), out_shape)


def dot(a: Any, b: Any) -> Any:
    """NumPy's dot: a product for scalars, matmul for 1-D/2-D, tensordot beyond."""
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
