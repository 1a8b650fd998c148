"""NumPy's linalg namespace: solves, determinants, decompositions, norms and products that
work on plain arrays and traced values alike, batched over leading axes. The functions
live with their primitives in fastgrad.ops.linalg, .decompositions, .matrix_functions and
.array_api; `spectral_sum` (trace(f(a))) is fastgrad's own, in .spectral_functions.
"""

from numpy.linalg import LinAlgError

from fastgrad.ops import array_api as _array_api
from fastgrad.ops.decompositions import (
    EighResult,
    QRResult,
    SVDResult,
    eigh,
    eigvalsh,
    pinv,
    qr,
    svd,
    svdvals,
)
from fastgrad.ops.determinant import det
from fastgrad.ops.linalg import (
    SlogdetResult,
    cholesky,
    inv,
    matrix_transpose,
    slogdet,
    solve,
)
from fastgrad.ops.matrix_functions import (
    cond,
    lstsq,
    matrix_norm,
    matrix_power,
    matrix_rank,
    multi_dot,
    norm,
    tensorinv,
    tensorsolve,
    vector_norm,
)
from fastgrad.ops.numpy_interop import register_namespace
from fastgrad.ops.products import matmul
from fastgrad.ops.spectral_functions import spectral_sum

# NumPy 2's linalg takes the vectors and matrices in the last axes (fastgrad.ops.array_api).
cross, diagonal, outer = (
    _array_api.linalg_cross,
    _array_api.linalg_diagonal,
    _array_api.linalg_outer,
)
tensordot, trace, vecdot = _array_api.linalg_tensordot, _array_api.linalg_trace, _array_api.vecdot

__all__ = [
    "EighResult", "LinAlgError", "QRResult", "SVDResult", "SlogdetResult", "cholesky",
    "cond", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "lstsq", "matmul",
    "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "multi_dot", "norm",
    "outer", "pinv", "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "tensorinv",
    "tensorsolve", "trace", "vecdot", "vector_norm",
]  # fmt: skip

# numpy.linalg.solve(x, ...) on a traced x calls these.
register_namespace("numpy.linalg", {name: globals()[name] for name in __all__})
# fastgrad's own: trace(f(a)) with exact second derivatives at repeated eigenvalues.
__all__ += ["spectral_sum"]
