"""Linear solves and determinants: solve, inv, slogdet, cholesky, triangular solves.

Records and functions; forward by LAPACK (NumPy, SciPy), batched over leading axes as in
NumPy. VJP and JVP rules are written with these functions and matmul, so derivatives of
any order are again LAPACK calls and products. Decompositions (eigh, svd, qr, pinv) are in
fastgrad.ops.decompositions, det (whose derivative needs the SVD) fastgrad.ops.determinant,
norms and compositions in fastgrad.ops.matrix_functions; the public names are gathered by
fastgrad.numpy.linalg and fastgrad.scipy.linalg.
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, at, register
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.ops.base import (
    batch_stacked,
    broadcast_shapes,
    broadcast_to,
    coerce,
    promote,
    reshape,
    sum,
    tangent_sum,
)
from fastgrad.ops.elementwise import where
from fastgrad.ops.math import sin
from fastgrad.ops.products import matmul
from fastgrad.ops.shape import concatenate, slice_array, transpose, zeros_like

# Public under fastgrad.numpy.linalg and fastgrad.scipy.linalg, not fastgrad.numpy.
__all__: list[str] = []

SlogdetResult = namedtuple("SlogdetResult", ["sign", "logabsdet"])
SlogdetResult.__doc__ = """What `slogdet` gives: the sign of the determinant and the log of
its absolute value; the gradient of logabsdet is the transposed inverse.

>>> fnp.linalg.slogdet(np.diag([-2.0, 3.0]))
SlogdetResult(sign=array(-1.), logabsdet=array(1.79175947))
>>> fg.grad(lambda a: fnp.linalg.slogdet(a).logabsdet)(np.diag([2.0, 4.0]))
array([[0.5 , 0.  ],
       [0.  , 0.25]])
"""

# ---------------------------------------------------------------- helpers the family shares


def as_float_arrays(*xs: Any, fn: str, names: Sequence[str] = ("a", "b")) -> list[Any]:
    """`xs` (arrays, traced or not) promoted to one float dtype, integers computed in
    float64 as NumPy's linalg does; `names` name them in errors."""
    xs = tuple(x if isinstance(x, Tracer) else np.asarray(x) for x in xs)
    avals = [aval_of(x) for x in xs]
    for aval, name in zip(avals, names, strict=False):
        if aval.dtype.kind not in "biuf":
            raise TypeError(
                f"{fn}: {name} has dtype {aval.dtype}; expected float32/float64 (or integers, "
                "computed in float64)"
            )
    dtype, _ = promote([Aval(a.shape, a.dtype) for a in avals])
    if dtype.kind != "f":
        dtype = np.dtype(np.float64)
    tracing = any(isinstance(x, Tracer) for x in xs)
    return [coerce(x, a, dtype, a.shape, tracing) for x, a in zip(xs, avals, strict=True)]


def check_square(aval: Aval, fn: str, name: str = "a") -> int:
    if aval.ndim < 2 or aval.shape[-1] != aval.shape[-2]:
        raise ValueError(
            f"{fn}: {name} must hold square matrices in its last two axes, got shape {aval.shape}"
        )
    return aval.shape[-1]


def check_matrices(aval: Aval, fn: str, name: str = "a") -> None:
    if aval.ndim < 2:
        raise ValueError(f"{fn}: {name} must be at least 2-D (a matrix), got shape {aval.shape}")


def matrix_transpose(x: Any) -> Any:
    """Swap the last two axes (NumPy's ``linalg.matrix_transpose``).

    >>> matrix_transpose(np.arange(6.0).reshape(1, 2, 3)).shape
    (1, 3, 2)
    """
    ndim = aval_of(x).ndim
    if ndim < 2:
        raise ValueError(f"matrix_transpose needs at least 2-D input, got {ndim}-D")
    return transpose(x, tuple(range(ndim - 2)) + (ndim - 1, ndim - 2))


mT = matrix_transpose


def eye_like(x: Any, n: int | None = None) -> np.ndarray:
    """The identity of the size of `x`'s last axis (or `n`), in `x`'s dtype."""
    aval = aval_of(x)
    return np.eye(aval.shape[-1] if n is None else n, dtype=aval.dtype)


