"""scipy.linalg: the matrix exponential, the matrix square root, Sylvester's equation and
the LU decomposition. Records and functions; public under fastgrad.scipy.linalg.

SciPy (imported when an op first runs) computes each, batched over leading axes. The
derivative rules are written with these same ops, so every order works: expm's is the
Frechet derivative, the corner of the exponential of a block matrix; sqrtm's solves a
Sylvester equation; LU's two triangular solves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, at, register
from fastgrad.core.tracing import aval_of, bind
from fastgrad.ops.base import batch_stacked, broadcast_shapes, broadcast_to, reshape
from fastgrad.ops.linalg import (
    _broadcast_rhs,
    _drop_column,
    _tri_solve,
    as_float_arrays,
    batch_shape,
    check_square,
    mT,
    pack,
    pack_arrays,
    triangle,
    unpack,
)
from fastgrad.ops.products import matmul
from fastgrad.ops.selection import take_along_axis
from fastgrad.ops.shape import concatenate, slice_array, zeros_like
from fastgrad.ops.special import _same_float_eval

__all__: list[str] = []  # public under fastgrad.scipy.linalg


def _scipy_linalg(name: str) -> Any:
    import scipy.linalg  # here, not at the top: importing fastgrad does not load SciPy

    return getattr(scipy.linalg, name)


def _square_float(fn: str) -> Callable[..., Aval]:
    """The type rule of an op on square float matrices of one shape and dtype."""
    same = _same_float_eval(fn)

    def abstract_eval(*avals: Aval) -> Aval:
        out = same(*avals)
        check_square(out, fn)
        return Aval(out.shape, out.dtype)

    return abstract_eval


def _record(name: str, impl: Any, vjp: Any, jvp: Any, special_points: Any) -> Primitive:
    return register(
        Primitive(
            name,
            _square_float(name),
            impl,
            vjp,
            jvp,
            batch=batch_stacked(name),
            special_points=special_points,
        )
    )


# Special points: the zero matrix, a nilpotent one, a diagonal one with a repeated entry
# (a repeated eigenvalue), a rotation generator (complex eigenvalues), a general one, one
# that LU must pivot and one near a singular one (sqrtm's derivative grows as 1/sqrt).
_ZERO, _NILPOTENT = np.zeros((2, 2)), np.array([[0.0, 1.0], [0.0, 0.0]])
_REPEATED = np.diag([2.0, 2.0, 0.5])
_GENERAL = np.array([[1.5, -0.5, 0.25], [0.75, 2.0, -1.0], [0.5, 0.25, 3.0]])
_SPD = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]])
_PIVOTED = np.array([[0.5, 2.0, 1.0], [3.0, -1.0, 0.5], [1.0, 1.5, -2.0]])
_LINALG_POINTS = {
    "expm": (at(_ZERO), at(_NILPOTENT), at(_REPEATED), at(np.array([[0.0, -2.0], [2.0, 0.0]])),
             at(_GENERAL), at(_GENERAL[None].repeat(2, axis=0))),
    "sqrtm": (at(_SPD), at(_REPEATED), at(np.array([[4.0, 1.0], [0.0, 9.0]])),
              at(np.diag([1e-6, 1.0]))),
    "solve_sylvester": (at(_SPD, _REPEATED, _GENERAL), at(_REPEATED, _REPEATED, _GENERAL),
                        at(_SPD[:2, :2], _GENERAL, _GENERAL[:2])),
    "lu": (at(_GENERAL), at(_PIVOTED), at(_SPD), at(np.array([[2.0]]))),
}  # fmt: skip


def _corner(x: Any, n: int) -> Any:
    """The top-right n x n block of the (2n, 2n) matrices in x."""
    batch = tuple((0, d, 1) for d in aval_of(x).shape[:-2])
    return slice_array(x, batch + ((0, n, 1), (n, 2 * n, 1)))


# ---------------------------------------------------------------- expm


def _expm_impl(a: np.ndarray) -> np.ndarray:
    return np.asarray(_scipy_linalg("expm")(a)).astype(a.dtype, copy=False)


def frechet_expm(a: Any, e: Any) -> Any:
    """The derivative of expm at a in direction e: the top-right block of
    expm([[a, e], [0, a]]) (Higham's block form)."""
    n = aval_of(a).shape[-1]
    top = concatenate([a, e], axis=-1)
    bottom = concatenate([zeros_like(a), a], axis=-1)
    return _corner(bind(EXPM, concatenate([top, bottom], axis=-2)), n)


# expm's derivative L(a, .) is a linear map whose adjoint is L(a^T, .).
EXPM = _record(
    "expm",
    _expm_impl,
    lambda g, out, a: (frechet_expm(mT(a), g),),
    lambda t, out, a: frechet_expm(a, t[0]),
    _LINALG_POINTS["expm"],
)

# ---------------------------------------------------------------- solve_sylvester


def _sylvester_impl(a: np.ndarray, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.asarray(_scipy_linalg("solve_sylvester")(a, b, q)).astype(a.dtype, copy=False)


def _sylvester_vjp(g: Any, out: Any, a: Any, b: Any, q: Any) -> tuple[Any, Any, Any]:
    # With a x + x b = q and a^T y + y b^T = g: <g, dx> = <y, dq - da x - x db>.
    y = bind(SYLVESTER, mT(a), mT(b), g)
    return -matmul(y, mT(out)), -matmul(mT(out), y), y


def _sylvester_jvp(t: Any, out: Any, a: Any, b: Any, q: Any) -> Any:
    ta, tb, tq = (zeros_like(out) if x is None else x for x in t)
    return bind(SYLVESTER, a, b, tq - matmul(ta, out) - matmul(out, tb))


def _sylvester_eval(a: Aval, b: Aval, q: Aval) -> Aval:
    if len({a.dtype, b.dtype, q.dtype}) != 1 or a.dtype.kind != "f":
        raise TypeError(f"solve_sylvester needs operands of one float dtype, got {a}, {b}, {q}")
    n, m = check_square(a, "solve_sylvester"), check_square(b, "solve_sylvester", "b")
    if q.shape != a.shape[:-2] + (n, m) or b.shape[:-2] != a.shape[:-2]:
        raise ValueError(f"solve_sylvester: shapes {a.shape}, {b.shape}, {q.shape} do not align")
    return Aval(q.shape, q.dtype)


SYLVESTER = register(
    Primitive(
        "solve_sylvester",
        _sylvester_eval,
        _sylvester_impl,
        _sylvester_vjp,
        _sylvester_jvp,
        batch=batch_stacked("solve_sylvester"),
        special_points=_LINALG_POINTS["solve_sylvester"],
    )
)

# ---------------------------------------------------------------- sqrtm


def _sqrtm_impl(a: np.ndarray) -> np.ndarray:
    root = np.asarray(_scipy_linalg("sqrtm")(a))
    if root.dtype.kind == "c":
        if np.any(root.imag != 0):
            raise ValueError(
                "sqrtm: a has no real square root (it has a negative real eigenvalue, or "
                "is singular with no real root); fastgrad's sqrtm is real only"
            )
        root = root.real
    return root.astype(a.dtype, copy=False)


# x x = a, so x dx + dx x = da: a Sylvester equation, its own adjoint with x^T.
SQRTM = _record(
    "sqrtm",
    _sqrtm_impl,
    lambda g, out, a: (bind(SYLVESTER, mT(out), mT(out), g),),
    lambda t, out, a: bind(SYLVESTER, out, out, t[0]),
    _LINALG_POINTS["sqrtm"],
)

# ---------------------------------------------------------------- lu


def _lu_eval(a: Aval) -> Aval:
    _square_float("lu")(a)
    n = a.shape[-1]
    return Aval(batch_shape(a) + (3 * n * n,), a.dtype)


def _lu_impl(a: np.ndarray) -> np.ndarray:
    p, lower, upper = _scipy_linalg("lu")(a)
    return pack_arrays([p.astype(a.dtype), lower, upper], batch_shape(aval_of(a)))


def _lu_parts(out: Any) -> list[Any]:
    """P, L, U (or their cotangents or tangents) from the packed result."""
    shape = aval_of(out).shape
    n = round((shape[-1] // 3) ** 0.5)
    return unpack(out, shape[:-1], [(n, n)] * 3)


def _right_solve_upper(x: Any, u: Any, transpose: bool = False) -> Any:
    """x u^-1 (or x u^-T)."""
    return mT(_tri_solve(u, mT(x), lower=False, transpose=not transpose))


def _lu_vjp(g: Any, out: Any, a: Any) -> tuple[Any]:
    # a = P L U, so L^-1 P^T da U^-1 = L^-1 dL + dU U^-1 (strictly lower + upper): P is
    # piecewise constant and gets no gradient.
    p, lower, upper = _lu_parts(out)
    _, g_lower, g_upper = _lu_parts(g)
    inner = triangle(matmul(mT(lower), g_lower), lower=True, strict=True) + triangle(
        matmul(g_upper, mT(upper)), lower=False
    )
    left = _tri_solve(lower, inner, lower=True, transpose=True, unit_diagonal=True)
    return (matmul(p, _right_solve_upper(left, upper, transpose=True)),)


def _lu_jvp(t: Any, out: Any, a: Any) -> Any:
    p, lower, upper = _lu_parts(out)
    permuted = matmul(mT(p), t[0])
    x = _right_solve_upper(_tri_solve(lower, permuted, lower=True, unit_diagonal=True), upper)
    d_lower = matmul(lower, triangle(x, lower=True, strict=True))
    d_upper = matmul(triangle(x, lower=False), upper)
    return pack([zeros_like(p), d_lower, d_upper], aval_of(out).shape[:-1])


LU = register(
    Primitive(
        "lu",
        _lu_eval,
        _lu_impl,
        _lu_vjp,
        _lu_jvp,
        batch=batch_stacked("lu"),
        special_points=_LINALG_POINTS["lu"],
    )
)

# lu_factor's pivots (row i was swapped with row piv[i], in turn) and the permutation they
# make: integers, never differentiated.


def _pivots_eval(a: Aval) -> Aval:
    _square_float("lu_factor")(a)
    return Aval(a.shape[:-1], np.dtype(np.int32))


def _pivots_impl(a: np.ndarray) -> np.ndarray:
    return np.asarray(_scipy_linalg("lu_factor")(a)[1], np.int32)


def _permutation_impl(piv: np.ndarray, *, inverse: bool) -> np.ndarray:
    """perm with P^T b = b[perm] for the P the swaps in piv make (its inverse with
    `inverse`)."""
    perm = np.broadcast_to(np.arange(piv.shape[-1]), piv.shape).copy()
    for i in range(piv.shape[-1]):
        j = piv[..., i : i + 1].astype(np.int64)
        row_i = perm[..., i : i + 1].copy()
        perm[..., i : i + 1] = np.take_along_axis(perm, j, axis=-1)
        np.put_along_axis(perm, j, row_i, axis=-1)
    return np.argsort(perm, axis=-1) if inverse else perm


LU_PIVOTS = register(
    Primitive(
        "lu_pivots",
        _pivots_eval,
        _pivots_impl,
        None,
        batch=batch_stacked("lu_pivots"),
        special_points=(*_LINALG_POINTS["lu"], at(np.array([[1.0, 2.0], [-1.0, 0.5]]))),
    )
)
PIVOT_PERMUTATION = register(
    Primitive(
        "pivot_permutation",
        lambda piv, *, inverse: Aval(piv.shape, np.dtype(np.int64)),
        _permutation_impl,
        None,
        batch=batch_stacked("pivot_permutation"),
        special_points=tuple(
            at(np.array(piv, np.int32), inverse=inverse)
            for piv in ([2, 2, 2], [0, 1, 2], [1, 2, 2], [0])
            for inverse in (False, True)
        ),
    )
)


# ---------------------------------------------------------------- functions


def _square_operand(a: Any, fn: str) -> Any:
    (a,) = as_float_arrays(a, fn=fn)
    check_square(aval_of(a), fn)
    return a


def expm(A: Any) -> Any:  # noqa: N803  SciPy's name
    """The matrix exponential of each square matrix in A, batched over leading axes;
    differentiable at every order (by the Frechet derivative).

    >>> expm(np.array([[0.0, 1.0], [0.0, 0.0]]))
    array([[1., 1.],
           [0., 1.]])
    """
    return bind(EXPM, _square_operand(A, "expm"))


def sqrtm(A: Any, disp: bool = True, blocksize: int = 64) -> Any:  # noqa: N803
    """The principal square root of each square matrix in A, for real matrices that have a
    real one (a complex root raises); differentiable where the root is nonsingular.
    `disp` and `blocksize` are accepted for compatibility and have no effect.

    >>> sqrtm(np.array([[4.0, 0.0], [0.0, 9.0]]))
    array([[2., 0.],
           [0., 3.]])
    """
    return bind(SQRTM, _square_operand(A, "sqrtm"))


def solve_sylvester(a: Any, b: Any, q: Any) -> Any:
    """The x with a @ x + x @ b = q, for a (..., n, n), b (..., m, m) and q (..., n, m)
    (SciPy's Bartels-Stewart), batched over leading axes; differentiable in a, b and q.

    >>> solve_sylvester(np.eye(2), np.eye(2), np.array([[2.0, 4.0], [6.0, 8.0]]))
    array([[1., 2.],
           [3., 4.]])
    """
    a, b, q = as_float_arrays(a, b, q, fn="solve_sylvester", names=("a", "b", "q"))
    n = check_square(aval_of(a), "solve_sylvester", "a")
    m = check_square(aval_of(b), "solve_sylvester", "b")
    qs = aval_of(q).shape
    if len(qs) < 2 or qs[-2:] != (n, m):
        raise ValueError(
            f"solve_sylvester: q must be ({n}, {m}) in its last two axes for a of shape "
            f"{aval_of(a).shape} and b of shape {aval_of(b).shape}, got shape {qs}"
        )
    batch = broadcast_shapes(
        aval_of(a).shape[:-2], aval_of(b).shape[:-2], qs[:-2], what="solve_sylvester batch axes"
    )
    a, b, q = (broadcast_to(x, batch + aval_of(x).shape[-2:]) for x in (a, b, q))
    return bind(SYLVESTER, a, b, q)


def lu(
    a: Any,
    permute_l: bool = False,
    overwrite_a: bool = False,
    check_finite: bool = True,
    p_indices: bool = False,
) -> Any:
    """SciPy's ``linalg.lu`` of square matrices: (P, L, U) with a = P @ L @ U, L unit lower
    triangular, U upper; with `permute_l=True`, (P @ L, U). Differentiable in a where it is
    nonsingular (P has no derivative). `p_indices=True` is not supported.

    >>> p, l, u = lu(np.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> p @ l @ u
    array([[1., 2.],
           [3., 4.]])
    """
    if p_indices:
        raise NotImplementedError("lu: p_indices=True is not supported; use the matrix P")
    a = _square_operand(a, "lu")
    p, lower, upper = _lu_parts(bind(LU, a))
    return (matmul(p, lower), upper) if permute_l else (p, lower, upper)


def lu_factor(a: Any, overwrite_a: bool = False, check_finite: bool = True) -> tuple[Any, Any]:
    """SciPy's ``linalg.lu_factor`` of square matrices: (lu, piv), L's strict lower triangle
    and U in one matrix and LAPACK's row swaps, for `lu_solve`. Differentiable in a where it
    is nonsingular (piv, integers, has no derivative).

    >>> lu_, piv = lu_factor(np.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> lu_, piv
    (array([[3.        , 4.        ],
           [0.33333333, 0.66666667]]), array([1, 1], dtype=int32))
    """
    a = _square_operand(a, "lu_factor")
    _, lower, upper = _lu_parts(bind(LU, a))
    return triangle(lower, lower=True, strict=True) + upper, bind(LU_PIVOTS, a)


def lu_solve(
    lu_and_piv: tuple[Any, Any],
    b: Any,
    trans: int = 0,
    overwrite_b: bool = False,
    check_finite: bool = True,
) -> Any:
    """SciPy's ``linalg.lu_solve``: x with a @ x = b (`trans=1` or 2: a^T @ x = b), given
    `lu_factor(a)`; differentiable in lu and b.

    >>> lu_and_piv = lu_factor(np.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> lu_solve(lu_and_piv, np.array([5.0, 11.0]))
    array([1., 2.])
    """
    if trans not in (0, 1, 2):
        raise ValueError(f"lu_solve: trans must be 0, 1 or 2, not {trans!r}")
    packed, piv = lu_and_piv
    packed, b = as_float_arrays(packed, b, fn="lu_solve", names=("lu", "b"))
    packed, b, vector = _broadcast_rhs(packed, b, "lu_solve")
    # a = P L U with P^T b = b[perm]: a x = b is L U x = b[perm]; a^T x = b is
    # U^T L^T (P^T x) = b, so x = w[perm^-1] for w = L^-T U^-T b.
    perm = bind(
        PIVOT_PERMUTATION, broadcast_to(piv, aval_of(packed).shape[:-1]), inverse=trans != 0
    )
    rows = reshape(perm, aval_of(perm).shape + (1,))
    if trans == 0:
        y = _tri_solve(packed, take_along_axis(b, rows, axis=-2), lower=True, unit_diagonal=True)
        x = _tri_solve(packed, y, lower=False)
    else:
        z = _tri_solve(packed, b, lower=False, transpose=True)
        w = _tri_solve(packed, z, lower=True, transpose=True, unit_diagonal=True)
        x = take_along_axis(w, rows, axis=-2)
    return _drop_column(x, vector)
