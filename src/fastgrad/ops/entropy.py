"""x log y and the entropies of scipy.special: xlogy, xlog1py, entr, rel_entr, kl_div.

Compositions of log and where, written so that the points where x is 0 or y is at the edge
of log's domain give NumPy's values and exact (or honestly infinite or nan) derivatives at
every order (docs/conventions.md, xlogy-at-zero and edges-of-the-domain).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.core.tracing import aval_of
from fastgrad.ops.base import astype
from fastgrad.ops.elementwise import isfinite, isnan, logical_and, logical_not, logical_or, where
from fastgrad.ops.math import cbrt, cosh, log, log1p, sqrt
from fastgrad.ops.shape import ones_like, zeros_like
from fastgrad.ops.special import quiet

__all__: list[str] = []  # public under fastgrad.scipy.special


def _x_log(x: Any, y: Any, log_fn: Callable[[Any], Any], edge: float, safe: float) -> Any:
    """x * log_fn(y), 0 where x == 0 (unless y is nan), for xlogy (log, edge 0) and xlog1py
    (log1p, edge -1). Its derivative in x is log_fn(y) wherever y is, as in JAX: where
    x == 0 and log_fn(y) is -inf (y at the edge) or inf (y = inf), a cbrt of x gives the
    value 0 with that infinite slope (and nan beyond); below the edge, nan. In y it is
    x / y, 0 along x == 0, where the function is 0 (docs/conventions.md, xlogy-at-zero)."""
    zero = logical_and(x == 0, logical_not(isnan(y)))
    inside = logical_and(isfinite(y), y > edge)
    value = x * log_fn(where(logical_and(zero, logical_not(inside)), safe, y))
    # Where x == 0 and y is outside log's domain, add 0 with log_fn(y)'s slope in x, in the
    # selected branch (forward mode drops an unselected one's): sign * cbrt(x) at x == 0,
    # with sign -1 at the edge (-inf), 1 at y = inf (inf) and 0 below (0 * inf: nan).
    outside = logical_and(zero, logical_not(inside))
    sign = astype(where(y == np.inf, 1.0, where(y == edge, -1.0, 0.0)), aval_of(value).dtype)
    return value + where(outside, sign * cbrt(where(outside, x, 1.0)), 0.0)


@quiet
def xlogy(x: Any, y: Any) -> Any:
    """x * log(y), 0 where x == 0 (unless y is NaN); d/dx is log(y), as in JAX.

    >>> float(xlogy(0.0, 0.0)), float(xlogy(2.0, np.e)), fg.grad(xlogy)(0.0, 0.0)
    (0.0, 2.0, array(-inf))
    """
    return _x_log(x, y, log, 0.0, 1.0)


@quiet
def xlog1py(x: Any, y: Any) -> Any:
    """x * log1p(y), 0 where x == 0 (unless y is NaN); d/dx is log1p(y), as in JAX.

    >>> float(xlog1py(0.0, -1.0)), fg.grad(xlog1py, argnums=1)(2.0, 1.0)
    (0.0, array(1.))
    """
    return _x_log(x, y, log1p, -1.0, 0.0)


@quiet
def entr(x: Any) -> Any:
    """-x log(x) for x > 0, 0 at 0, -inf below.

    >>> float(entr(0.5)), float(entr(0.0)), float(entr(-1.0))
    (0.34657359027997264, 0.0, -inf)
    """
    return 0.0 - rel_entr(x, ones_like(x))  # +0.0 at 0


def _relative_entropy(x: Any, y: Any, extra: Callable[[Any, Any], Any]) -> Any:
    # x log(x / y) + extra(x, y) for x, y > 0; extra(0, y) for x == 0 <= y; inf (nan for nan)
    # else. Pieces on safe stand-ins: at x == 0 -sqrt(x)'s derivatives (-inf, not a silent 0),
    # outside cosh(x) * inf's (inf or nan at every order).
    inside, edge = logical_and(x > 0, y > 0), logical_and(x == 0, y >= 0)
    xs, ys, xe, ye = (where(c, v, 1.0) for c in (inside, edge) for v in (x, y))
    xo, yo = (where(logical_or(inside, edge), 0.0, v) for v in (x, y))
    # At (0, 0) the slope depends on the direction (finite into x, y > 0, inf elsewhere):
    # 0 * cbrt of both, on stand-ins away from it, makes every derivative nan there.
    corner = logical_and(edge, y == 0)
    xc, yc = where(corner, x, 1.0), where(corner, y, 1.0)
    kink = where(corner, 0.0 * (cbrt(xc) + cbrt(yc)), sqrt(xe))
    at_edge = where(edge, extra(xe, ye) - kink, (cosh(xo) + cosh(yo)) * np.inf)
    return where(inside, xs * log(xs / ys) + extra(xs, ys), at_edge)


@quiet
def rel_entr(x: Any, y: Any) -> Any:
    """x log(x / y) for x, y > 0; 0 where x == 0 <= y; inf otherwise.

    >>> rel_entr(np.array([0.0, 2.0, 1.0]), np.array([1.0, 2.0, -1.0]))
    array([ 0.,  0., inf])
    >>> fg.grad(rel_entr)(1.0, 1.0)
    array(1.)
    """
    return _relative_entropy(x, y, lambda x, y: zeros_like(x))


@quiet
def kl_div(x: Any, y: Any) -> Any:
    """x log(x / y) - x + y for x, y > 0; y where x == 0 <= y; inf otherwise.

    >>> kl_div(np.array([0.0, 2.0]), np.array([3.0, 2.0])), fg.grad(kl_div, argnums=1)(1.0, 2.0)
    (array([3., 0.]), array(0.5))
    """
    return _relative_entropy(x, y, lambda x, y: y - x)
