"""NumPy's linalg namespace: solves, determinants, decompositions and norms that work on
plain arrays and traced values alike, batched over leading axes. The functions live with
their primitives in fastgrad.ops.linalg, .decompositions and .matrix_functions.
"""

from numpy.linalg import LinAlgError

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
from fastgrad.ops.linalg import (
    SlogdetResult,
    cholesky,
    det,
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
    vector_norm,
)
from fastgrad.ops.numpy_interop import register_namespace

__all__ = [
    "EighResult", "LinAlgError", "QRResult", "SVDResult", "SlogdetResult", "cholesky",
    "cond", "det", "eigh", "eigvalsh", "inv", "lstsq", "matrix_norm", "matrix_power",
    "matrix_rank", "matrix_transpose", "multi_dot", "norm", "pinv", "qr", "slogdet", "solve",
    "svd", "svdvals", "vector_norm",
]  # fmt: skip

# numpy.linalg.solve(x, ...) on a traced x calls these.
register_namespace("numpy.linalg", {name: globals()[name] for name in __all__})
