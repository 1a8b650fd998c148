"""The determinant: det's record and function. Its gradient is the cofactor matrix, which
is finite at singular matrices where det(A) inv(A)^T is not: near them it comes from the
SVD (fastgrad.ops.decompositions), hence a module of its own above it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastgrad.core.primitive import Primitive, at, register
from fastgrad.core.tracing import aval_of, bind
from fastgrad.ops.base import batch_stacked, reshape, sum
from fastgrad.ops.decompositions import SVD
from fastgrad.ops.decompositions import _svd_parts as svd_parts
from fastgrad.ops.elementwise import stop_gradient, where
from fastgrad.ops.linalg import _unary_square_eval as square_eval
from fastgrad.ops.linalg import as_float_arrays, check_square, expand_last2, inv, mT, slogdet
from fastgrad.ops.products import matmul
from fastgrad.ops.reduction import _prod_others as prod_others

__all__: list[str] = []  # public as fastgrad.numpy.linalg.det and fastgrad.scipy.linalg.det


def _cofactor(a: Any, d: Any) -> Any:
    """The cofactor matrix of each square `a` whose determinant is `d`: det's gradient.

    Where `a` is well conditioned it is d inv(a)^T. Near a singular matrix that loses
    every digit (and inv fails at one) while the cofactor stays finite: there, from the
    SVD a = U S V^T, it is det(U V^T) U diag(the products of the other singular values)
    V^T, built without division, so exact at any rank. Each branch runs on a safe matrix
    where the other is selected (the identity; singular values 1..n), so that neither
    leaks inf or nan into the other's derivatives. Orders above 1 in the SVD branch go
    through the SVD's derivative: exact where the singular values are distinct.
    """
    n, dtype = aval_of(a).shape[-1], aval_of(a).dtype
    if n == 0:
        return a
    values = bind(SVD, a, compute_uv=False)  # only compared: never differentiated
    tol = float(np.sqrt(np.finfo(dtype).eps))
    near_singular = expand_last2(values[..., -1] <= values[..., 0] * tol)
    eye = np.eye(n, dtype=dtype)
    by_inverse = expand_last2(d) * mT(inv(where(near_singular, eye, a)))
    spread = np.diag(np.arange(1, n + 1)).astype(dtype)
    u, s, vh = svd_parts(bind(SVD, where(near_singular, a, spread), compute_uv=True), a)
    sign = stop_gradient(slogdet(matmul(u, vh)).sign)  # +-1, piecewise constant
    others = prod_others(s, (aval_of(s).ndim - 1,))
    by_svd = expand_last2(sign) * matmul(u * reshape(others, aval_of(s).shape[:-1] + (1, n)), vh)
    return where(near_singular, by_svd, by_inverse)


_A = np.array([[2.0, 0.5, -1.0], [0.25, 3.0, 0.5], [-0.5, 1.0, 1.5]])
# Special points: those of inv, and singular matrices of rank n - 1 (3 x 3 with distinct
# singular values, and 1 x 1).
_NEG = np.array([[0.5, 2.0], [1.5, -1.0]])
_RANK2 = np.array([[1.0, 2.0, 3.0], [2.0, -1.0, 0.5], [3.0, 1.0, 3.5]])
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
