"""trace(f(A)) of a symmetric matrix, with exact second derivatives at repeated eigenvalues.

`spectral_sum(a, fn)` is sum(f(eigvalsh(a))) = trace(f(a)) for an f among FUNCTIONS. Its
gradient is the matrix function f'(a) = V f'(L) V^T (the `spectral_map` op, k = 1), whose
derivative along E is V (D ∘ V^T E V) V^T with the divided differences of f'
(Daleckii-Krein): D_ij = (f'(l_i) - f'(l_j)) / (l_i - l_j), f''(l_i) where the values tie.
That holds at repeated eigenvalues too, where the same function written through eigvalsh
has a nan Hessian (docs/conventions.md, the note on repeated eigenvalues). The third
derivative goes through the eigenvectors: exact where the eigenvalues are distinct, nan at
a tie.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, at, register
from fastgrad.core.tracing import aval_of, bind
from fastgrad.ops import spectral_ties as ties
from fastgrad.ops.base import batch_stacked, reshape, sum
from fastgrad.ops.decompositions import _eigh_parts as eigh_parts
from fastgrad.ops.elementwise import where
from fastgrad.ops.linalg import check_square, mT, symmetrize
from fastgrad.ops.math import exp, log
from fastgrad.ops.products import matmul

__all__: list[str] = []  # public as fastgrad.numpy.linalg.spectral_sum

# f and its first three derivatives, on arrays (plain or traced).
FUNCTIONS: dict[str, tuple[Callable[[Any], Any], ...]] = {
    "exp": (exp, exp, exp, exp),
    "square": (lambda x: x * x, lambda x: 2.0 * x, lambda x: 0.0 * x + 2.0, lambda x: 0.0 * x),
    "log": (log, lambda x: 1.0 / x, lambda x: -1.0 / (x * x), lambda x: 2.0 / (x * x * x)),
}


def _check(a: Aval, fn: str, k: int, what: str) -> int:
    if a.dtype.kind != "f":
        raise TypeError(f"{what} needs a float operand, got {a}")
    if fn not in FUNCTIONS:
        raise ValueError(f"{what}: fn must be one of {sorted(FUNCTIONS)}, got {fn!r}")
    if not 0 <= k <= 2:
        raise ValueError(f"{what}: k (the derivative of fn) must be 0, 1 or 2, got {k}")
    return check_square(a, what)


def _divided(w: Any, fn: str, k: int) -> Any:
    """(..., n, n): the divided differences of f^(k) at the values w, f^(k+1) on ties."""
    shape = aval_of(w).shape
    n = shape[-1]
    fk, fk1 = FUNCTIONS[fn][k](w), FUNCTIONS[fn][k + 1](w)
    row, col = shape[:-1] + (1, n), shape + (1,)
    if n == 0:  # nothing ties (and the tolerance's max has nothing to reduce)
        return reshape(fk, row) - reshape(fk, col)
    tied = ties.ties(w)
    step = where(tied, 1.0, reshape(w, row) - reshape(w, col))
    slope = (reshape(fk, row) - reshape(fk, col)) / step
    return where(tied, (reshape(fk1, row) + reshape(fk1, col)) * 0.5, slope)


def _frechet(t: Any, a: Any, fn: str, k: int) -> Any:
    """The derivative of f^(k)(a) along the symmetric part of t: V (D ∘ V^T t V) V^T (also
    its own transpose, the VJP)."""
    w, v = eigh_parts(a)
    x = matmul(matmul(mT(v), symmetrize(t)), v)
    return matmul(matmul(v, _divided(w, fn, k) * x), mT(v))


def _map_eval(a: Aval, *, fn: str, k: int) -> Aval:
    _check(a, fn, k, "spectral_map")
    return Aval(a.shape, a.dtype)


def _map_impl(a: np.ndarray, *, fn: str, k: int) -> np.ndarray:
    w, v = np.linalg.eigh(a)
    return ((v * np.asarray(FUNCTIONS[fn][k](w))[..., None, :]) @ np.swapaxes(v, -1, -2)).astype(
        a.dtype, copy=False
    )


# Special points: distinct eigenvalues (positive for log), 1 x 1, a stack. Repeated ones are
# tested in tests/test_conventions.py (test_decomposition_signs): exact at order 2 there.
_A = np.array([[2.0, 0.5, -0.25], [0.5, 3.0, 0.5], [-0.25, 0.5, 1.5]])
_POINTS = (at(_A, fn="exp"), at(_A, fn="square"), at(_A, fn="log"), at(np.array([[0.75]]),
           fn="log"), at(np.stack([_A[:2, :2], _A[1:, 1:] * 0.5]), fn="exp"))  # fmt: skip
SPECTRAL_MAP = register(
    Primitive(
        "spectral_map", _map_eval, _map_impl,
        lambda g, out, a, *, fn, k: (_frechet(g, a, fn, k),),
        lambda t, out, a, *, fn, k: _frechet(t[0], a, fn, k),
        batch=batch_stacked("spectral_map"),
        special_points=tuple(at(*p.args, **p.params, k=k) for p in _POINTS for k in (0, 1)),
    )
)  # fmt: skip


def _sum_eval(a: Aval, *, fn: str) -> Aval:
    _check(a, fn, 0, "spectral_sum")
    return Aval(a.shape[:-2], a.dtype)


def _sum_impl(a: np.ndarray, *, fn: str) -> np.ndarray:
    return np.asarray(np.sum(FUNCTIONS[fn][0](np.linalg.eigvalsh(a)), axis=-1), dtype=a.dtype)


def _gradient(a: Any, fn: str) -> Any:
    return bind(SPECTRAL_MAP, a, fn=fn, k=1)


SPECTRAL_SUM = register(
    Primitive(
        "spectral_sum", _sum_eval, _sum_impl,
        lambda g, out, a, *, fn: (reshape(g, aval_of(g).shape + (1, 1)) * _gradient(a, fn),),
        lambda t, out, a, *, fn: sum(_gradient(a, fn) * symmetrize(t[0]), axis=(-2, -1)),
        batch=batch_stacked("spectral_sum"),
        special_points=_POINTS,
    )
)  # fmt: skip


def spectral_sum(a: Any, fn: str) -> Any:
    """trace(f(a)) = sum(f(eigvalsh(a))) for the symmetric part of `a` (..., n, n), with f
    one of "exp", "log", "square". Unlike the same sum written through `eigvalsh`, its
    second derivative is exact where eigenvalues repeat (the divided differences of f').

    >>> import fastgrad as fg
    >>> a = np.eye(2)  # eigenvalue 1, twice
    >>> float(spectral_sum(a, "exp")), fg.grad(lambda m: spectral_sum(m, "square"))(a)
    (5.43656365691809, array([[2., 0.],
           [0., 2.]]))
    >>> e = np.array([[0.0, 1.0], [1.0, 0.0]])
    >>> fg.jvp(fg.grad(lambda m: spectral_sum(m, "square")), (a,), (e,))[1]  # 2 e
    array([[0., 2.],
           [2., 0.]])
    """
    if fn not in FUNCTIONS:  # (plain arrays skip the abstract evaluation's check)
        raise ValueError(f"spectral_sum: fn must be one of {sorted(FUNCTIONS)}, got {fn!r}")
    check_square(aval_of(a), "spectral_sum")
    return bind(SPECTRAL_SUM, symmetrize(a), fn=fn)
