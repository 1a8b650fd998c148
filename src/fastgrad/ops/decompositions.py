"""Matrix decompositions: eigh, svd, qr, and the pseudo-inverse: records and functions.

LAPACK (through NumPy) computes each decomposition once; its results are packed into one
array (linalg.pack_arrays) and the functions unpack them, so a graph node keeps one
output. Derivatives follow the usual perturbation formulas, written with matmul, solves
and masks: they hold for distinct eigenvalues (eigh) and distinct nonzero singular values
(svd); at repeated ones the eigenvector or singular-vector derivatives are inf or nan,
never a finite wrong value, while those of the values alone stay exact.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, at, register
from fastgrad.core.tracing import aval_of, bind
from fastgrad.ops import spectral_ties as ties
from fastgrad.ops.base import batch_stacked, reshape, sum
from fastgrad.ops.elementwise import logical_not, logical_or, where
from fastgrad.ops.linalg import (
    _tri_solve as tri_solve,
)
from fastgrad.ops.linalg import (
    as_float_arrays,
    check_matrices,
    check_square,
    diag_embed,
    diagonal_of,
    from_triangle,
    mT,
    pack,
    pack_arrays,
    symmetrize,
    triangle,
    unpack,
)
from fastgrad.ops.products import matmul
from fastgrad.ops.shape import concatenate, slice_array

__all__: list[str] = []  # public under fastgrad.numpy.linalg

EighResult = namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
EighResult.__doc__ = """What `eigh` gives: the eigenvalues in ascending order, and the
eigenvectors as the columns of a matrix. Both are differentiable.

>>> fnp.linalg.eigh(np.diag([2.0, 1.0])).eigenvalues
array([1., 2.])
>>> fg.grad(lambda a: fnp.sum(fnp.linalg.eigh(a).eigenvalues ** 2))(np.diag([2.0, 1.0]))
array([[4., 0.],
       [0., 2.]])
"""
SVDResult = namedtuple("SVDResult", ["U", "S", "Vh"])
SVDResult.__doc__ = """What `svd` gives: U, the singular values S in descending order, and
Vh, with a = U @ diag(S) @ Vh. All three are differentiable.

>>> fnp.linalg.svd(np.diag([3.0, -4.0])).S
array([4., 3.])
>>> fg.grad(lambda a: fnp.linalg.svd(a).S[0])(np.diag([3.0, -4.0]))
array([[ 0.,  0.],
       [ 0., -1.]])
"""
QRResult = namedtuple("QRResult", ["Q", "R"])
QRResult.__doc__ = """What `qr` gives: Q with orthonormal columns and R upper triangular,
with a = Q @ R.

>>> q, r = fnp.linalg.qr(np.array([[3.0, 1.0], [4.0, 2.0]]))
>>> np.allclose(q @ r, [[3.0, 1.0], [4.0, 2.0]]), float(abs(r[0, 0]))
(True, 5.0)
"""

# ---------------------------------------------------------------- shared pieces


def _float_eval(a: Aval, fn: str) -> None:
    if a.dtype.kind != "f":
        raise TypeError(f"{fn} needs a float operand, got {a}")


def _any_nonzero(*gs: Any) -> Any:
    """Per matrix of the batch, whether any of the cotangents `gs` is nonzero: (..., 1, 1)."""
    # A count of nonzeros, not a maximum: it is defined for empty matrices, and a NaN
    # cotangent counts as nonzero, so it propagates.
    count = sum(gs[0] != 0, axis=(-2, -1), keepdims=True)
    for other in gs[1:]:
        count = count + sum(other != 0, axis=(-2, -1), keepdims=True)
    return count > 0


def _coupling(values: Any, used: Any) -> Any:
    """F[i, j] = 1 / (values[j] - values[i]) off the diagonal, 0 on it: how eigen- or
    singular vectors respond to a perturbation. Where `used` is False (no cotangent reaches
    the vectors) it is 0, from a safe denominator, so that nothing infinite enters a
    gradient that does not need it, at this order or the next."""
    n = aval_of(values).shape[-1]
    eye = np.eye(n, dtype=bool)
    diff = reshape(values, aval_of(values).shape[:-1] + (1, n)) - reshape(
        values, aval_of(values).shape + (1,)
    )
    skip = logical_or(eye, logical_not(used))
    return where(skip, 0.0, 1.0 / where(skip, 1.0, diff))


def _guarded_inverse(s: Any, used: Any) -> Any:
    """1 / s where `used`, else 0 (from a safe denominator, as in _coupling)."""
    return where(used, 1.0 / where(used, s, 1.0), 0.0)


def _unless_split(values: Any, g: Any, reached: Any, grad: Any) -> Any:
    """`grad`, or nan for a matrix whose repeated values get unequal cotangents (or whose
    vectors of a repeated value get one): docs/conventions.md, repeated-eigenvalues."""
    if aval_of(values).shape[-1] < 2:
        return grad
    return ties.poisoned(ties.split_ties(ties.ties(values), g, reached), grad)


def _tie_mean(values: Any, d: Any) -> Any:
    """The values' tangents `d`, averaged over each tie (spectral_ties.tie_mean)."""
    return d if aval_of(values).shape[-1] < 2 else ties.tie_mean(ties.ties(values), d)


