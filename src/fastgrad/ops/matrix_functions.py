"""Norms and the linear-algebra functions NumPy builds from products and decompositions:
norm, vector_norm, matrix_norm, cond, matrix_rank, lstsq, matrix_power, multi_dot,
tensorsolve and tensorinv.

All are compositions of fastgrad.ops.linalg, .decompositions, .products and .reduction, so
their derivatives come from those records. Public under fastgrad.numpy.linalg.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, normalize_axis, reshape, sum
from fastgrad.ops.decompositions import pinv, svdvals
from fastgrad.ops.elementwise import abs, not_equal, where
from fastgrad.ops.linalg import as_float_arrays, check_square, eye_like, inv, solve
from fastgrad.ops.math import power, sqrt
from fastgrad.ops.products import matmul
from fastgrad.ops.reduction import max, min
from fastgrad.ops.shape import broadcast_to, expand_dims, transpose, zeros_like

__all__: list[str] = []  # public under fastgrad.numpy.linalg

_INF = float("inf")


def _float(x: Any, fn: str) -> Any:
    (x,) = as_float_arrays(x, fn=fn, names=("x",))
    return x


def _euclidean(x: Any, axis: Any, keepdims: bool) -> Any:
    """sqrt(sum(x^2)), with gradient 0 (a subgradient) rather than NaN where x is all zero."""
    total = sum(x * x, axis=axis, keepdims=keepdims)
    zero = total == 0
    return where(zero, 0.0, sqrt(where(zero, 1.0, total)))


def _vector_norm(x: Any, ord: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    if ord is None or ord == 2:
        return _euclidean(x, axis, keepdims)
    if isinstance(ord, str):
        raise ValueError(f"norm: ord {ord!r} is a matrix norm; a vector norm takes a number")
    if ord == _INF:
        return max(abs(x), axis=axis, keepdims=keepdims)
    if ord == -_INF:
        return min(abs(x), axis=axis, keepdims=keepdims)
    if ord == 0:  # the count of nonzeros: piecewise constant, no gradient
        return astype(sum(not_equal(x, 0), axis=axis, keepdims=keepdims), aval_of(x).dtype)
    if ord == 1:
        return sum(abs(x), axis=axis, keepdims=keepdims)
    p = float(ord)
    return power(sum(power(abs(x), p), axis=axis, keepdims=keepdims), 1.0 / p)


def _to_end(x: Any, row: int, col: int) -> Any:
    rest = [i for i in range(aval_of(x).ndim) if i not in (row, col)]
    return transpose(x, rest + [row, col])


def _matrix_norm(x: Any, ord: Any, row: int, col: int, keepdims: bool) -> Any:
    if ord is None or ord == "fro":
        out = _euclidean(x, (row, col), keepdims=False)
    elif ord == "nuc":
        out = sum(svdvals(_to_end(x, row, col)), axis=-1)
    elif ord in (2, -2):
        s = svdvals(_to_end(x, row, col))
        out = max(s, axis=-1) if ord == 2 else min(s, axis=-1)
    elif ord in (1, -1, _INF, -_INF):
        # 1: the largest column sum; inf: the largest row sum (of absolute values).
        summed, other = (row, col) if ord in (1, -1) else (col, row)
        sums = sum(abs(x), axis=summed, keepdims=True)
        out = (max if ord > 0 else min)(sums, axis=other, keepdims=True)
        out = reshape(out, tuple(d for i, d in enumerate(aval_of(x).shape) if i not in (row, col)))
    else:
        raise ValueError(f"norm: invalid ord {ord!r} for a matrix norm")
    if keepdims:
        out = expand_dims(out, tuple(sorted((row, col))))
    return out


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:
    """NumPy's ``linalg.norm``: vector norms (ord None/2, 1, inf, -inf, 0, any p) over one
    axis, matrix norms (None/'fro', 'nuc', 1, -1, 2, -2, inf, -inf) over two. With
    axis=None and ord=None the 2-norm of all elements. The 2-norm's gradient at zero is 0.

    >>> float(norm(np.array([3.0, 4.0])))
    5.0
    >>> float(norm(np.array([[1.0, -2.0], [3.0, 4.0]]), ord=1))
    6.0
    """
    x = _float(x, "norm")
    ndim = aval_of(x).ndim
    if axis is None:
        if ord is None:
            return _euclidean(x, tuple(range(ndim)), keepdims)
        if ndim not in (1, 2):
            raise ValueError(
                f"norm: an ord needs a 1-D or 2-D input or an axis, got {ndim}-D; pass axis"
            )
        axis = tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
    if len(axes) == 1:
        return _vector_norm(x, ord, normalize_axis(axes, ndim, "norm axis"), keepdims)
    if len(axes) == 2:
        # Kept in the order given: it says which axis holds rows (ord=1 sums along them).
        row, col = (normalize_axis(a, ndim, "norm axis")[0] for a in axes)
        if row == col:
            raise ValueError(f"norm: axis {axis!r} repeats an axis")
        return _matrix_norm(x, ord, row, col, keepdims)
    raise ValueError(f"norm: axis must name one or two axes, got {axis!r}")


def vector_norm(x: Any, /, *, axis: Any = None, keepdims: bool = False, ord: Any = 2) -> Any:
    """NumPy 2's ``linalg.vector_norm``: a vector norm over `axis` (all axes when None).

    >>> float(vector_norm(np.ones((2, 2)), ord=1))
    4.0
    """
    x = _float(x, "vector_norm")
    axes = normalize_axis(axis, aval_of(x).ndim, "vector_norm axis")
    return _vector_norm(x, ord, axes, keepdims)


def matrix_norm(x: Any, /, *, keepdims: bool = False, ord: Any = "fro") -> Any:
    """NumPy 2's ``linalg.matrix_norm``: a matrix norm over the last two axes.

    >>> float(matrix_norm(np.eye(2), ord="nuc"))
    2.0
    """
    x = _float(x, "matrix_norm")
    ndim = aval_of(x).ndim
    if ndim < 2:
        raise ValueError(f"matrix_norm needs at least 2-D input, got {ndim}-D")
    return _matrix_norm(x, ord, ndim - 2, ndim - 1, keepdims)


def cond(x: Any, p: Any = None) -> Any:
    """The condition number of each square (for p=None or ±2, any) matrix in `x`, in the
    norm `p` (NumPy's ``linalg.cond``).

    >>> float(cond(np.diag([1.0, 4.0])))
    4.0
    """
    x = _float(x, "cond")
    if p is None or p in (2, -2):
        s = svdvals(x)
        ratio = max(s, axis=-1) / min(s, axis=-1)
        return ratio if p != -2 else 1.0 / ratio
    check_square(aval_of(x), "cond")
    return norm(x, p, axis=(-2, -1)) * norm(inv(x), p, axis=(-2, -1))


def matrix_rank(A: Any, tol: Any = None, hermitian: bool = False, *, rtol: Any = None) -> Any:  # noqa: N803
    """The number of singular values above `tol` (by default NumPy's: the largest one times
    max(M, N) times the dtype's epsilon, or `rtol` times the largest). An integer: it has
    no gradient.

    >>> int(matrix_rank(np.array([[1.0, 2.0], [2.0, 4.0]])))
    1
    """
    a = _float(A, "matrix_rank")
    if aval_of(a).ndim < 2:
        return astype(sum(not_equal(a, 0)) > 0, np.int64)
    s = svdvals(a)
    if tol is None:
        m, n = aval_of(a).shape[-2:]
        rel = np.finfo(aval_of(a).dtype).eps * builtins.max(m, n) if rtol is None else rtol
        tol = max(s, axis=-1, keepdims=True) * rel if m and n else 0.0
    else:
        tol = expand_dims(tol, -1) if isinstance(tol, Tracer) else np.expand_dims(tol, -1)
    return sum(s > tol, axis=-1)


def lstsq(a: Any, b: Any, rcond: Any = None) -> tuple[Any, Any, Any, Any]:
    """The least-squares solution of a @ x = b (NumPy's ``linalg.lstsq``): returns (x,
    residuals, rank, singular values). x is pinv(a) @ b, the minimum-norm solution, with
    singular values at most rcond times the largest counted as zero (by default the
    dtype's epsilon times max(M, N)). Unlike NumPy, `residuals` (the squared residual norm
    per column of b) is always computed, also when a is rank-deficient or M <= N, where
    NumPy returns an empty array: its shape cannot depend on traced values.

    >>> x, res, rank, s = lstsq(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
    ...                         np.array([1.0, 2.0, 4.0]))
    >>> x, res, int(rank)
    (array([1.33333333, 2.33333333]), array([0.33333333]), 2)
    """
    a, b = as_float_arrays(a, b, fn="lstsq")
    av, bv = aval_of(a), aval_of(b)
    if av.ndim != 2 or bv.ndim not in (1, 2) or bv.shape[0] != av.shape[0]:
        raise ValueError(
            f"lstsq: a must be 2-D (M, N) and b (M,) or (M, K), got {av.shape} and {bv.shape}"
        )
    m, n = av.shape
    if rcond is None:
        rcond = np.finfo(av.dtype).eps * builtins.max(m, n)
    x = matmul(pinv(a, rcond=float(rcond)), b)
    r = b - matmul(a, x)
    residuals = sum(r * r, axis=0)
    if bv.ndim == 1:
        residuals = reshape(residuals, (1,))
    s = svdvals(a)
    rank = sum(s > max(s) * rcond) if m and n else np.int64(0)
    return x, residuals, rank, s


def matrix_power(a: Any, n: int) -> Any:
    """The n-th power of each square matrix in `a` by repeated squaring (NumPy's
    ``linalg.matrix_power``); a negative n inverts first.

    >>> matrix_power(np.array([[1.0, 1.0], [0.0, 1.0]]), 3)
    array([[1., 3.],
           [0., 1.]])
    """
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"matrix_power: n must be an integer, got {n!r}") from None
    a = a if isinstance(a, Tracer) else np.asarray(a)
    check_square(aval_of(a), "matrix_power")
    if n < 0:
        a, n = inv(a), -n
    if n == 0:
        return zeros_like(a) + broadcast_to(eye_like(a), aval_of(a).shape)
    result, square = None, a
    while n:
        if n & 1:
            result = square if result is None else matmul(result, square)
        n >>= 1
        if n:
            square = matmul(square, square)
    return result


def _chain_order(dims: Sequence[int]) -> list[list[int]]:
    """split[i][j]: where the cheapest product of matrices i..j splits (matrix chain order:
    matrix k has shape dims[k] x dims[k + 1])."""
    count = len(dims) - 1
    cost = [[0] * count for _ in range(count)]
    split = [[0] * count for _ in range(count)]
    for length in range(1, count):
        for i in range(count - length):
            j = i + length
            cost[i][j] = -1
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if cost[i][j] < 0 or c < cost[i][j]:
                    cost[i][j], split[i][j] = c, k
    return split


def multi_dot(arrays: Sequence[Any], *, out: Any = None) -> Any:
    """The product of two or more matrices in the cheapest order (NumPy's
    ``linalg.multi_dot``); the first may be 1-D (a row) and the last 1-D (a column).

    >>> multi_dot([np.ones(2), np.eye(2), np.array([1.0, 2.0])])
    array(3.)
    """
    if out is not None:
        raise TypeError("multi_dot: out= is not supported; use the returned value")
    arrays = [x if isinstance(x, Tracer) else np.asarray(x) for x in arrays]
    if len(arrays) < 2:
        raise ValueError("multi_dot needs at least two arrays")
    first_1d, last_1d = aval_of(arrays[0]).ndim == 1, aval_of(arrays[-1]).ndim == 1
    if first_1d:
        arrays[0] = reshape(arrays[0], (1, -1))
    if last_1d:
        arrays[-1] = reshape(arrays[-1], (-1, 1))
    for i, x in enumerate(arrays):
        if aval_of(x).ndim != 2:
            raise ValueError(
                f"multi_dot: array {i} must be 2-D (the first and last may be 1-D), got shape "
                f"{aval_of(x).shape}"
            )
    dims = [aval_of(arrays[0]).shape[0]] + [aval_of(x).shape[1] for x in arrays]
    split = _chain_order(dims)

    def product(i: int, j: int) -> Any:
        if i == j:
            return arrays[i]
        k = split[i][j]
        return matmul(product(i, k), product(k + 1, j))

    result = product(0, len(arrays) - 1)
    shape = aval_of(result).shape
    return reshape(result, shape[1 if first_1d else 0 : 1 if last_1d else 2])


def tensorsolve(a: Any, b: Any, axes: Any = None) -> Any:
    """The x with ``tensordot(a, x, x.ndim) == b`` (``numpy.linalg.tensorsolve``): `a`
    (with the axes in `axes` moved to the end first) is read as a square matrix.

    >>> tensorsolve(np.eye(4).reshape(2, 2, 4) * 2, np.ones((2, 2))).shape
    (4,)
    """
    a, b = as_float_arrays(a, b, fn="tensorsolve")
    if axes is not None:
        rest = [k for k in range(a.ndim) if k not in normalize_axis(axes, a.ndim)]
        a = transpose(a, rest + list(normalize_axis(axes, a.ndim)))
    x_shape = a.shape[b.ndim :]
    rows, cols = math.prod(a.shape[: b.ndim]), math.prod(x_shape)
    if a.shape[: b.ndim] != b.shape or rows != cols:
        raise ValueError(
            f"tensorsolve: a of shape {a.shape} must start with b's shape {b.shape} and the "
            "rest must hold as many elements"
        )
    return reshape(solve(reshape(a, (rows, cols)), reshape(b, (rows,))), x_shape)


def tensorinv(a: Any, ind: int = 2) -> Any:
    """The inverse of `a` read as a matrix from its first `ind` axes to the others
    (``numpy.linalg.tensorinv``): its shape is a.shape[ind:] + a.shape[:ind].

    >>> tensorinv(np.eye(4).reshape(4, 2, 2), ind=1).shape
    (2, 2, 4)
    """
    (a,) = as_float_arrays(a, fn="tensorinv")
    ind = operator.index(ind)
    if ind <= 0:
        raise ValueError(f"tensorinv: ind must be positive, got {ind}")
    rows, cols = math.prod(a.shape[:ind]), math.prod(a.shape[ind:])
    if rows != cols:
        raise ValueError(
            f"tensorinv: a of shape {a.shape} is not square from its first {ind} axes on"
        )
    return reshape(inv(reshape(a, (rows, cols))), a.shape[ind:] + a.shape[:ind])