def triangle(x: Any, lower: bool, strict: bool = False) -> Any:
    """The lower (or upper) triangle of the matrices in `x`, zeros elsewhere; `strict`
    drops the diagonal too."""
    n = aval_of(x).shape[-1]
    m = aval_of(x).shape[-2]
    mask = np.tri(m, n, k=-1 if strict else 0, dtype=bool)
    return where(mask if lower else ~np.tri(m, n, k=0 if strict else -1, dtype=bool), x, 0.0)


def symmetrize(x: Any) -> Any:
    """(x + x^T) / 2."""
    return (x + mT(x)) * 0.5


def from_triangle(a: Any, lower: bool = True) -> Any:
    """The symmetric matrix that the lower (or upper) triangle of `a` describes: what LAPACK
    reads when it is told the input is symmetric, so values match NumPy's and the gradient
    lands on the triangle that was read."""
    return triangle(a, lower) + mT(triangle(a, lower, strict=True))


def diagonal_of(x: Any) -> Any:
    """The diagonals of the (square) matrices in `x`, shape x.shape[:-1]."""
    return sum(x * eye_like(x), axis=-1)


def diag_embed(v: Any) -> Any:
    """Square matrices with `v`'s last axis on their diagonals."""
    n = aval_of(v).shape[-1]
    return reshape(v, aval_of(v).shape + (1,)) * np.eye(n, dtype=aval_of(v).dtype)


def batch_shape(aval: Aval) -> tuple[int, ...]:
    return aval.shape[:-2]


def pack_arrays(parts: Sequence[np.ndarray], batch: tuple[int, ...]) -> np.ndarray:
    """NumPy side of a decomposition with several results: one array of shape
    batch + (total,), each result flattened over its own axes, in order."""
    flat = [np.reshape(p, batch + (math.prod(p.shape[len(batch) :]),)) for p in parts]
    return np.concatenate(flat, axis=-1)


def unpack(x: Any, batch: tuple[int, ...], shapes: Sequence[tuple[int, ...]]) -> list[Any]:
    """The results packed by `pack_arrays` (or tangents and cotangents of that shape)."""
    parts, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        index = tuple((0, d, 1) for d in batch) + ((start, start + size, 1),)
        parts.append(reshape(slice_array(x, index), batch + tuple(shape)))
        start += size
    return parts


def pack(parts: Sequence[Any], batch: tuple[int, ...]) -> Any:
    """The traced counterpart of `pack_arrays` (for tangents)."""
    flat = [reshape(p, batch + (math.prod(aval_of(p).shape[len(batch) :]),)) for p in parts]
    return concatenate(flat, axis=-1)


def expand_last2(x: Any) -> Any:
    return reshape(x, aval_of(x).shape + (1, 1))


# ---------------------------------------------------------------- records
# Special points: a general matrix, one with a negative determinant, 1 x 1, a stack, and
# for the symmetric positive definite ones (Cholesky) their like.
_A = np.array([[2.0, 0.5, -1.0], [0.25, 3.0, 0.5], [-0.5, 1.0, 1.5]])
_NEG = np.array([[0.5, 2.0], [1.5, -1.0]])
_STACK = np.stack([_NEG, _NEG.T * 2])
_SQUARES = (at(_A), at(_NEG), at(np.array([[2.5]])), at(_STACK))
_B = np.array([[1.0, -0.5], [0.25, 2.0], [-1.5, 0.75]])
_SPD = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]])


def _float_eval(*avals: Aval, fn: str) -> None:
    dtypes = {a.dtype for a in avals}
    if len(dtypes) != 1 or next(iter(dtypes)).kind != "f":
        raise TypeError(f"{fn} needs operands of one float dtype, got {[str(a) for a in avals]}")


def _solve_eval(a: Aval, b: Aval) -> Aval:
    _float_eval(a, b, fn="solve")
    n = check_square(a, "solve")
    if b.ndim != a.ndim or b.shape[:-2] != a.shape[:-2] or b.shape[-2] != n:
        raise ValueError(f"solve: shapes {a.shape} and {b.shape} do not align")
    return Aval(b.shape, b.dtype)


