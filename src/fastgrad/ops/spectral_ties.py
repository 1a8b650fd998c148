"""Repeated eigenvalues and singular values in the rules of eigh and svd.

At a tie the eigenvectors (singular vectors) of the repeated value are any orthonormal
basis of its space, and LAPACK picks one. The gradient of the values,
V diag(g) V^T, depends on that pick unless the cotangents g agree across the tie: it is
g P for the tie's projector P then (the derivative of any symmetric function of the tied
values), and otherwise there is no derivative at all (a single eigenvalue of a double one
moves as 1 - |t| along some directions). These helpers find the ties, poison with nan the
gradient of a matrix whose tie gets unequal cotangents, and give forward mode a tangent
that no basis changes (see docs/conventions.md, `repeated-eigenvalues`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastgrad.core.tracing import aval_of
from fastgrad.ops.base import astype, reshape, sum
from fastgrad.ops.elementwise import (
    abs,
    less_equal,
    logical_and,
    logical_not,
    logical_or,
    where,
)
from fastgrad.ops.reduction import max

__all__: list[str] = []

# LAPACK's symmetric eigensolvers and SVD give each value with an absolute error of at most
# p(n) eps ||A||_2 (backward stability; ||A||_2 is the largest |value|), so two computed
# values closer than that cannot be told from a repeated one, and their computed vectors
# are an arbitrary basis of the pair's space anyway. p(n) = 8n: matrices built with an
# exactly repeated eigenvalue (Q diag(d) Q^T, random Q) give computed pairs within
# 6 eps ||A|| at n = 2 and 14 eps ||A|| at n = 100 in float64 (1 eps in float32).
SLACK = 8


def ties(values: Any) -> Any:
    """(..., n, n) bool: which pairs of the (..., n) values are equal within LAPACK's
    accuracy (each value ties with itself). nan ties with nothing."""
    shape = aval_of(values).shape
    n = shape[-1]
    eps = float(np.finfo(aval_of(values).dtype).eps)
    tolerance = (SLACK * n * eps) * max(abs(values), axis=-1, keepdims=True)
    row = reshape(values, shape[:-1] + (1, n))
    col = reshape(values, shape + (1,))
    return less_equal(abs(row - col), reshape(tolerance, shape[:-1] + (1, 1)))


def split_ties(tied: Any, g: Any, reached: Any = None) -> Any:
    """(..., 1, 1) bool: per matrix, whether two tied values get different cotangents `g`
    (..., n), or the vectors of a tied value get a cotangent (`reached`, (..., n) bool, for
    eigh and svd with vectors): a derivative that does not exist.

    "Different" is beyond sqrt(eps) times the largest |g|: a symmetric f of the values
    hands the tie f'(l_i) at values that differ by their rounding (8n eps ||A||), so its
    cotangents differ by about f'' times that, while a cotangent that picks one value of
    the tie, or weighs them unequally, differs by a fraction of |g| itself."""
    shape = aval_of(g).shape
    n = shape[-1]
    eps = float(np.finfo(aval_of(g).dtype).eps)
    tolerance = reshape(np.sqrt(eps) * max(abs(g), axis=-1, keepdims=True), shape[:-1] + (1, 1))
    gap = abs(reshape(g, shape[:-1] + (1, n)) - reshape(g, shape + (1,)))
    differ = logical_not(less_equal(gap, tolerance))  # nan cotangents differ
    if reached is not None:
        differ = logical_or(
            differ,
            logical_or(reshape(reached, shape[:-1] + (1, n)), reshape(reached, shape + (1,))),
        )
    others = logical_and(tied, ~np.eye(n, dtype=bool))  # a value with another
    return sum(logical_and(others, differ), axis=(-2, -1), keepdims=True) > 0


def poisoned(bad: Any, x: Any) -> Any:
    """x, with nan for the matrices where `bad` holds."""
    return where(bad, np.nan, x)


def tie_mean(tied: Any, d: Any) -> Any:
    """Each of the (..., n) tangents `d` replaced by its mean over the values it ties with:
    the tangent of a tied value in forward mode. It is the same in every basis LAPACK could
    pick, exact for any symmetric function of the tied values (their sum's tangent is the
    trace of the tie's block), and for a double value the average of the one-sided
    derivatives (as abs'(0) = 0). Where the values are distinct it is `d` itself."""
    shape = aval_of(d).shape
    rows = where(tied, reshape(d, shape[:-1] + (1, shape[-1])), 0.0)
    return sum(rows, axis=-1) / astype(sum(tied, axis=-1), aval_of(d).dtype)
