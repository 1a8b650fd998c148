"""SciPy's linalg functions that fastgrad covers, with SciPy's conventions (Cholesky
factors upper by default, triangular solves of the upper triangle by default); the
functions live with their primitives in fastgrad.ops.linalg and .decompositions."""

from numpy.linalg import LinAlgError

from fastgrad.ops.decompositions import scipy_eigh as eigh
from fastgrad.ops.decompositions import svd
from fastgrad.ops.determinant import det
from fastgrad.ops.linalg import cho_factor, cho_solve, inv, solve, solve_triangular
from fastgrad.ops.linalg import scipy_cholesky as cholesky
from fastgrad.ops.matrix_calculus import expm, lu, lu_factor, lu_solve, solve_sylvester, sqrtm

__all__ = [
    "LinAlgError", "cho_factor", "cho_solve", "cholesky", "det", "eigh", "expm", "inv", "lu",
    "lu_factor", "lu_solve", "solve", "solve_sylvester", "solve_triangular", "sqrtm", "svd",
]  # fmt: skip