def _solve_vjp(g: Any, out: Any, a: Any, b: Any) -> tuple[Any, Any]:
    gb = _solve(mT(a), g)
    return -matmul(gb, mT(out)), gb


def _solve_jvp(t: Any, out: Any, a: Any, b: Any) -> Any:
    rhs = tangent_sum(t, lambda ta: -matmul(ta, out), lambda tb: tb)
    return _solve(a, rhs)


SOLVE = register(
    Primitive(
        "solve",
        _solve_eval,
        np.linalg.solve,
        _solve_vjp,
        _solve_jvp,
        batch=batch_stacked("solve"),
        special_points=(at(_A, _B), at(_NEG, _NEG.T), at(_STACK, _STACK[:, :, :1])),
    )
)


def _unary_square_eval(fn: str, shape: Any) -> Any:
    def abstract_eval(a: Aval) -> Aval:
        _float_eval(a, fn=fn)
        n = check_square(a, fn)
        return Aval(shape(a.shape, n), a.dtype)

    return abstract_eval


INV = register(
    Primitive(
        "inv",
        _unary_square_eval("inv", lambda s, n: s),
        np.linalg.inv,
        lambda g, out, a: (-matmul(matmul(mT(out), g), mT(out)),),
        lambda t, out, a: -matmul(matmul(out, t[0]), out),
        batch=batch_stacked("inv"),
        special_points=_SQUARES,
    )
)


def _slogdet_impl(a: np.ndarray) -> np.ndarray:
    sign, logabsdet = np.linalg.slogdet(a)
    return np.stack([sign, logabsdet], axis=-1)


def _inverse_transposed(out: Any, a: Any) -> Any:
    """log|det(a)|'s gradient, inv(a)^T; nan where `a` is singular (the sign in `out` is 0,
    log|det| is -inf, and every derivative of it diverges), at every order and in every
    mode. inv runs on the identity there. Reverse mode sends nothing back through the
    branch `where` leaves out, so the nan is tied to `a` by a function whose derivatives of
    every order depend on `a` (sin): nan times it is nan at every order where `a` is
    singular, and 0 elsewhere (tests/test_conventions.py, det-at-singular-matrices)."""
    sign, _ = unpack(out, aval_of(a).shape[:-2], [(), ()])
    singular = expand_last2(sign == 0)
    dtype = aval_of(a).dtype
    eye = np.eye(aval_of(a).shape[-1], dtype=dtype)
    undefined = where(singular, dtype.type(math.nan), dtype.type(0)) * sin(a)
    return mT(inv(where(singular, eye, a))) + undefined


def _slogdet_vjp(g: Any, out: Any, a: Any) -> tuple[Any]:
    # The sign is piecewise constant: only log|det| carries a gradient, A^-T.
    _, g_log = unpack(g, aval_of(a).shape[:-2], [(), ()])
    return (expand_last2(g_log) * _inverse_transposed(out, a),)


def _slogdet_jvp(t: Any, out: Any, a: Any) -> Any:
    t_log = sum(_inverse_transposed(out, a) * t[0], axis=(-2, -1))
    return pack([zeros_like(t_log), t_log], aval_of(a).shape[:-2])


SLOGDET = register(
    Primitive(
        "slogdet",
        _unary_square_eval("slogdet", lambda s, n: s[:-2] + (2,)),
        _slogdet_impl,
        _slogdet_vjp,
        _slogdet_jvp,
        format=lambda args, params: f"slogdet({args[0]})  # (sign, log|det|)",
        batch=batch_stacked("slogdet"),
        special_points=_SQUARES,
    )
)


def _phi(x: Any) -> Any:
    """The lower triangle of `x` with its diagonal halved (the Cholesky derivative's map)."""
    n = aval_of(x).shape[-1]
    return x * (np.tri(n, k=-1) + 0.5 * np.eye(n)).astype(aval_of(x).dtype)


def _cholesky_jvp(t: Any, out: Any, s: Any) -> Any:
    # S = L L^T: dL = L phi(L^-1 dS L^-T), with dS symmetric.
    x = _tri_solve(out, mT(_tri_solve(out, symmetrize(t[0]), lower=True)), lower=True)
    return matmul(out, _phi(x))


