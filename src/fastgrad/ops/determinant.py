"""The determinant: det's record and function. Its gradient is the cofactor matrix, which
is finite at singular matrices where det(A) inv(A)^T is not: near them it comes from the
SVD (fastgrad.ops.decompositions), hence a module of its own above it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, at, register
from fastgrad.core.tracing import aval_of, bind
from fastgrad.ops.base import batch_stacked, reshape, sum
from fastgrad.ops.decompositions import _svd_jvp as svd_jvp
from fastgrad.ops.decompositions import _svd_vjp as svd_vjp
from fastgrad.ops.elementwise import where
from fastgrad.ops.linalg import _unary_square_eval as square_eval
from fastgrad.ops.linalg import (
    as_float_arrays,
    check_square,
    expand_last2,
    mT,
    pack,
    pack_arrays,
    unpack,
)
from fastgrad.ops.products import matmul
from fastgrad.ops.reduction import _prod_others as prod_others
from fastgrad.ops.shape import concatenate, zeros_like

__all__: list[str] = []  # public as fastgrad.numpy.linalg.det and fastgrad.scipy.linalg.det


_A = np.array([[2.0, 0.5, -1.0], [0.25, 3.0, 0.5], [-0.5, 1.0, 1.5]])
_NEG = np.array([[0.5, 2.0], [1.5, -1.0]])
_RANK2 = np.array([[1.0, 2.0, 3.0], [2.0, -1.0, 0.5], [3.0, 1.0, 3.5]])

# ---------------------------------------------------------------- masked_svd


def _masked_svd_eval(mask: Aval, a: Aval) -> Aval:
    check_square(a, "masked_svd")
    if mask.dtype != np.bool_ or mask.shape != a.shape[:-2]:
        raise TypeError(f"masked_svd: the mask must be bools of shape {a.shape[:-2]}, got {mask}")
    k = a.shape[-1]
    return Aval(a.shape[:-2] + (2 * k * k + k + 1,), a.dtype)


def _masked_svd_impl(mask: np.ndarray, a: np.ndarray) -> np.ndarray:
    # The placeholder's SVD is known: diag(n, ..., 1) = I diag(n, ..., 1) I. LAPACK runs on
    # the selected matrices only.
    n, batch = a.shape[-1], a.shape[:-2]
    eye = np.broadcast_to(np.eye(n, dtype=a.dtype), a.shape)
    u, vh = eye.copy(), eye.copy()
    s = np.broadcast_to(np.arange(n, 0, -1, dtype=a.dtype), batch + (n,)).copy()
    sign = np.ones(batch, a.dtype)
    if mask.any():
        u[mask], s[mask], vh[mask] = np.linalg.svd(a[mask], full_matrices=False)
        sign[mask] = np.sign(np.linalg.det(u[mask]) * np.linalg.det(vh[mask]))
    return pack_arrays([u, s, vh, sign], batch)


def _masked_svd_vjp(g: Any, out: Any, mask: Any, a: Any) -> tuple[Any, Any]:
    (ga,) = svd_vjp(g, out, a, compute_uv=True)
    return None, where(expand_last2(mask), ga, 0.0)


def _masked_svd_jvp(t: Any, out: Any, mask: Any, a: Any) -> Any:
    tangent = svd_jvp((where(expand_last2(mask), t[1], 0.0),), out, a, compute_uv=True)
    return concatenate([tangent, zeros_like(tangent[..., :1])], axis=-1)  # the sign's: 0


MASKED_SVD = register(
    Primitive(
        "masked_svd",
        _masked_svd_eval,
        _masked_svd_impl,
        _masked_svd_vjp,
        _masked_svd_jvp,
        batch=batch_stacked("masked_svd"),
        # Selected and not, in one stack; one matrix; none selected. (Not at a singular
        # matrix: a zero singular value is a kink of the SVD, |t| along some directions.)
        special_points=(
            at(np.array([True, False]), np.stack([_A, _A.T])),
            at(np.array(True), _NEG),
            at(np.array([False]), np.diag([1.5, 1.0, 0.5])[None]),
        ),
    )
)


def masked_svd(mask: Any, a: Any) -> list[Any]:
    """(U, S, Vh, det(U Vh)) of each square matrix of `a` where `mask` (one bool per
    matrix), and of the placeholder diag(n, ..., 1) elsewhere, with derivatives 0 there:
    the SVD of where(mask, a, placeholder), computed for the selected matrices only (det's
    rule needs it near singular matrices alone; LAPACK's SVD costs ~20 inverses). The
    sign det(U Vh), +-1, is piecewise constant: derivative 0."""
    n = aval_of(a).shape[-1]
    return unpack(bind(MASKED_SVD, mask, a), aval_of(a).shape[:-2], [(n, n), (n,), (n, n), ()])


# ---------------------------------------------------------------- safe_inverse
# Which branch det's rule takes, and the inverse for one of them, from one LU: a matrix is
# near singular where LAPACK's LU meets a zero pivot, or where its condition number in the
# Frobenius norm, ||a|| ||inv(a)|| (at least the 2-norm one, sigma_max / sigma_min), is
# 1 / sqrt(eps) or more. There the inverse is replaced by the identity (derivative 0).
# Deciding from the singular values instead cost 3x the inverse at 300 x 300, 4x for
# 200 6 x 6 matrices.


def _safe_inverse_impl(a: np.ndarray) -> np.ndarray:
    n, batch = a.shape[-1], a.shape[:-2]
    eye = np.eye(n, dtype=a.dtype)
    # A matrix with inf or nan entries is neither: its inverse is nan (LAPACK's SVD fails).
    finite = np.isfinite(a).all(axis=(-2, -1))[..., None, None]
    a = np.where(finite, a, eye)
    try:
        x, singular = np.linalg.inv(a), np.zeros(batch, bool)
    except np.linalg.LinAlgError:  # some matrix is: which, LU's zero pivots say
        singular = np.linalg.slogdet(a)[0] == 0
        x = np.linalg.inv(np.where(singular[..., None, None], eye, a))
    with np.errstate(all="ignore"):
        kappa = np.linalg.norm(a, axis=(-2, -1)) * np.linalg.norm(x, axis=(-2, -1))
    near = (singular | (kappa * np.sqrt(np.finfo(a.dtype).eps) >= 1)) & finite[..., 0, 0]
    x = np.where(near[..., None, None], eye, np.where(finite, x, np.nan))
    return pack_arrays([x, near.astype(a.dtype)], batch)


def _safe_inverse_parts(out: Any, a: Any) -> tuple[Any, Any]:
    n = aval_of(a).shape[-1]
    x, near = unpack(out, aval_of(a).shape[:-2], [(n, n), ()])
    return x, expand_last2(near > 0)


def _safe_inverse_vjp(g: Any, out: Any, a: Any) -> tuple[Any]:
    x, near = _safe_inverse_parts(out, a)
    gx, _ = unpack(g, aval_of(a).shape[:-2], [aval_of(x).shape[-2:], ()])
    return (where(near, 0.0, -matmul(matmul(mT(x), gx), mT(x))),)


def _safe_inverse_jvp(t: Any, out: Any, a: Any) -> Any:
    x, near = _safe_inverse_parts(out, a)
    tx = where(near, 0.0, -matmul(matmul(x, t[0]), x))
    return pack([tx, zeros_like(near[..., 0, 0], dtype=aval_of(a).dtype)], aval_of(a).shape[:-2])


SAFE_INVERSE = register(
    Primitive(
        "safe_inverse",
        square_eval("safe_inverse", lambda s, n: s[:-2] + (n * n + 1,)),
        _safe_inverse_impl,
        _safe_inverse_vjp,
        _safe_inverse_jvp,
        batch=batch_stacked("safe_inverse"),
        # Regular; singular; near singular beside a regular one. (Not 0 as a 1 x 1: every
        # other 1 x 1 is well conditioned, so it jumps there from the identity to 1 / a; the
        # identity is det's safe operand, never differentiated where it is selected.)
        special_points=(
            at(_A),
            at(_RANK2),
            at(np.stack([_NEG, np.array([[1.0, 2.0], [1.0, 2.0 + 1e-9]])])),
        ),
    )
)


def safe_inverse(a: Any) -> Any:
    """inv(a) and 0. per square matrix of `a`, or the identity and 1. where `a` is near
    singular (see above), packed as (..., n * n + 1)."""
    return bind(SAFE_INVERSE, a)


# ---------------------------------------------------------------- det


def _cofactor(a: Any, d: Any) -> Any:
    """The cofactor matrix of each square `a` whose determinant is `d`: det's gradient.

    Where `a` is well conditioned it is d inv(a)^T. Near a singular matrix that loses
    every digit (and inv fails at one) while the cofactor stays finite: there, from the
    SVD a = U S V^T, it is det(U V^T) U diag(the products of the other singular values)
    V^T, built without division, so exact at any rank. Each branch runs on a safe matrix
    where the other is selected (the identity; masked_svd's placeholder), so that neither
    leaks inf or nan into the other's derivatives, and LAPACK's SVD runs for the
    near-singular matrices only (a 300 x 300 gradient took 5x longer when it ran for all;
    safe_inverse says which they are).
    Orders above 1 in the SVD branch go through the SVD's derivative: exact where the
    singular values are distinct.
    """
    n = aval_of(a).shape[-1]
    if n == 0:
        return a
    x, near_singular = _safe_inverse_parts(safe_inverse(a), a)
    by_inverse = expand_last2(d) * mT(x)
    u, s, vh, sign = masked_svd(near_singular[..., 0, 0], a)
    others = prod_others(s, (aval_of(s).ndim - 1,))
    by_svd = expand_last2(sign) * matmul(u * reshape(others, aval_of(s).shape[:-1] + (1, n)), vh)
    return where(near_singular, by_svd, by_inverse)


# Special points: those of inv, and singular matrices of rank n - 1 (3 x 3 with distinct
# singular values, and 1 x 1).
DET = register(
    Primitive(
        "det",
        square_eval("det", lambda s, n: s[:-2]),
        np.linalg.det,
        lambda g, out, a: (expand_last2(g) * _cofactor(a, out),),
        lambda t, out, a: sum(_cofactor(a, out) * t[0], axis=(-2, -1)),
        batch=batch_stacked("det"),
        special_points=(
            at(_A),
            at(_NEG),
            at(np.array([[2.5]])),
            at(np.stack([_NEG, _NEG.T * 2])),
            at(_RANK2),
            at(np.array([[0.0]])),
        ),
    )
)


def det(a: Any) -> Any:
    """The determinant of each square matrix in `a`; its gradient is the cofactor matrix
    (det(a) inv(a)^T where a is invertible, and finite at singular matrices too).

    >>> round(float(det(np.array([[2.0, 1.0], [1.0, 3.0]]))), 12)
    5.0
    >>> fg.grad(det)(np.array([[1.0, 2.0], [2.0, 4.0]]))  # singular: the cofactors
    array([[ 4., -2.],
           [-2.,  1.]])
    """
    (a,) = as_float_arrays(a, fn="det")
    check_square(aval_of(a), "det")
    return bind(DET, a)