# ---------------------------------------------------------------- eigh


def _eigh_eval(a: Aval, *, vectors: bool) -> Aval:
    _float_eval(a, "eigh")
    n = check_square(a, "eigh")
    return Aval(a.shape[:-2] + ((n + n * n) if vectors else n,), a.dtype)


def _eigh_impl(a: np.ndarray, *, vectors: bool) -> np.ndarray:
    if not vectors:
        return np.linalg.eigvalsh(a)
    w, v = np.linalg.eigh(a)
    return pack_arrays([w, v], a.shape[:-2])


def _eigh_parts(a: Any) -> tuple[Any, Any]:
    n = aval_of(a).shape[-1]
    w, v = unpack(bind(EIGH, a, vectors=True), aval_of(a).shape[:-2], [(n,), (n, n)])
    return w, v


def _eigh_vjp(g: Any, out: Any, a: Any, *, vectors: bool) -> tuple[Any]:
    # dA -> (diag(V^T dA V), V (F * (V^T dA V))); its transpose, for symmetric dA.
    n = aval_of(a).shape[-1]
    batch = aval_of(a).shape[:-2]
    if not vectors:
        _, v = _eigh_parts(a)
        return (_unless_split(out, g, None, matmul(v * reshape(g, batch + (1, n)), mT(v))),)
    w, v = unpack(out, batch, [(n,), (n, n)])
    gw, gv = unpack(g, batch, [(n,), (n, n)])
    inner = diag_embed(gw) + _coupling(w, _any_nonzero(gv)) * matmul(mT(v), gv)
    grad = symmetrize(matmul(matmul(v, inner), mT(v)))
    return (_unless_split(w, gw, sum(gv != 0, axis=-2) > 0, grad),)


def _eigh_jvp(t: Any, out: Any, a: Any, *, vectors: bool) -> Any:
    n = aval_of(a).shape[-1]
    batch = aval_of(a).shape[:-2]
    w, v = unpack(out, batch, [(n,), (n, n)]) if vectors else _eigh_parts(a)
    x = matmul(matmul(mT(v), symmetrize(t[0])), v)
    tw = _tie_mean(w, diagonal_of(x))
    if not vectors:
        return tw
    used = np.ones((1, 1), dtype=bool)
    return pack([tw, matmul(v, _coupling(w, used) * x)], batch)


# The input is symmetric (the functions make it so from one triangle, as LAPACK reads it);
# the rules are those of eigh((A + A^T) / 2).
# Special points (here and below): distinct eigen- or singular values (at repeated ones the
# vectors have no derivative), square, tall and wide, 1 x 1, a stack. The vectors' signs
# are LAPACK's (see docs/conventions.md, decomposition-signs).
_A = np.array([[2.0, 0.5, -1.0], [0.25, 3.0, 0.5], [-0.5, 1.0, 1.5]])
_SYM = _A + _A.T
EIGH = register(
    Primitive(
        "eigh", _eigh_eval, _eigh_impl, _eigh_vjp, _eigh_jvp, batch=batch_stacked("eigh"),
        special_points=(at(_SYM, vectors=True), at(_SYM, vectors=False),
                        at(np.stack([_SYM[:2, :2], -_SYM[1:, 1:]]), vectors=True),
                        at(np.diag([1.0, 1.0, 3.0]), vectors=False,
                           convention="repeated-eigenvalues")),
    )
)  # fmt: skip