def _cholesky_vjp(g: Any, out: Any, s: Any) -> tuple[Any]:
    # The transpose of _cholesky_jvp: L^-T phi(L^T g) L^-1, symmetrized.
    y = _tri_solve(out, _phi(matmul(mT(out), g)), lower=True, transpose=True)
    return (symmetrize(mT(_tri_solve(out, mT(y), lower=True, transpose=True))),)


# The input is symmetric (the function `cholesky` makes it so); the rules are those of
# chol((S + S^T) / 2), which equals NumPy's value on symmetric S.
CHOLESKY = register(
    Primitive(
        "cholesky",
        _unary_square_eval("cholesky", lambda s, n: s),
        np.linalg.cholesky,
        _cholesky_vjp,
        _cholesky_jvp,
        batch=batch_stacked("cholesky"),
        special_points=(at(_SPD), at(np.array([[2.25]])), at(np.stack([_SPD, _SPD * 0.5]))),
    )
)


# Up to this size a triangular solve runs as NumPy's batched LU solve of the triangle (one
# call into C for the whole batch; LU of a triangular matrix is as accurate); above it
# LAPACK's triangular solve, matrix by matrix, whose O(n^2) per right-hand side then wins.
# Per call SciPy's wrapper costs ~60 us, and its OpenBLAS threads up to milliseconds on a
# loaded machine, against ~10 us for NumPy's solve of a small batch.
SMALL_TRIANGULAR = 64


def _tri_solve_impl(
    a: np.ndarray, b: np.ndarray, *, lower: bool, transpose: bool, unit_diagonal: bool
) -> np.ndarray:
    # Batch axes are equal (see _solve_eval).
    tri = np.tril(a) if lower else np.triu(a)
    n = a.shape[-1]
    if unit_diagonal:
        tri[..., np.arange(n), np.arange(n)] = 1
    diag = np.diagonal(tri, axis1=-2, axis2=-1)
    if np.any(diag == 0):
        raise np.linalg.LinAlgError(
            f"singular matrix: a zero on the diagonal of a triangular matrix (index "
            f"{int(np.argwhere(diag == 0)[0][-1])})"
        )
    if n <= SMALL_TRIANGULAR or b.size == 0:
        return np.linalg.solve(np.swapaxes(tri, -1, -2) if transpose else tri, b)
    out = np.empty(b.shape, np.result_type(a, b))
    flat_a, flat_b = a.reshape((-1, n, n)), b.reshape((-1,) + b.shape[-2:])
    import scipy.linalg  # here, not at import: importing it costs more than all of fastgrad

    (trtrs,) = scipy.linalg.get_lapack_funcs(("trtrs",), (flat_a, flat_b))
    for i, x in enumerate(out.reshape(flat_b.shape)):
        x[...], _ = trtrs(
            flat_a[i], flat_b[i], lower=lower, trans=int(transpose), unitdiag=unit_diagonal
        )
    return out


def _tri_solve_eval(a: Aval, b: Aval, *, lower: bool, transpose: bool, unit_diagonal: bool) -> Aval:
    return _solve_eval(a, b)


def _read_triangle(a: Any, lower: bool, unit_diagonal: bool) -> Any:
    """The part of `a` a triangular solve reads."""
    return triangle(a, lower, strict=unit_diagonal)


def _tri_solve_vjp(
    g: Any, out: Any, a: Any, b: Any, *, lower: bool, transpose: bool, unit_diagonal: bool
) -> tuple[Any, Any]:
    gb = _tri_solve(a, g, lower, not transpose, unit_diagonal)
    ga = -matmul(out, mT(gb)) if transpose else -matmul(gb, mT(out))
    return _read_triangle(ga, lower, unit_diagonal), gb


def _tri_solve_jvp(
    t: Any, out: Any, a: Any, b: Any, *, lower: bool, transpose: bool, unit_diagonal: bool
) -> Any:
    def from_a(ta: Any) -> Any:
        ta = _read_triangle(ta, lower, unit_diagonal)
        return -matmul(mT(ta) if transpose else ta, out)

    return _tri_solve(a, tangent_sum(t, from_a, lambda tb: tb), lower, transpose, unit_diagonal)


