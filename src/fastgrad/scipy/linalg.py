"""SciPy's linalg functions that fastgrad covers: triangular and Cholesky solves (SciPy's
conventions: upper triangles by default), with NumPy's solve, inv, det and decompositions.
"""

from typing import Any

from numpy.linalg import LinAlgError

from fastgrad.ops.decompositions import eigh, pinv, qr, svd
from fastgrad.ops.linalg import (
    cho_factor,
    cho_solve,
    det,
    inv,
    solve,
    solve_triangular,
)
from fastgrad.ops.linalg import cholesky as _lower_cholesky


def cholesky(
    a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True
) -> Any:
    """SciPy's ``linalg.cholesky``: the upper factor U (a = U^T U) by default, the lower one
    with `lower=True`. Only that triangle of `a` is read; `overwrite_a` and `check_finite`
    have no effect.

    >>> import numpy as np
    >>> cholesky(np.array([[4.0, 2.0], [2.0, 5.0]]))
    array([[2., 1.],
           [0., 2.]])
    """
    return _lower_cholesky(a, upper=not lower)


__all__ = [
    "LinAlgError", "cho_factor", "cho_solve", "cholesky", "det", "eigh", "inv", "pinv", "qr",
    "solve", "solve_triangular", "svd",
]  # fmt: skip