# ---------------------------------------------------------------- svd


def _svd_shapes(m: int, n: int) -> list[tuple[int, ...]]:
    k = min(m, n)
    return [(m, k), (k,), (k, n)]


def _svd_eval(a: Aval, *, compute_uv: bool) -> Aval:
    _float_eval(a, "svd")
    check_matrices(a, "svd")
    m, n = a.shape[-2:]
    k = min(m, n)
    return Aval(a.shape[:-2] + ((m * k + k + k * n) if compute_uv else k,), a.dtype)


def _svd_impl(a: np.ndarray, *, compute_uv: bool) -> np.ndarray:
    if not compute_uv:
        return np.linalg.svd(a, compute_uv=False)
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    return pack_arrays([u, s, vh], a.shape[:-2])


def _svd_parts(out: Any, a: Any) -> list[Any]:
    m, n = aval_of(a).shape[-2:]
    return unpack(out, aval_of(a).shape[:-2], _svd_shapes(m, n))


def _svd_vjp(g: Any, out: Any, a: Any, *, compute_uv: bool) -> tuple[Any]:
    batch = aval_of(a).shape[:-2]
    k = min(aval_of(a).shape[-2:])
    if not compute_uv:
        u, _, vh = _svd_parts(bind(SVD, a, compute_uv=True), a)
        return (_unless_split(out, g, None, matmul(u * reshape(g, batch + (1, k)), vh)),)
    u, s, vh = _svd_parts(out, a)
    gu, gs, gvh = _svd_parts(g, a)
    v, gv = mT(vh), mT(gvh)
    used = _any_nonzero(gu, gvh)
    f = _coupling(s * s, used)
    s_row = reshape(s, batch + (1, k))
    j = f * matmul(mT(u), gu)
    h = f * matmul(mT(v), gv)
    # The transpose of _svd_jvp: the cotangent of P = U^T dA V, mapped back through U, V,
    # plus the parts of gU, gV outside the column spaces of U and V.
    gp = diag_embed(gs) + (j + mT(j)) * s_row + mT(s_row) * (h + mT(h))
    # Those parts are 0 for a square U or V (its columns span the space): skipped, they
    # would be 0 / 0 at a zero singular value.
    m, n = aval_of(a).shape[-2:]
    inv_s = _guarded_inverse(s_row, used)
    ga = matmul(matmul(u, gp), vh)
    if m > k:
        ga = ga + matmul((gu - matmul(u, matmul(mT(u), gu))) * inv_s, vh)
    if n > k:
        ga = ga + matmul(u, mT((gv - matmul(v, matmul(mT(v), gv))) * inv_s))
    reached = logical_or(sum(gu != 0, axis=-2) > 0, sum(gvh != 0, axis=-1) > 0)
    return (_unless_split(s, gs, reached, ga),)


def _svd_jvp(t: Any, out: Any, a: Any, *, compute_uv: bool) -> Any:
    batch = aval_of(a).shape[:-2]
    k = min(aval_of(a).shape[-2:])
    u, s, vh = _svd_parts(out if compute_uv else bind(SVD, a, compute_uv=True), a)
    v, ta = mT(vh), t[0]
    p = matmul(matmul(mT(u), ta), v)
    ts = _tie_mean(s, diagonal_of(p))
    if not compute_uv:
        return ts
    used = np.ones((1, 1), dtype=bool)
    f = _coupling(s * s, used)
    s_row = reshape(s, batch + (1, k))
    s_col = reshape(s, batch + (k, 1))
    ps = p * s_row  # P S
    sp = s_col * p  # S P
    m, n = aval_of(a).shape[-2:]
    tu = matmul(u, f * (ps + mT(ps)))
    tv = matmul(v, f * (sp + mT(sp)))
    # The parts outside the column spaces of U and V: 0 for a square factor (as in the VJP).
    if m > k:
        tu = tu + (matmul(ta, v) - matmul(u, p)) / s_row
    if n > k:
        tv = tv + (matmul(mT(ta), u) - matmul(v, mT(p))) / s_row
    return pack([tu, ts, mT(tv)], batch)