TRIANGULAR_SOLVE = register(
    Primitive(
        "triangular_solve",
        _tri_solve_eval,
        _tri_solve_impl,
        _tri_solve_vjp,
        _tri_solve_jvp,
        batch=batch_stacked("triangular_solve"),
        special_points=tuple(
            at(_A, _B, lower=lo, transpose=tr, unit_diagonal=unit)
            for lo, tr, unit in ((True, False, False), (False, True, False), (True, True, True))
        ),
    )
)

# ---------------------------------------------------------------- the functions rules use


def _solve(a: Any, b: Any) -> Any:
    return bind(SOLVE, a, b)


def _tri_solve(
    a: Any, b: Any, lower: bool, transpose: bool = False, unit_diagonal: bool = False
) -> Any:
    return bind(
        TRIANGULAR_SOLVE,
        a,
        b,
        lower=bool(lower),
        transpose=bool(transpose),
        unit_diagonal=bool(unit_diagonal),
    )


def _broadcast_rhs(a: Any, b: Any, fn: str) -> tuple[Any, Any, bool]:
    """`a` and `b` with batch axes broadcast; a 1-D `b` is one vector (NumPy 2's rule) and
    becomes a column. Returns (a, b, whether b was a vector)."""
    av, bv = aval_of(a), aval_of(b)
    n = check_square(av, fn)
    vector = bv.ndim == 1
    if vector:
        b = reshape(b, (bv.shape[0], 1))
    elif bv.ndim < 1:
        raise ValueError(f"{fn}: b must be at least 1-D, got shape {bv.shape}")
    bs = aval_of(b).shape
    if bs[-2] != n:
        raise ValueError(
            f"{fn}: a has shape {av.shape} and b shape {bv.shape}: b's "
            f"{'length' if vector else 'second-to-last axis'} must be {n}"
        )
    batch = broadcast_shapes(av.shape[:-2], bs[:-2], what=f"{fn} batch axes")
    return broadcast_to(a, batch + (n, n)), broadcast_to(b, batch + bs[-2:]), vector


def _drop_column(x: Any, vector: bool) -> Any:
    return reshape(x, aval_of(x).shape[:-1]) if vector else x


# ---------------------------------------------------------------- functions


def solve(a: Any, b: Any) -> Any:
    """The solution x of a @ x = b (NumPy's ``linalg.solve``), batched over leading axes.

    A 1-D `b` is one right-hand side; otherwise `b` holds matrices (..., n, k). A singular
    `a` raises NumPy's LinAlgError.

    >>> solve(np.array([[2.0, 0.0], [0.0, 4.0]]), np.array([1.0, 1.0]))
    array([0.5 , 0.25])
    """
    a, b = as_float_arrays(a, b, fn="solve")
    a, b, vector = _broadcast_rhs(a, b, "solve")
    return _drop_column(_solve(a, b), vector)


def inv(a: Any) -> Any:
    """The inverse of each square matrix in `a` (NumPy's ``linalg.inv``).

    >>> inv(np.array([[2.0, 0.0], [0.0, 4.0]]))
    array([[0.5 , 0.  ],
           [0.  , 0.25]])
    """
    (a,) = as_float_arrays(a, fn="inv")
    check_square(aval_of(a), "inv")
    return bind(INV, a)


def slogdet(a: Any) -> Any:
    """(sign, log|det|) of each square matrix in `a`; only log|det| has a gradient.

    >>> sign, logabsdet = slogdet(np.array([[-2.0, 0.0], [0.0, 3.0]]))
    >>> float(sign), round(float(logabsdet), 6)
    (-1.0, 1.791759)
    """
    (a,) = as_float_arrays(a, fn="slogdet")
    check_square(aval_of(a), "slogdet")
    sign, logabsdet = unpack(bind(SLOGDET, a), aval_of(a).shape[:-2], [(), ()])
    return SlogdetResult(sign, logabsdet)


