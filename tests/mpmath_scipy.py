"""The oracle's scipy.special functions with an order or shape parameter, in mpmath: the
incomplete gamma and beta functions, Student's t CDF, their inverses, zeta and the Bessel
functions. No code is shared with fastgrad (or with SciPy, except for a float64 starting
point of the root finding that inverts a CDF: the root itself is mpmath's).

Each takes and gives mpf; outside the domain (where SciPy gives nan) it gives nan, and
mpmath's complex results become nan through mpmath_oracle.guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mpmath
import scipy.special

NAN, INF = mpmath.nan, mpmath.inf


def _gammainc(a: Any, x: Any) -> Any:
    if x < 0 or a <= 0:
        return NAN
    return mpmath.gammainc(a, 0, x, regularized=True)


def _gammaincc(a: Any, x: Any) -> Any:
    if x < 0 or a <= 0:
        return NAN
    return mpmath.gammainc(a, x, INF, regularized=True)


def _betainc(a: Any, b: Any, x: Any) -> Any:
    if not 0 <= x <= 1 or a <= 0 or b <= 0:
        return NAN
    return mpmath.betainc(a, b, 0, x, regularized=True)


def _stdtr(df: Any, t: Any) -> Any:
    """P(T <= t) = I_{df / (df + t^2)}(df/2, 1/2) / 2 below 0, 1 minus that above."""
    if df <= 0:
        return NAN
    if mpmath.isinf(t):
        return mpmath.mpf(t > 0)
    tail = mpmath.betainc(df / 2, mpmath.mpf(0.5), 0, df / (df + t * t), regularized=True) / 2
    return tail if t < 0 else 1 - tail


def _inverse(
    cdf: Callable[..., Any],
    start: Callable[..., float],
    low: Any,
    high: Any,
    increasing: bool = True,
) -> Callable[..., Any]:
    """The x in (low, high) with cdf(*params, x) = y: secant steps from SciPy's float64
    root to the working precision. y = 0 and y = 1 give the ends of the range."""

    def inverse(*args: Any) -> Any:
        *params, y = args
        if not 0 <= y <= 1 or any(p <= 0 for p in params):
            return NAN
        if y in (0, 1):
            return low if (y == 0) == increasing else high
        x0 = mpmath.mpf(start(*(float(p) for p in params), float(y)))
        x1 = x0 * (1 + mpmath.mpf(2) ** -40) if x0 else mpmath.mpf(2) ** -60
        return mpmath.findroot(lambda x: cdf(*params, x) - y, (x0, x1))

    return inverse


def _hurwitz_zeta(x: Any, q: Any) -> Any:
    if x == 1:
        return INF
    if x < 1 or q <= 0:
        return NAN  # SciPy's zeta(x, q) is defined for x > 1 and q > 0
    return mpmath.mpf(0) if q == INF else mpmath.zeta(x, q)


def _positive_x(f: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """yv and kv are complex for x < 0 (nan in SciPy), whatever the order."""
    return lambda v, x: NAN if x < 0 else f(v, x)


SCALAR: dict[str, Callable[..., Any]] = {
    "gammainc": _gammainc,
    "gammaincc": _gammaincc,
    "gammaincinv": _inverse(_gammainc, scipy.special.gammaincinv, mpmath.mpf(0), INF),
    "gammainccinv": _inverse(
        _gammaincc, scipy.special.gammainccinv, mpmath.mpf(0), INF, increasing=False
    ),
    "betainc": _betainc,
    "betaincinv": _inverse(_betainc, scipy.special.betaincinv, mpmath.mpf(0), mpmath.mpf(1)),
    "stdtr": _stdtr,
    "stdtrit": _inverse(_stdtr, scipy.special.stdtrit, -INF, INF),
    "zeta": _hurwitz_zeta,
    "riemann_zeta": lambda x: INF if x == 1 else mpmath.zeta(x),
    "jv": mpmath.besselj,
    "yv": _positive_x(mpmath.bessely),
    "iv": mpmath.besseli,
    "kv": _positive_x(mpmath.besselk),
    "ive": lambda v, x: mpmath.exp(-abs(x)) * mpmath.besseli(v, x),
    "kve": _positive_x(lambda v, x: mpmath.exp(x) * mpmath.besselk(v, x)),
}


# ---------------------------------------------------------------- scipy.linalg
# On mpmath matrices (mpmath_oracle._per_matrix applies them to each matrix of a batch).


def _solve_sylvester(a: Any, b: Any, q: Any) -> Any:
    """The x with a x + x b = q: (I (x) a + b^T (x) I) vec(x) = vec(q), columns stacked."""
    n, m = a.rows, b.rows
    k = mpmath.matrix(n * m, n * m)
    for j in range(m):
        for i in range(n):
            for r in range(n):
                k[j * n + i, j * n + r] += a[i, r]
            for c in range(m):
                k[j * n + i, c * n + i] += b[c, j]
    x = mpmath.lu_solve(k, mpmath.matrix([q[i, j] for j in range(m) for i in range(n)]))
    return mpmath.matrix([[x[j * n + i] for j in range(m)] for i in range(n)])


def _partial_pivoting(a: Any) -> tuple[list[int], Any, Any]:
    """Doolittle's elimination with partial pivoting as LAPACK does it (the largest entry
    of the column in magnitude, the first of ties): the swaps, L and U (P^T a = L U)."""
    n = a.rows
    u, lower, swaps = a.copy(), mpmath.eye(n), []
    for k in range(n):
        j = max(range(k, n), key=lambda r: (abs(u[r, k]), -r))
        swaps.append(j)
        for c in range(n):
            u[k, c], u[j, c] = u[j, c], u[k, c]
        for c in range(k):
            lower[k, c], lower[j, c] = lower[j, c], lower[k, c]
        for r in range(k + 1, n):
            lower[r, k] = u[r, k] / u[k, k] if u[r, k] else mpmath.mpf(0)
            for c in range(k, n):
                u[r, c] -= lower[r, k] * u[k, c]
    return swaps, lower, u


def _lu(a: Any) -> list[Any]:
    """P, L, U with a = P L U, flattened in turn."""
    swaps, lower, upper = _partial_pivoting(a)
    p = mpmath.eye(a.rows)
    for k, j in enumerate(swaps):  # P^T = the swaps applied to the identity's rows
        for c in range(a.rows):
            p[k, c], p[j, c] = p[j, c], p[k, c]
    return [m[r, c] for m in (p.T, lower, upper) for r in range(a.rows) for c in range(a.rows)]


LINALG: dict[str, Callable[..., Any]] = {
    "expm": lambda a: mpmath.expm(a),
    # (mpmath's root of a real matrix has imaginary parts of the size of its precision.)
    "sqrtm": lambda a: mpmath.sqrtm(a).apply(mpmath.re),
    "solve_sylvester": _solve_sylvester,
    "lu": _lu,
}


def lu_pivots(a: Any) -> Any:
    """LAPACK's pivots: row i was swapped with row piv[i], in turn."""
    import numpy as np

    with mpmath.workprec(200):
        swaps = _partial_pivoting(mpmath.matrix([[mpmath.mpf(float(x)) for x in r] for r in a]))[0]
    return np.array(swaps, dtype=np.int32)


def pivot_permutation(piv: Any, inverse: bool) -> Any:
    """perm with P^T b = b[perm] for the swaps in piv (its inverse with `inverse`): swap
    the rows of an identity matrix in turn and read where each one went."""
    import numpy as np

    p = np.eye(len(piv))
    for i, j in enumerate(piv):
        p[[i, j]] = p[[j, i]]
    perm = np.argmax(p, axis=1)
    return np.argsort(perm) if inverse else perm
