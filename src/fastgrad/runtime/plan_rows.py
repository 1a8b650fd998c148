"""The plan interpreter's rows for matmuls and views (runtime.vm), worked out from the
arrays a run gave: BLAS's transpose flags and leading dimensions by NumPy's own rules, so
that a product has the bits `np.matmul` gives it, and a view's offset from its input.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from fastgrad.runtime.blas import NO_TRANS, TRANS, blas_address

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _blas_layout(strides: tuple[int, ...], rows: int, cols: int, item: int) -> Any:
    """(transpose flag, leading dimension) of a matrix as `np.matmul` hands it to gemm
    (rows unit-strided first), or None where NumPy would not use BLAS for it."""
    outer, inner = strides
    if inner == item and outer % item == 0 and outer // item >= cols:
        return NO_TRANS, outer // item
    if outer == item and inner % item == 0 and inner // item >= rows:
        return TRANS, inner // item
    return None


def gemm_row(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool) -> Any:
    """(gemm's and syrk's addresses, [float64?, trans a, trans b, m, n, k, lda, ldb, ldc,
    beta], [count, byte offsets of a, b and out per matrix]) for `out (+)= a @ b`, or None where
    the interpreter leaves the product to NumPy: not float32/float64 of one dtype, a
    vector operand, a dimension of 1 or 0 (NumPy then calls gemv, dot or its own loop,
    whose bits may differ), or an operand no BLAS call takes without a copy."""
    dtype = out.dtype
    if not (
        dtype in _FLOATS
        and a.dtype == b.dtype == dtype
        and a.ndim >= 2
        and b.ndim >= 2
        and out.flags.c_contiguous
    ):
        return None
    (m, k), n = a.shape[-2:], b.shape[-1]
    if min(m, n, k) <= 1 or out.shape[-2:] != (m, n):
        return None
    item = dtype.itemsize
    left = _blas_layout(a.strides[-2:], m, k, item)
    right = _blas_layout(b.strides[-2:], k, n, item)
    addresses = blas_address("gemm", dtype), blas_address("syrk", dtype)
    if left is None or right is None or None in addresses:
        return None
    batch = out.shape[:-2]
    offsets: list[int] = []
    for index in itertools.product(*map(range, batch)):
        for x in (a, b, out):
            dims = x.shape[:-2]
            lead = index[len(index) - len(dims) :]
            offsets.append(
                sum(i * s for i, d, s in zip(lead, dims, x.strides[:-2], strict=True) if d != 1)
            )
    params = [int(dtype == np.float64), left[0], right[0], m, n, k, left[1], right[1], n]
    return addresses, [*params, int(accumulate)], [len(offsets) // 3, *offsets]


def view_offset(x: np.ndarray, y: np.ndarray) -> int | None:
    """The byte offset of view `y` into `x` (a reshape, transpose, slice or broadcast of
    it), or None when `y` is not a view of `x`'s memory (a reshape that copied) or either
    is empty.

    >>> x = np.zeros((3, 4))
    >>> view_offset(x, x[1:, 2:]), view_offset(x, x.T), view_offset(x.T, x.T.reshape(12))
    (48, 0, None)
    """
    if x.size == 0 or y.size == 0 or not np.may_share_memory(x, y):
        return None
    return int(y.ctypes.data - x.ctypes.data)