def cholesky(a: Any, upper: bool = False) -> Any:
    """The lower Cholesky factor L (a = L L^T) of each symmetric positive definite matrix.

    As in NumPy only the lower triangle of `a` is read, so the gradient lands there; a
    matrix that is not positive definite raises NumPy's LinAlgError. `upper=True` gives
    L^T.

    >>> cholesky(np.array([[4.0, 2.0], [2.0, 5.0]]))
    array([[2., 0.],
           [1., 2.]])
    """
    (a,) = as_float_arrays(a, fn="cholesky")
    check_square(aval_of(a), "cholesky")
    factor = bind(CHOLESKY, from_triangle(a, lower=True))
    return mT(factor) if upper else factor


def scipy_cholesky(
    a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True
) -> Any:
    """SciPy's ``linalg.cholesky``: the upper factor U (a = U^T U) by default, the lower one
    with `lower=True`. Only that triangle of `a` is read; `overwrite_a` and `check_finite`
    have no effect.

    >>> scipy_cholesky(np.array([[4.0, 2.0], [2.0, 5.0]]))
    array([[2., 1.],
           [0., 2.]])
    """
    if lower:
        return cholesky(a)
    (a,) = as_float_arrays(a, fn="cholesky")
    check_square(aval_of(a), "cholesky")
    return mT(bind(CHOLESKY, from_triangle(a, lower=False)))


def solve_triangular(
    a: Any,
    b: Any,
    trans: int | str = 0,
    lower: bool = False,
    unit_diagonal: bool = False,
    overwrite_b: bool = False,
    check_finite: bool = True,
) -> Any:
    """SciPy's ``linalg.solve_triangular``: x with op(a) @ x = b, a triangular (only its
    lower or upper triangle is read; upper by default, as in SciPy), batched over leading
    axes. `trans` is 0/'N' (a), 1/'T' or 2/'C' (a^T, the same for real input). A zero on
    the diagonal raises SciPy's LinAlgError. `overwrite_b` and `check_finite` are accepted
    for compatibility and have no effect.

    >>> solve_triangular(np.array([[2.0, 0.0], [1.0, 1.0]]), np.array([2.0, 3.0]), lower=True)
    array([1., 2.])
    """
    transpose = {0: False, "N": False, 1: True, "T": True, 2: True, "C": True}.get(trans)
    if transpose is None:
        raise ValueError(f"solve_triangular: trans must be 0, 1, 2, 'N', 'T' or 'C', not {trans!r}")
    a, b = as_float_arrays(a, b, fn="solve_triangular")
    a, b, vector = _broadcast_rhs(a, b, "solve_triangular")
    return _drop_column(_tri_solve(a, b, lower, transpose, unit_diagonal), vector)


def cho_factor(
    a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True
) -> tuple[Any, bool]:
    """SciPy's ``linalg.cho_factor``: (c, lower) with the Cholesky factor in the lower (or,
    by default, upper) triangle of c, for `cho_solve`. The other triangle of c holds zeros
    (SciPy leaves arbitrary values there).

    >>> c, low = cho_factor(np.array([[4.0, 2.0], [2.0, 5.0]]), lower=True)
    >>> c, low
    (array([[2., 0.],
           [1., 2.]]), True)
    """
    factor = cholesky(a)
    return (factor if lower else mT(factor)), bool(lower)


def cho_solve(
    c_and_lower: tuple[Any, bool], b: Any, overwrite_b: bool = False, check_finite: bool = True
) -> Any:
    """SciPy's ``linalg.cho_solve``: x with a @ x = b, given `cho_factor(a)`; two triangular
    solves. Only the factor's triangle of c is read.

    >>> cf = cho_factor(np.array([[4.0, 2.0], [2.0, 5.0]]))
    >>> cho_solve(cf, np.array([6.0, 7.0]))
    array([1., 1.])
    """
    c, lower = c_and_lower
    # a = L L^T: solve L y = b, then L^T x = y (with U = L^T when the factor is upper).
    y = solve_triangular(c, b, trans=0 if lower else 1, lower=lower)
    return solve_triangular(c, y, trans=1 if lower else 0, lower=lower)
