"""An oracle for values and derivatives that shares no code with fastgrad.

Every op is written again here with mpmath (scalar functions) or with NumPy on object
arrays of mpmath numbers (reductions, shapes, indexing, products), and differentiated by
finite differences in arbitrary precision: `mpmath.diff` for one-sided derivatives, and
central mixed differences with steps of 2**-74 at a precision that leaves ~128 exact bits,
so at orders 1 to 3 they are exact to far more digits than float64 holds. `expect(...)`
says, at one point, what each derivative must be:

- ("value", d): the derivative is d (a smooth point; or, at the edge of the domain, the
  one-sided derivative from the side where the function is defined);
- ("nonfinite", sign): the derivative diverges (sqrt at 0), the value is a pole (log at 0)
  or nan (log at -1): the answer must be inf or nan, with `sign` when both sides agree;
- ("limit", d or None): an input is inf or nan. At inf, d is the derivative's limit, the
  same along every way of letting the infinite inputs grow (estimated at 10**20, 10**40,
  10**80); at nan, or where the value is nan, d is the derivative's value at every finite
  stand-in for the non-finite inputs (so linear and piecewise-constant dependences keep
  theirs). The answer must be d, or inf/nan; None (no such d) allows inf/nan only.
  Never another number;
- ("kink", None): one-sided derivatives differ (a tie, abs at 0, a jump): the function
  alone does not define the derivative, docs/conventions.md does.

Kinks, edges and divergences are found from one-sided derivatives along one direction v
at two step sizes (one that changes with the step diverges, or shrinks to 0); at smooth
points mixed derivatives use a different direction per order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np

import mpmath_scipy

mp = mpmath.mp
NAN, INF = mpmath.nan, mpmath.inf

# ---------------------------------------------------------------- numbers


def to_mp(x: Any) -> Any:
    """An exact mpf (or an object array of them) from floats; other values unchanged."""
    a = np.asarray(x)
    if a.dtype.kind != "f":
        return x
    if a.ndim == 0:
        return mpmath.mpf(float(a))
    out = np.empty(a.shape, dtype=object)
    for i, v in np.ndenumerate(a):
        out[i] = mpmath.mpf(float(v))
    return out


def is_nan(z: Any) -> bool:
    return isinstance(z, mpmath.mpc) or mpmath.isnan(z)


def to_float(z: Any, dtype: Any) -> Any:
    """The float of `dtype` nearest to mpf `z` (inf beyond the range, nan for nan)."""
    if is_nan(z):
        return np.dtype(dtype).type(np.nan)
    with np.errstate(over="ignore"):
        return np.dtype(dtype).type(float(mpmath.mpf(z)))


def _real(z: Any) -> Any:
    if isinstance(z, mpmath.mpc):
        return z.real if z.imag == 0 else NAN
    return z


def guard(f: Callable[..., Any]) -> Callable[..., Any]:
    """f with complex results and domain errors turned into nan, as NumPy does."""

    def g(*args: Any, **kw: Any) -> Any:
        if any(not isinstance(a, np.ndarray) and _nan(a) for a in args):
            return _on_nan(f, args, kw)
        try:
            return _real(f(*args, **kw))
        except (ZeroDivisionError, ValueError, OverflowError):
            return NAN

    return g


def _nan(a: Any) -> bool:
    return isinstance(a, mpmath.mpf) and mpmath.isnan(a)


def _on_nan(f: Callable[..., Any], args: Any, kw: Any) -> Any:
    try:
        return _real(f(*args, **kw))
    except (ZeroDivisionError, ValueError, OverflowError, TypeError):
        return NAN


# ---------------------------------------------------------------- the ops, in mpmath


def _div(x: Any, y: Any) -> Any:
    if y == 0:
        return NAN if (x == 0 or _nan(x)) else INF * mpmath.sign(x)
    return x / y


def _power(x: Any, y: Any) -> Any:
    if _nan(x) or _nan(y):
        return mpmath.mpf(1) if (y == 0 or x == 1) else NAN
    if x == 0:
        return INF if y < 0 else (mpmath.mpf(1) if y == 0 else mpmath.mpf(0))
    if x < 0 and not mpmath.isinf(y) and y != int(y):
        return NAN
    return _real(mpmath.power(x, y))


def _power_log(x: Any, y: Any, k: int) -> Any:
    if (x == 0 and y > 0) or (mpmath.isinf(x) and x > 0 and y < 0):
        return mpmath.mpf(0)
    if x < 0:
        return NAN
    return _power(x, y) * mpmath.log(x) ** k


def _maximum(x: Any, y: Any) -> Any:
    return NAN if _nan(x) or _nan(y) else max(x, y)


def _minimum(x: Any, y: Any) -> Any:
    return NAN if _nan(x) or _nan(y) else min(x, y)


def _sign(x: Any) -> Any:
    return NAN if _nan(x) else mpmath.mpf(mpmath.sign(x))


def _cbrt(x: Any) -> Any:
    return mpmath.sign(x) * mpmath.cbrt(abs(x))


def _sigmoid(x: Any) -> Any:
    return 1 / (1 + mpmath.exp(-x))


def _log_add_exp(base: Any) -> Callable[[Any, Any], Any]:
    """log_base(base**x + base**y): the largest operand exactly, plus a small term (no
    rounding of x * log(base) that finite differences at 10**40 would amplify)."""

    def log_add(x: Any, y: Any) -> Any:
        if x == -INF and y == -INF:
            return -INF
        big = max(x, y)
        if mpmath.isinf(big):
            return big
        return big + mpmath.log(mpmath.power(base, x - big) + mpmath.power(base, y - big), base)

    return log_add


def _ndtri(p: Any) -> Any:
    return mpmath.sqrt(2) * mpmath.erfinv(2 * p - 1)


def _gammaln(x: Any) -> Any:
    return mpmath.log(abs(mpmath.gamma(x))) if x < 0 else mpmath.loggamma(x)


def _log_ndtr(x: Any) -> Any:
    return mpmath.log(mpmath.ncdf(x))


def _scaled_bessel(order: int) -> Callable[[Any], Any]:
    # Both factors have limits at +-inf (0 and inf); the product tends to 0.
    return lambda x: (
        mpmath.mpf(0) if mpmath.isinf(x) else mpmath.exp(-abs(x)) * mpmath.besseli(order, x)
    )


def _round_to_zero(x: Any) -> Any:
    return x if mpmath.isinf(x) else mpmath.sign(x) * mpmath.floor(abs(x))


def _rounded_remainder(rounding: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """x - q y with q = rounding(x / y): remainder (floor) and fmod (towards zero)."""

    def rem(x: Any, y: Any) -> Any:
        if y == 0 or mpmath.isinf(x):
            return NAN
        if mpmath.isinf(y):  # q is 0, or for remainder -1 where the signs differ
            return x if x == 0 or rounding(x * mpmath.sign(y) / mpmath.mpf(10) ** 400) == 0 else y
        return x - y * rounding(x / y)

    return rem


def _nan_ignoring(pick: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda x, y: y if _nan(x) else x if _nan(y) else pick(x, y)


def _heaviside(x: Any, h0: Any) -> Any:
    return NAN if _nan(x) else h0 if x == 0 else mpmath.mpf(x > 0)


def _trunc(f: Callable[..., Any]) -> Callable[..., Any]:
    return lambda x: x if mpmath.isinf(x) else f(x)


# Scalar functions: an elementwise op applied to one mpf per input.
SCALAR: dict[str, Callable[..., Any]] = {
    "negative": lambda x: -x,
    "square": lambda x: x * x,
    "reciprocal": lambda x: _div(mpmath.mpf(1), x),
    "abs": abs,
    "sign": _sign,
    "floor": _trunc(mpmath.floor),
    "ceil": _trunc(mpmath.ceil),
    "rint": _trunc(mpmath.nint),  # ties to even, as NumPy
    "add": lambda x, y: x + y,
    "subtract": lambda x, y: x - y,
    "multiply": lambda x, y: x * y,
    "divide": _div,
    "maximum": _maximum,
    "minimum": _minimum,
    "where": lambda c, x, y: x if c else y,
    "astype": lambda x, dtype: x,  # a rounding is taken as the identity
    "stop_gradient": lambda x, name=None: x,  # derivative 0 by definition
    "exp": mpmath.exp,
    "exp2": lambda x: mpmath.power(2, x),
    "expm1": mpmath.expm1,
    "log": mpmath.log,
    "log2": lambda x: mpmath.log(x, 2),
    "log10": mpmath.log10,
    "log1p": mpmath.log1p,
    "sqrt": mpmath.sqrt,
    "cbrt": _cbrt,
    "sin": mpmath.sin,
    "cos": mpmath.cos,
    "tan": mpmath.tan,
    "arcsin": mpmath.asin,
    "arccos": mpmath.acos,
    "arctan": mpmath.atan,
    "sinh": mpmath.sinh,
    "cosh": mpmath.cosh,
    "tanh": mpmath.tanh,
    "arcsinh": mpmath.asinh,
    "arccosh": mpmath.acosh,
    "arctanh": mpmath.atanh,
    "sigmoid": _sigmoid,
    "power": _power,
    "power_log": _power_log,
    "arctan2": mpmath.atan2,
    "logaddexp": _log_add_exp(mpmath.e),
    "logaddexp2": _log_add_exp(2),
    "hypot": mpmath.hypot,
    "remainder": _rounded_remainder(mpmath.floor),
    "fmod": _rounded_remainder(_round_to_zero),
    "floor_divide": lambda x, y: mpmath.floor(_div(x, y)) if y != 0 else _div(x, y),
    "trunc": _round_to_zero,
    "fmax": _nan_ignoring(max),
    "fmin": _nan_ignoring(min),
    "copysign": lambda x, y: abs(x) if y >= 0 else -abs(x),
    "heaviside": _heaviside,
    # scipy.special (values at poles are SciPy's: see test_special_points.numpy_value).
    # erfinv loses its precision near 1: erfcinv and ndtri are checked from 1e-10 up.
    "erf": mpmath.erf,
    "erfc": mpmath.erfc,
    "erfinv": mpmath.erfinv,
    "erfcinv": lambda y: mpmath.erfinv(1 - y),
    "ndtri": _ndtri,
    "erfcx": lambda x: mpmath.mpf(0) if x == INF else mpmath.exp(x * x) * mpmath.erfc(x),
    "log_ndtr": _log_ndtr,
    "gamma": mpmath.gamma,
    "gammaln": _gammaln,
    "digamma": mpmath.digamma,
    # The order is an integer: a perturbation of it by the differences changes nothing.
    "polygamma": lambda n, x: mpmath.polygamma(int(mpmath.nint(n)), x),
    "beta": mpmath.beta,
    "betaln": lambda a, b: mpmath.log(abs(mpmath.beta(a, b))),
    "i0e": _scaled_bessel(0),
    "i1e": _scaled_bessel(1),
    # scipy.special's functions with an order or shape parameter (held fixed).
    **mpmath_scipy.SCALAR,
}


def _reduce(f: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def reduce(x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
        x = np.asarray(x, dtype=object)
        kept = [a for a in range(x.ndim) if a not in axis]
        moved = np.transpose(x, kept + list(axis)).reshape(tuple(x.shape[a] for a in kept) + (-1,))
        out = np.empty(moved.shape[:-1], dtype=object)
        for i in np.ndindex(out.shape):
            row = list(moved[i])
            acc = row[0]
            for v in row[1:]:
                acc = f(acc, v)
            out[i] = acc
        if keepdims:
            out = out.reshape(tuple(1 if a in axis else d for a, d in enumerate(x.shape)))
        return out

    return reduce


def _sum(x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    out = np.sum(np.asarray(x, dtype=object), axis=axis, keepdims=keepdims)
    return _mp_array(out)


def _prod(x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    out = np.prod(np.asarray(x, dtype=object), axis=axis, keepdims=keepdims)
    return _mp_array(out)


def _mp_array(out: Any) -> Any:
    """Integers (the empty sum 0, the empty product 1) as mpf."""
    out = np.asarray(out, dtype=object)
    flat = [mpmath.mpf(v) if isinstance(v, int) else v for v in out.reshape(-1)]
    result = np.empty(out.shape, dtype=object)
    for i, v in zip(np.ndindex(out.shape), flat, strict=True):
        result[i] = v
    return result


def _slices(index: Any) -> tuple[slice, ...]:
    return tuple(slice(a, None if b < 0 else b, c) for a, b, c in index)


def _slice_scatter(g: Any, shape: tuple[int, ...], index: Any) -> Any:
    out = _mp_array(np.zeros(shape, dtype=object))
    out[_slices(index)] = g
    return out


def _index(index: Any, arrays: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(
        np.asarray(arrays[e[1]])
        if e[0] == "array"
        else slice(e[1], None if e[2] < 0 else e[2], e[3])
        for e in index
    )


def _scatter_add(g: Any, *idx: Any, shape: tuple[int, ...], index: Any) -> Any:
    out = _mp_array(np.zeros(shape, dtype=object))
    np.add.at(out, _index(index, idx), np.asarray(g, dtype=object))
    return out


def _scatter(combine: Any) -> Callable[..., Any]:
    """x with v written (combine None) or combined into its indexed elements, in turn."""

    def scatter(x: Any, v: Any, *idx: Any, index: Any) -> Any:
        out = _mp_array(np.array(x, dtype=object))
        targets = np.broadcast_to(
            np.arange(out.size).reshape(out.shape)[_index(index, idx)], np.shape(v)
        )
        flat = out.reshape(-1)
        for t, value in zip(
            targets.reshape(-1), np.asarray(v, dtype=object).reshape(-1), strict=True
        ):
            flat[t] = value if combine is None else combine(flat[t], value)
        return flat.reshape(out.shape)

    return scatter


def _per_matrix(f: Callable[..., Any], tail: int = 2) -> Callable[..., Any]:
    """f on each matrix (the last two axes; for f's other operands too), as mpmath
    matrices; f returns an mpmath matrix, a number or a list of numbers."""

    def apply(*arrays: Any, **params: Any) -> Any:
        arrays = tuple(np.asarray(a, dtype=object) for a in arrays)
        batch = arrays[0].shape[:-2]
        out = None
        for i in np.ndindex(batch):
            got = f(*(mpmath.matrix(a[i].tolist()) for a in arrays), **params)
            if isinstance(got, mpmath.matrix):
                got = [[got[r, c] for c in range(got.cols)] for r in range(got.rows)]
            shape = np.shape(got) if isinstance(got, list) else ()
            if out is None:
                out = np.empty(batch + shape, dtype=object)
            for j in np.ndindex(shape):
                out[i + j] = got if not shape else np.asarray(got, dtype=object)[j]
        return _mp_array(out)

    return apply


def _det(a: Any) -> Any:
    return mpmath.det(a) if a.rows else mpmath.mpf(1)


def _cholesky(a: Any) -> Any:
    return mpmath.cholesky((a + a.T) / 2)  # the rule reads the symmetric part


def _triangular_solve(a: Any, b: Any, lower: bool, transpose: bool, unit_diagonal: bool) -> Any:
    n = a.rows
    t = mpmath.matrix(n, n)
    for r in range(n):
        for c in range(n):
            if r == c:
                t[r, c] = 1 if unit_diagonal else a[r, c]
            elif (r > c) == lower:
                t[r, c] = a[r, c]
    return mpmath.inverse(t.T if transpose else t) * b


# Decompositions. Their vectors are unique up to sign only (and eigenvectors at repeated
# eigenvalues, or singular vectors at repeated singular values, not at all: points there
# are not used). fastgrad returns LAPACK's signs, as NumPy does, and differentiates the
# continuous branch through them; the oracle flips each of mpmath's vectors to point the
# way NumPy's does at the float64 input (a perturbation by the finite differences, far
# below float64's resolution, leaves that reference as it is).


def _floats(a: Any) -> np.ndarray:
    return np.array([[float(a[r, c]) for c in range(a.cols)] for r in range(a.rows)])


def _columns(q: Any, order: Sequence[int]) -> list[list[Any]]:
    return [[q[r, j] for r in range(q.rows)] for j in order]


def _aligned(columns: list[list[Any]], reference: np.ndarray) -> list[int]:
    """+1 or -1 per column: the sign that makes it agree with `reference`'s column."""
    return [1 if sum(x * float(r) for x, r in zip(c, reference[:, j], strict=True)) >= 0 else -1
            for j, c in enumerate(columns)]  # fmt: skip


def _rows_of(columns: list[list[Any]], signs: Sequence[int]) -> list[Any]:
    """The matrix whose columns are `columns` (times `signs`), flattened row by row."""
    return [columns[j][r] * signs[j] for r in range(len(columns[0])) for j in range(len(columns))]


def _eigh(a: Any, vectors: bool) -> list[Any]:
    s = (a + a.T) / 2  # the rule reads the symmetric part
    w, q = mpmath.eigsy(s)
    order = sorted(range(s.rows), key=lambda i: w[i])
    values = [w[i] for i in order]
    if not vectors:
        return values
    columns = _columns(q, order)
    signs = _aligned(columns, np.linalg.eigh(_floats(s))[1])
    return values + _rows_of(columns, signs)


# f and its first two derivatives for spectral_sum and spectral_map.
_SPECTRAL = {
    "exp": (mpmath.exp, mpmath.exp, mpmath.exp),
    "square": (lambda x: x * x, lambda x: 2 * x, lambda x: mpmath.mpf(2)),
    "log": (mpmath.log, lambda x: 1 / x, lambda x: -1 / (x * x)),
}


def _spectral_map(a: Any, fn: str, k: int) -> Any:
    """V f^(k)(L) V^T of the symmetric part of a (the rule reads it)."""
    w, q = mpmath.eigsy((a + a.T) / 2)
    f = _SPECTRAL[fn][k]
    return q * mpmath.diag([f(w[i]) for i in range(a.rows)]) * q.T


def _spectral_sum(a: Any, fn: str) -> Any:
    w = mpmath.eigsy((a + a.T) / 2)[0]
    return mpmath.fsum(_SPECTRAL[fn][0](w[i]) for i in range(a.rows))


def _svd(a: Any, compute_uv: bool) -> list[Any]:
    u, s, v = mpmath.svd_r(a, full_matrices=False, compute_uv=True)  # a = u diag(s) v
    order = sorted(range(len(s)), key=lambda i: -s[i])
    values = [s[i] for i in order]
    if not compute_uv:
        return values
    left = _columns(u, order)
    signs = _aligned(left, np.linalg.svd(_floats(a), full_matrices=False)[0])
    right = _columns(v.T, order)
    return _rows_of(left, signs) + values + [x * signs[i] for i in range(len(order))
                                             for x in right[i]]  # fmt: skip


def _qr(a: Any) -> list[Any]:
    k = min(a.rows, a.cols)
    # A wide matrix: Q R1 is the QR of its first k columns, and R's rest is Q^T times theirs.
    q, r = mpmath.qr(a[:, :k] if a.rows < a.cols else a, mode="skinny")
    if a.rows < a.cols:
        r = mpmath.matrix([[r[i, j] for j in range(k)] + list((q.T * a[:, k:])[i, :])
                           for i in range(k)])  # fmt: skip
    numpy_r = np.linalg.qr(_floats(a), mode="reduced")[1]
    signs = [1 if (r[j, j] >= 0) == (numpy_r[j, j] >= 0) else -1 for j in range(k)]
    q_part = [q[i, j] * signs[j] for i in range(a.rows) for j in range(k)]
    return q_part + [r[i, j] * signs[i] for i in range(k) for j in range(a.cols)]


def _pinv(a: Any, rcond: Any) -> Any:
    """The pseudo-inverse of a matrix of full rank (the points have full rank)."""
    if a.rows >= a.cols:
        return mpmath.inverse(a.T * a) * a.T
    return a.T * mpmath.inverse(a * a.T)


def _matmul(a: Any, b: Any) -> Any:
    return _mp_array(np.matmul(np.asarray(a, dtype=object), np.asarray(b, dtype=object)))


def _sort(x: Any, axis: int) -> Any:
    """Sorted along `axis`, nan last, as NumPy sorts."""
    moved = np.moveaxis(np.asarray(x, dtype=object), axis, -1)
    out = np.empty(moved.shape, dtype=object)
    for i in np.ndindex(moved.shape[:-1]):
        row = sorted(moved[i], key=lambda v: (is_nan(v), 0 if is_nan(v) else v))
        for j, v in enumerate(row):
            out[(*i, j)] = v
    return np.moveaxis(out, -1, axis)


def _cumsum(x: Any, axis: int, reverse: bool) -> Any:
    x = np.asarray(x, dtype=object)
    if not reverse:
        return _mp_array(np.cumsum(x, axis=axis))
    return _mp_array(np.flip(np.cumsum(np.flip(x, axis), axis=axis), axis))


def _masked_svd(mask: Any, a: Any) -> Any:
    """The SVD of each matrix of `a` where `mask`, of diag(n, ..., 1) (U = V = I) elsewhere."""
    a = np.asarray(a, dtype=object)
    n = a.shape[-1]
    placeholder = np.diag(np.arange(n, 0, -1)).astype(object)
    chosen = np.where(np.asarray(mask)[..., None, None], a, _mp_array(placeholder))

    def with_sign(m: Any) -> list[Any]:  # and det(U Vh), +-1
        parts = _svd(m, compute_uv=True)
        u, vh = (mpmath.matrix(n, n), mpmath.matrix(n, n))
        for i in range(n * n):
            u[i // n, i % n], vh[i // n, i % n] = parts[i], parts[n * n + n + i]
        return parts + [mpmath.sign(mpmath.det(u) * mpmath.det(vh))]

    return _per_matrix(with_sign)(chosen)


def _segment_others(seg: Any, w: Any, *ts: Any) -> Any:
    """Per entry k, the coefficient of e1...em in the product, over the other entries l
    with k's id, of (w_l + e1 t1_l + ... + em tm_l), with e_i e_i = 0: expanded term by term."""
    m, ids = len(ts), np.asarray(seg).tolist()
    out = np.empty(len(ids), dtype=object)
    for k in range(len(ids)):
        poly = {0: mpmath.mpf(1)}  # monomial (bits of the e's) -> coefficient
        for factor in (j for j in range(len(ids)) if j != k and ids[j] == ids[k]):
            terms = {0: w[factor], **{1 << i: ts[i][factor] for i in range(m)}}
            product: dict[int, Any] = {}
            for p, cp in poly.items():
                for q, cq in terms.items():
                    if p & q == 0:
                        product[p | q] = product.get(p | q, 0) + cp * cq
            poly = product
        out[k] = poly.get((1 << m) - 1, mpmath.mpf(0))
    return out


def _safe_inverse(a: Any) -> list[Any]:
    """inv(a) and 0; or the identity and 1 where a is singular or its condition number in
    the Frobenius norm is 1 / sqrt(eps) or more (float64's eps: points sit far from it)."""
    n = a.rows
    near = _det(a) == 0
    if not near:
        kappa = mpmath.mnorm(a, "f") * mpmath.mnorm(mpmath.inverse(a), "f")
        near = kappa * mpmath.sqrt(mpmath.mpf(2) ** -52) >= 1
    x = mpmath.eye(n) if near else mpmath.inverse(a)
    return [x[r, c] for r in range(n) for c in range(n)] + [mpmath.mpf(int(near))]


# Array functions: the other ops, on object arrays of mpf and their params.
ARRAY: dict[str, Callable[..., Any]] = {
    "sum": _sum,
    "prod": _prod,
    "max": _reduce(_maximum),
    "min": _reduce(_minimum),
    "broadcast_to": lambda x, shape: np.broadcast_to(np.asarray(x, dtype=object), shape),
    "reshape": lambda x, shape: np.reshape(np.asarray(x, dtype=object), shape),
    "transpose": lambda x, axes: np.transpose(np.asarray(x, dtype=object), axes),
    "slice": lambda x, index: np.asarray(x, dtype=object)[_slices(index)],
    "slice_scatter": _slice_scatter,
    "concatenate": lambda *xs, axis: np.concatenate(
        [np.asarray(x, dtype=object) for x in xs], axis=axis
    ),
    "gather": lambda x, *idx, index: np.asarray(x, dtype=object)[_index(index, idx)],
    "scatter_add": _scatter_add,
    "matmul": _matmul,
    "sort": _sort,
    "det": _per_matrix(_det),
    "inv": _per_matrix(lambda a: mpmath.inverse(a)),
    "slogdet": _per_matrix(lambda a: [mpmath.sign(_det(a)), mpmath.log(abs(_det(a)))]),
    "solve": _per_matrix(lambda a, b: mpmath.inverse(a) * b),
    "cholesky": _per_matrix(_cholesky),
    "eigh": _per_matrix(_eigh),
    "svd": _per_matrix(_svd),
    "spectral_map": _per_matrix(_spectral_map),
    "spectral_sum": _per_matrix(_spectral_sum),
    "masked_svd": _masked_svd,
    "safe_inverse": _per_matrix(_safe_inverse),
    "segment_others": _segment_others,
    "qr": _per_matrix(_qr),
    "pinv": _per_matrix(_pinv),
    "triangular_solve": _per_matrix(_triangular_solve),
    "scatter": _scatter(None),
    "scatter_multiply": _scatter(lambda a, b: a * b),
    "scatter_min": _scatter(_minimum),
    "scatter_max": _scatter(_maximum),
    "cumsum": _cumsum,
    # scipy.linalg's matrix functions and LU.
    **{name: _per_matrix(f) for name, f in mpmath_scipy.LINALG.items()},
}

# Ops that are never differentiated (boolean or integer results): NumPy's value is checked.
VALUE_ONLY: dict[str, Callable[..., Any]] = {
    "argmax": lambda x, axis: np.argmax(x, axis=axis),
    "argmin": lambda x, axis: np.argmin(x, axis=axis),
    "argsort": lambda x, axis, kind: np.argsort(x, axis=axis, kind=kind),
    "argpartition": lambda x, axis, kth: np.argpartition(x, kth, axis=axis),
    "searchsorted": lambda a, v, side: np.searchsorted(a, v, side=side),
    **{name: getattr(np, name) for name in (
        "bitwise_and", "bitwise_or", "bitwise_xor", "invert", "left_shift", "right_shift",
        "bitwise_count", "gcd", "lcm")},
    "lu_pivots": lambda a: mpmath_scipy.lu_pivots(a),
    "pivot_permutation": lambda piv, inverse: mpmath_scipy.pivot_permutation(piv, inverse),
}  # fmt: skip


def mp_function(name: str) -> Callable[..., Any] | None:
    """The oracle's version of op `name`: on mpf scalars (elementwise) or object arrays."""
    if name in SCALAR:
        return guard(SCALAR[name])
    return ARRAY.get(name)


# ---------------------------------------------------------------- derivatives

P1 = 128  # bits of precision (beyond what the steps and the magnitudes need)
H1, H2 = 100, 200  # one-sided steps 2**-100, 2**-200: a derivative that changes diverges
SAMPLES = (mpmath.mpf(-1.75), mpmath.mpf(0.625), mpmath.mpf(2.25))


@dataclass
class Expect:
    """What one derivative must be. `single`: along dirs[0] at every order (at edges,
    kinks and non-finite inputs), else along dirs[0], dirs[1], ... (one per order)."""

    kind: str  # "value", "nonfinite", "limit", "kink"
    value: Any = None
    sign: int = 0
    single: bool = True


@dataclass
class Problem:
    """One point of one function: f maps the differentiable inputs to an output (an mpf,
    or an object array contracted with `u`)."""

    f: Callable[..., Any]
    xs: list[Any]  # differentiable inputs: mpf or object arrays
    dirs: list[list[Any]]  # dirs[j][i]: the direction of order j + 1, input i
    u: Any = None  # output cotangent for array outputs

    def scalar(self, xs: Sequence[Any]) -> Any:
        out = self.f(*xs)
        if self.u is None:
            return out
        total = mpmath.mpf(0)
        for a, b in zip(np.asarray(self.u).reshape(-1), np.asarray(out).reshape(-1), strict=True):
            total += a * b
        return total

    def moved(self, xs: Sequence[Any], steps: Sequence[tuple[Any, Sequence[Any]]]) -> list[Any]:
        out = []
        for i, x in enumerate(xs):
            for t, d in steps:
                x = x + t * d[i]
            out.append(x)
        return out


def _finite(z: Any) -> bool:
    return not is_nan(z) and not mpmath.isinf(z)


def _safe(g: Callable[..., Any]) -> Callable[..., Any]:
    def h(*t: Any) -> Any:
        try:
            z = g(*t)
        except (ZeroDivisionError, ValueError, OverflowError):
            return NAN
        return NAN if is_nan(z) else z

    return h


def _magnitude(xs: Sequence[Any]) -> int:
    """Bits to add to the precision so that a step of 2**-bits still moves the largest
    input and stays small against the smallest nonzero one."""
    mags = [
        int(mpmath.mag(v))
        for x in xs
        for v in np.asarray(x, dtype=object).reshape(-1)
        if _finite(v) and v != 0
    ]
    return max([0, *mags]) + max([0, *(-m for m in mags)])


def _value_bits(p: Problem, xs: Sequence[Any]) -> int:
    """Bits above 1 of the value: a derivative far smaller than the value (d^2/dxdy of
    x*y at 1e200 is 1, x*y is 1e400) is a difference of values that needs that many more.
    (Capped: where the value is astronomically large, as exp(1e80), so are derivatives.)"""
    with mpmath.workprec(P1):
        z = _safe(p.scalar)(xs)
    return min(3000, max(0, int(mpmath.mag(z)))) if _finite(z) and z != 0 else 0


def one_sided(p: Problem, xs: Sequence[Any], k: int, side: int, bits: int) -> Any:
    """The k-th derivative along dirs[0] from one side (side = 1 or -1): mpmath.diff's
    one-sided differences with a step of 2**-(bits + the inputs' magnitude).

    diff works at (k + 1) times the precision it is given. Given P1 + the steps' bits + the
    value's bits, as it always was, it worked at 1352 bits for order 3 at x = 1000 where 972
    do, and at 676 for order 1 where 550 do (mpmath's Bessel K at 1352 bits took 0.6 s a
    value, most of a minute per function). So first at what the difference needs: P1 bits
    above its noise floor, the k-th difference of values rounded at 2**(value bits -
    precision), over a step of 2**-(bits + extra) to the k.
    A result not that far above the floor (0, or far smaller than the value, as sqrt's at
    10**40) is computed again at the full precision; nan (the function undefined at a
    step: its domain, not the precision) is not."""
    v = p.dirs[0]
    g = _safe(lambda t: p.scalar(p.moved(xs, [(t, v)])))
    step = bits + _magnitude(xs)
    value_bits = _value_bits(p, xs)
    full = P1 + step + value_bits
    floor = value_bits + k + k * step  # the noise floor is 2**(floor - working precision)
    given = -(-(P1 + floor + step) // (k + 1))  # + step: x + k * h stays exact
    if given < full:
        d = _one_sided_at(g, k, side, step, given)
        if is_nan(d) or (d != 0 and mpmath.mag(d) >= floor - (k + 1) * given + P1):
            return d
    return _one_sided_at(g, k, side, step, full)


def _one_sided_at(g: Callable[..., Any], k: int, side: int, step: int, prec: int) -> Any:
    with mpmath.workprec(prec):
        h = mpmath.ldexp(1, -step)
        return mpmath.diff(g, 0, k, direction=side, h=h, addprec=0)


def central(p: Problem, xs: Sequence[Any], k: int) -> Any:
    """The mixed derivative along dirs[0], ..., dirs[k-1]: the central difference
    sum over signs s of s1...sk g(h (s1 v1 + ... + sk vk)) / (2h)**k, error O(h**2)."""
    extra = _magnitude(xs)
    bits = P1 // 2 + 10 + extra
    with mpmath.workprec(P1 + extra + _value_bits(p, xs) + k * bits + 20):
        h = mpmath.ldexp(1, -bits)
        total = mpmath.mpf(0)
        for signs in itertools.product((1, -1), repeat=k):
            steps = [(s * h, d) for s, d in zip(signs, p.dirs[:k], strict=True)]
            total += int(np.prod(signs)) * _safe(p.scalar)(p.moved(xs, steps))
        return total / (2 * h) ** k


def _converged(a: Any, b: Any) -> bool:
    """Equal up to the error of one-sided differences (relative, or 2**-50 absolute)."""
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b)) + mpmath.ldexp(1, -50)


def _close(a: Any, b: Any, rtol: float = 1e-25, atol: Any = None) -> bool:
    atol = mpmath.mpf(10) ** -60 if atol is None else atol
    return abs(a - b) <= rtol * max(abs(a), abs(b)) + atol


def expect_finite(p: Problem, order: int = 3) -> tuple[Any, list[Expect]]:
    """The value and derivatives at a point whose inputs are all finite."""
    with mpmath.workprec(P1):
        value = _safe(p.f)(*p.xs) if p.u is None else _safe(p.scalar)(p.xs)
    if is_nan(value) or mpmath.isinf(value):  # undefined, or a pole
        return value, [Expect("nonfinite") for k in range(order)]
    out: list[Expect] = []
    for k in range(1, order + 1):
        if out and out[-1].kind in ("nonfinite", "kink"):
            out.append(Expect(out[-1].kind))
            continue
        sides = {}
        for side in (1, -1):
            d1, d2 = one_sided(p, p.xs, k, side, H1), one_sided(p, p.xs, k, side, H2)
            if _finite(d1) and _finite(d2):
                sides[side] = (d1, d2)
        if not sides:
            out.append(Expect("nonfinite"))
            continue
        # A one-sided derivative that changes with the step (beyond the step's own error,
        # about 2**-100 times the next derivative): it shrinks to 0 (x**1.5 at 0) or grows
        # without bound (sqrt at 0).
        for side, (d1, d2) in list(sides.items()):
            if not _converged(d1, d2) and abs(d2) < abs(d1):
                sides[side] = (mpmath.mpf(0), mpmath.mpf(0))
        diverging = [d2 for d1, d2 in sides.values() if not _converged(d1, d2)]
        if diverging:
            signs = {int(mpmath.sign(d)) for d in diverging}
            out.append(Expect("nonfinite", sign=signs.pop() if len(signs) == 1 else 0))
            continue
        if len(sides) == 1:  # the edge of the domain: the side where f is defined
            out.append(Expect("value", next(iter(sides.values()))[1]))
            continue
        if not _converged(sides[1][1], sides[-1][1]):
            out.append(Expect("kink"))
            continue
        out.append(Expect("value", central(p, p.xs, k), single=False))
    return value, out


def _stand_ins(x: Any, value_is_nan: bool, path: Sequence[int], m: int) -> Any:
    """`x` with its non-finite entries replaced by finite stand-ins: sample values for nan
    (or for every non-finite entry when the value is nan), and for the k-th infinite entry
    +-10**(20 * path[k] * m): along a path, m = 1 then m = 2 go towards the limit."""
    if isinstance(x, np.ndarray):
        y, k = x.copy(), 0
        for i, v in np.ndenumerate(x):
            if not _finite(v):
                y[i] = _stand_in(v, value_is_nan, path[k] if k < len(path) else 1, m)
                k += 1
        return y
    return x if _finite(x) else _stand_in(x, value_is_nan, path[0] if path else 1, m)


def _stand_in(v: Any, value_is_nan: bool, a: int, m: int) -> Any:
    if is_nan(v) or value_is_nan:
        return SAMPLES[(a - 1) % len(SAMPLES)]
    with mpmath.workprec(400):  # exact: off the integers, where floor and the like jump
        return mpmath.sign(v) * (mpmath.mpf(10) ** (20 * a * m) + mpmath.mpf(0.375))


def _limit(d1: Any, d2: Any) -> Any:
    """The limit of a derivative from its values further and further out, or nan."""
    if not (_finite(d1) and _finite(d2)):
        return NAN
    if _close(d1, d2, 1e-6, atol=0):
        return d2
    if abs(d2) <= 1e-10 * abs(d1):
        return mpmath.mpf(0)
    if abs(d2) >= 1e10 * abs(d1) and mpmath.sign(d1) == mpmath.sign(d2):
        return INF * mpmath.sign(d2)
    return NAN


def _derivative_at(p: Problem, xs: Sequence[Any], k: int) -> Any:
    right, left = one_sided(p, xs, k, 1, H2), one_sided(p, xs, k, -1, H2)
    if not (_finite(right) and _finite(left) and _converged(right, left)):
        return NAN  # a kink, an edge or a pole at the stand-in: no single value
    return (right + left) / 2


def expect_nonfinite(p: Problem, value: Any, order: int = 3) -> list[Expect]:
    """Derivatives at a point with an inf or nan input: the limit at inf (the same along
    every way of letting the infinite entries grow), or, at nan or where the value is nan,
    the value at every finite stand-in; if there is none, inf/nan only."""
    value_is_nan = is_nan(value)
    n_bad = sum(1 for x in p.xs for v in np.asarray(x, dtype=object).reshape(-1) if not _finite(v))
    paths = list(itertools.product((1, 2), repeat=n_bad)) if n_bad <= 4 else [(1,) * n_bad]
    if value_is_nan:
        paths = [tuple((j + i) % len(SAMPLES) + 1 for i in range(n_bad)) for j in range(3)]
    out = []
    for k in range(1, order + 1):
        found = []
        for path in paths:
            at = [[_stand_ins(x, value_is_nan, path, m) for x in p.xs] for m in (1, 2)]
            q = Problem(p.f, at[0], p.dirs, p.u)
            d1 = _derivative_at(q, at[0], k)
            if value_is_nan:
                found.append(d1)
            else:
                found.append(_limit(d1, _derivative_at(q, at[1], k)))
        consensus = found[0]
        if any(not _finite(d) for d in found) or not all(
            _same_float(consensus, d) for d in found[1:]
        ):
            consensus = None
        elif mpmath.isinf(consensus):
            consensus = None  # inf: the answer must be non-finite anyway
        out.append(Expect("limit", consensus))
    return out


def _same_float(a: Any, b: Any) -> bool:
    return all(
        (to_float(a, d) == to_float(b, d))
        or abs(to_float(a, d) - to_float(b, d)) <= 1e-9 * abs(to_float(a, d))
        for d in (np.float64,)
    )


def expect(p: Problem, order: int = 3) -> tuple[Any, list[Expect]]:
    """The value at p.xs and what each derivative of order 1..`order` must be."""
    finite = all(all(_finite(v) for v in np.asarray(x, dtype=object).reshape(-1)) for x in p.xs)
    if finite:
        return expect_finite(p, order)
    with mpmath.workprec(P1):
        value = _safe(p.f)(*p.xs) if p.u is None else _safe(p.scalar)(p.xs)
    return value, expect_nonfinite(p, value, order)