SVD = register(
    Primitive(
        "svd", _svd_eval, _svd_impl, _svd_vjp, _svd_jvp, batch=batch_stacked("svd"),
        special_points=(at(_A, compute_uv=True), at(_A[:, :2], compute_uv=True),
                        at(_A[:2], compute_uv=True), at(_A, compute_uv=False),
                        at(np.array([[-2.5]]), compute_uv=True)),
    )
)  # fmt: skip


# ---------------------------------------------------------------- qr


def _qr_shapes(m: int, n: int) -> list[tuple[int, ...]]:
    k = min(m, n)
    return [(m, k), (k, n)]


def _qr_eval(a: Aval) -> Aval:
    _float_eval(a, "qr")
    check_matrices(a, "qr")
    m, n = a.shape[-2:]
    k = min(m, n)
    return Aval(a.shape[:-2] + (m * k + k * n,), a.dtype)


def _qr_impl(a: np.ndarray) -> np.ndarray:
    q, r = np.linalg.qr(a, mode="reduced")
    return pack_arrays([q, r], a.shape[:-2])


def _right_solve_upper(x: Any, r: Any, transpose: bool = False) -> Any:
    """x R^-1 (or x R^-T) for upper triangular R."""
    return mT(tri_solve(r, mT(x), lower=False, transpose=not transpose))


def _square_qr_jvp(q: Any, r: Any, ta: Any) -> tuple[Any, Any]:
    # With B = dA R^-1 and C = Q^T B: Q^T dQ = W is antisymmetric and dR R^-1 upper
    # triangular, so W is C's strictly lower part minus its transpose.
    b = _right_solve_upper(ta, r)
    c = matmul(mT(q), b)
    low = triangle(c, lower=True, strict=True)
    w = low - mT(low)
    return b + matmul(q, w - c), matmul(c - w, r)


def _square_qr_vjp(q: Any, r: Any, gq: Any, gr: Any) -> Any:
    # The transpose of _square_qr_jvp, for a tall (or square) A.
    e = matmul(gr, mT(r)) - matmul(mT(q), gq)
    gc = triangle(e, lower=False) + triangle(mT(e), lower=True, strict=True)
    return _right_solve_upper(gq + matmul(q, gc), r, transpose=True)


def _split_wide(x: Any, m: int) -> tuple[Any, Any]:
    shape = aval_of(x).shape
    head = tuple((0, d, 1) for d in shape[:-1])
    return slice_array(x, head + ((0, m, 1),)), slice_array(x, head + ((m, shape[-1], 1),))


def _qr_vjp(g: Any, out: Any, a: Any) -> tuple[Any]:
    m, n = aval_of(a).shape[-2:]
    q, r = unpack(out, aval_of(a).shape[:-2], _qr_shapes(m, n))
    gq, gr = unpack(g, aval_of(a).shape[:-2], _qr_shapes(m, n))
    if m >= n:
        return (_square_qr_vjp(q, r, gq, gr),)
    # Wide A = [X | Y]: Q, U = qr(X) and R = [U | Q^T Y].
    (u, _), (gu, gv) = _split_wide(r, m), _split_wide(gr, m)
    _, y = _split_wide(a, m)
    gx = _square_qr_vjp(q, u, gq + matmul(y, mT(gv)), gu)
    return (concatenate([gx, matmul(q, gv)], axis=-1),)


def _qr_jvp(t: Any, out: Any, a: Any) -> Any:
    m, n = aval_of(a).shape[-2:]
    batch = aval_of(a).shape[:-2]
    q, r = unpack(out, batch, _qr_shapes(m, n))
    if m >= n:
        return pack(list(_square_qr_jvp(q, r, t[0])), batch)
    (u, _), (tx, ty) = _split_wide(r, m), _split_wide(t[0], m)
    _, y = _split_wide(a, m)
    tq, tu = _square_qr_jvp(q, u, tx)
    tv = matmul(mT(tq), y) + matmul(mT(q), ty)
    return pack([tq, concatenate([tu, tv], axis=-1)], batch)


QR = register(
    Primitive(
        "qr", _qr_eval, _qr_impl, _qr_vjp, _qr_jvp, batch=batch_stacked("qr"),
        special_points=(at(_A), at(_A[:, :2]), at(_A[:2]), at(np.stack([_A, -_A.T]))),
    )
)  # fmt: skip


