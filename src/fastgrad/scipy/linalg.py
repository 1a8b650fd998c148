"""SciPy's linalg functions that fastgrad covers, with SciPy's conventions (Cholesky
factors upper by default, triangular solves of the upper triangle by default); the
functions live with their primitives in fastgrad.ops.linalg and .decompositions."""

from numpy.linalg import LinAlgError

from fastgrad.ops.decompositions import scipy_eigh as eigh
from fastgrad.ops.decompositions import svd
from fastgrad.ops.linalg import cho_factor, cho_solve, det, inv, solve, solve_triangular
from fastgrad.ops.linalg import scipy_cholesky as cholesky

__all__ = [
    "LinAlgError", "cho_factor", "cho_solve", "cholesky", "det", "eigh", "inv", "solve",
    "solve_triangular", "svd",
]  # fmt: skip