# ---------------------------------------------------------------- pinv


def _pinv_eval(a: Aval, *, rcond: float | None) -> Aval:
    _float_eval(a, "pinv")
    check_matrices(a, "pinv")
    return Aval(a.shape[:-2] + (a.shape[-1], a.shape[-2]), a.dtype)


def _pinv_impl(a: np.ndarray, *, rcond: float | None) -> np.ndarray:
    return np.linalg.pinv(a) if rcond is None else np.linalg.pinv(a, rcond=rcond)


def _pinv_jvp(t: Any, out: Any, a: Any, *, rcond: float | None) -> Any:
    # For a constant rank (Golub and Pereyra): dP = -P dA P + P P^T dA^T (I - A P)
    # + (I - P A) dA^T P^T P.
    p, ta = out, t[0]
    left = mT(ta) - matmul(matmul(mT(ta), a), p)  # dA^T (I - A P)
    right = mT(ta) - matmul(p, matmul(a, mT(ta)))  # (I - P A) dA^T
    return (
        -matmul(matmul(p, ta), p) + matmul(matmul(p, mT(p)), left) + matmul(right, matmul(mT(p), p))
    )


def _pinv_vjp(g: Any, out: Any, a: Any, *, rcond: float | None) -> tuple[Any]:
    # The transpose of _pinv_jvp.
    p = out
    k = mT(g) - matmul(matmul(a, p), mT(g))  # (I - A P) G^T
    low = mT(g) - matmul(mT(g), matmul(p, a))  # G^T (I - P A)
    return (
        -matmul(matmul(mT(p), g), mT(p))
        + matmul(k, matmul(p, mT(p)))
        + matmul(matmul(mT(p), p), low),
    )


PINV = register(
    Primitive(
        "pinv", _pinv_eval, _pinv_impl, _pinv_vjp, _pinv_jvp, batch=batch_stacked("pinv"),
        # Full rank: the derivative holds where the rank does not change.
        special_points=(at(_A, rcond=None), at(_A[:, :2], rcond=None), at(_A[:2], rcond=None)),
    )
)  # fmt: skip


# ---------------------------------------------------------------- functions


def eigh(a: Any, UPLO: str = "L") -> Any:  # noqa: N803  NumPy's name
    """Eigenvalues (ascending) and eigenvectors of each symmetric matrix in `a`.

    As in NumPy only the lower triangle (UPLO='L') or the upper one ('U') is read, and the
    gradient lands there. Derivatives assume distinct eigenvalues: where two are equal the
    eigenvectors are not unique, and derivatives that go through them are inf or nan (the
    eigenvalues' own derivatives stay exact; use `eigvalsh` when only those are needed).
    Returns (eigenvalues, eigenvectors), a named tuple as in NumPy.

    >>> w, v = eigh(np.array([[2.0, 1.0], [1.0, 2.0]]))
    >>> w
    array([1., 3.])
    """
    a = _symmetric_input(a, UPLO, "eigh")
    w, v = _eigh_parts(a)
    return EighResult(w, v)


def scipy_eigh(
    a: Any, b: Any = None, *, lower: bool = True, eigvals_only: bool = False, **options: Any
) -> Any:
    """SciPy's ``linalg.eigh`` for the standard problem (b=None): (eigenvalues,
    eigenvectors), or the eigenvalues alone with `eigvals_only=True`; the `lower` triangle
    (by default) or the upper one is read. The generalized problem and SciPy's driver and
    subset options are not supported.

    >>> scipy_eigh(np.array([[2.0, 1.0], [1.0, 2.0]]), eigvals_only=True)
    array([1., 3.])
    """
    if b is not None or options:
        raise NotImplementedError(
            "scipy.linalg.eigh: only the standard problem (b=None) without driver or subset "
            f"options is supported, got b={'given' if b is not None else None}, "
            f"options {sorted(options)}"
        )
    uplo = "L" if lower else "U"
    return eigvalsh(a, UPLO=uplo) if eigvals_only else tuple(eigh(a, UPLO=uplo))


def eigvalsh(a: Any, UPLO: str = "L") -> Any:  # noqa: N803  NumPy's name
    """Eigenvalues (ascending) of each symmetric matrix in `a` (one triangle read, as in
    `eigh`); their gradient is V diag(g) V^T.

    >>> eigvalsh(np.array([[2.0, 1.0], [1.0, 2.0]]))
    array([1., 3.])
    """
    return bind(EIGH, _symmetric_input(a, UPLO, "eigvalsh"), vectors=False)


def _symmetric_input(a: Any, uplo: str, fn: str) -> Any:
    if uplo not in ("L", "U"):
        raise ValueError(f"{fn}: UPLO must be 'L' or 'U', not {uplo!r}")
    (a,) = as_float_arrays(a, fn=fn)
    check_square(aval_of(a), fn)
    return from_triangle(a, lower=uplo == "L")


def svd(
    a: Any, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False
) -> Any:
    """The singular value decomposition a = U diag(S) Vh of each matrix in `a`.

    Only the reduced form has a derivative, so `full_matrices=True` (NumPy's default) is
    accepted where it gives the same result (square matrices) and otherwise asks for
    `full_matrices=False`. Derivatives of U and Vh assume distinct nonzero singular values
    (inf or nan where that fails); those of S alone are exact for distinct ones.
    `compute_uv=False` returns S only.

    >>> svd(np.array([[3.0, 0.0], [0.0, -2.0]]), compute_uv=False)
    array([3., 2.])
    """
    (a,) = as_float_arrays(a, fn="svd")
    check_matrices(aval_of(a), "svd")
    if hermitian:
        a = from_triangle(a, lower=True)
    if not compute_uv:
        return bind(SVD, a, compute_uv=False)
    m, n = aval_of(a).shape[-2:]
    if full_matrices and m != n:
        raise ValueError(
            f"svd: full_matrices=True pads U or Vh with an arbitrary basis of the complement "
            f"(shape {aval_of(a).shape}), which has no derivative; pass full_matrices=False"
        )
    return SVDResult(*_svd_parts(bind(SVD, a, compute_uv=True), a))


def svdvals(x: Any) -> Any:
    """The singular values of each matrix in `x`, largest first (NumPy 2's
    ``linalg.svdvals``).

    >>> svdvals(np.array([[0.0, 2.0], [1.0, 0.0]]))
    array([2., 1.])
    """
    return svd(x, compute_uv=False)


def qr(a: Any, mode: str = "reduced") -> Any:
    """The QR decomposition of each matrix in `a`: Q with orthonormal columns, R upper
    triangular (NumPy's signs). `mode` is 'reduced' (Q, R), 'r' (R only), or 'complete'
    where it equals 'reduced' (m <= n). Derivatives need the leading square block of `a`
    to have full rank (a zero on R's diagonal raises LinAlgError).

    >>> a = np.array([[3.0, 0.0], [4.0, 5.0], [0.0, 1.0]])
    >>> q, r = qr(a)
    >>> q.shape, r.shape, bool(np.allclose(q @ r, a))
    ((3, 2), (2, 2), True)
    """
    (a,) = as_float_arrays(a, fn="qr")
    check_matrices(aval_of(a), "qr")
    m, n = aval_of(a).shape[-2:]
    if mode not in ("reduced", "r", "complete") or (mode == "complete" and m > n):
        raise ValueError(
            f"qr: mode {mode!r} is not supported for shape {aval_of(a).shape}; use 'reduced' "
            "or 'r' ('complete' only where it equals 'reduced', m <= n)"
        )
    q, r = unpack(bind(QR, a), aval_of(a).shape[:-2], _qr_shapes(m, n))
    return r if mode == "r" else QRResult(q, r)


def pinv(a: Any, rcond: float | None = None, hermitian: bool = False) -> Any:
    """The Moore-Penrose pseudo-inverse of each matrix in `a` (NumPy's ``linalg.pinv``:
    singular values at most rcond times the largest count as zero; NumPy's default rcond
    when None). Its derivative holds where the rank does not change.

    >>> pinv(np.array([[2.0, 0.0], [0.0, 0.0]]))
    array([[0.5, 0. ],
           [0. , 0. ]])
    """
    (a,) = as_float_arrays(a, fn="pinv")
    check_matrices(aval_of(a), "pinv")
    if hermitian:
        a = from_triangle(a, lower=True)
    return bind(PINV, a, rcond=None if rcond is None else float(rcond))
