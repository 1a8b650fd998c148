"""The plan interpreter's rows for matmuls and views (runtime.vm), worked out from the
arrays a run gave: BLAS's transpose flags and leading dimensions by NumPy's own rules, so
that a product has the bits `np.matmul` gives it, and a view's offset from its input;
and a plan's views themselves (`view`), which a plan's build also makes of stand-ins
(runtime.thread_budget)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from fastgrad.ops.shape import _as_slices as as_slices
from fastgrad.runtime.blas import NO_TRANS, ROW_MAJOR, TRANS, blas_address

COL_MAJOR = 102

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


def _blas_operands(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """Whether `out = a @ b` is of matrices of one float dtype BLAS has routines for, into
    a C-contiguous output."""
    return (
        out.dtype in _FLOATS
        and a.dtype == b.dtype == out.dtype
        and a.ndim >= 2
        and b.ndim >= 2
        and out.flags.c_contiguous
    )


def gemm_row(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool) -> Any:
    """(gemm's and syrk's addresses, [float64?, trans a, trans b, m, n, k, lda, ldb, ldc,
    beta], [count, byte offsets of a, b and out per matrix]) for `out (+)= a @ b`, or None where
    the interpreter leaves the product to NumPy: not float32/float64 of one dtype, a
    vector operand, a dimension of 1 or 0 (NumPy then calls gemv, dot or its own loop,
    whose bits may differ), or an operand no BLAS call takes without a copy."""
    dtype = out.dtype
    if not _blas_operands(a, b, out):
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
    offsets = _batch_offsets((a, b, out))
    params = [int(dtype == np.float64), left[0], right[0], m, n, k, left[1], right[1], n]
    return addresses, [*params, int(accumulate)], offsets


def _batch_offsets(arrays: tuple[np.ndarray, ...]) -> list[int]:
    """[count, byte offsets of each of `arrays` per matrix of the batch] (the last array
    the output, whose batch axes are the broadcast ones)."""
    if all(x.ndim <= 2 for x in arrays):  # (one matrix each: a T=200 RNN's 999 products)
        return [1] + [0] * len(arrays)
    offsets: list[int] = []
    for index in itertools.product(*map(range, arrays[-1].shape[:-2])):
        for x in arrays:
            dims = x.shape[:-2]
            lead = index[len(index) - len(dims) :]
            offsets.append(
                sum(i * s for i, d, s in zip(lead, dims, x.strides[:-2], strict=True) if d != 1)
            )
    return [len(offsets) // len(arrays), *offsets]


def _blasable(outer: int, inner: int, cols: int, item: int) -> bool:
    """NumPy's `is_blasable2d`: rows of unit stride `inner`, `outer` a multiple of the
    item at least `cols` items."""
    return inner == item and outer % item == 0 and cols <= outer // item < 2**62


def vector_row(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Any:
    """(kind, BLAS address or 0, params, operand order, [count, byte offsets per matrix])
    for `out = a @ b` whose matrices have a dimension of 1, computed as `np.matmul` does
    (its matmul loop's special cases, in its order): "dot" (a row times a column:
    cblas_?dot, added to a float64 0 as NumPy does), "gemv" (a matrix times a vector,
    either side: cblas_?gemv with NumPy's order, transpose flag and increments; operand
    order (1, 0) when the matrix is `b`), or "noblas" (an outer product, a product of
    length 1, an operand BLAS does not take: NumPy's own loop, `out = 0; out += a * b` in
    the dtype; NumPy's dot sums so too where BLAS does not take its strides). None
    where the interpreter leaves the product to NumPy: not float32/float64 of one dtype,
    a dimension of 0, no dimension of 1, or an output not C-contiguous."""
    dtype = out.dtype
    if not _blas_operands(a, b, out):
        return None
    (m, k), p = a.shape[-2:], b.shape[-1]
    if min(m, k, p) == 0 or min(m, k, p) > 1 or out.shape[-2:] != (m, p) or k > 2**30:
        return None
    item = dtype.itemsize
    (is1_m, is1_n), (is2_n, is2_p), (os_m, os_p) = a.strides[-2:], b.strides[-2:], out.strides[-2:]
    double = int(dtype == np.float64)
    order: tuple[int, ...] = (0, 1)
    strided = is1_n > 0 and is2_n > 0 and is1_n % item == 0 and is2_n % item == 0
    if m == 1 and p == 1 and strided:  # row @ column (else NumPy's dot sums as noblas)
        kind, params = "dot", [double, k, is1_n // item, is2_n // item]
    elif k == 1 or (
        m == 1 and p == 1
    ):  # a product of length 1 (outer or 1 x 1 times a vector): NumPy's loop
        kind, params = "noblas", [double, m, k, p, is1_m, is1_n, is2_n, is2_p, os_m, os_p]
    else:
        blasable = [_blasable(*s, item) for s in ((is1_m, is1_n, k), (is1_n, is1_m, m))]
        blasable += [_blasable(*s, item) for s in ((is2_n, is2_p, p), (is2_p, is2_n, k))]
        if m == 1 and any(blasable[2:]) and _blasable(is1_n, item, 1, item):
            matrix, vector, rows = (is2_p, is2_n), is1_n, p  # vector @ matrix: b.T @ a
            order, step = (1, 0), os_p
        elif p == 1 and any(blasable[:2]) and _blasable(is2_n, item, 1, item):
            matrix, vector, rows, step = (is1_m, is1_n), is2_n, m, os_m
        else:
            kind, params = "noblas", [double, m, k, p, is1_m, is1_n, is2_n, is2_p, os_m, os_p]
            return kind, 0, params, order, _batch_offsets((a, b, out))
        # NumPy's gemv: column-major when the matrix's rows are contiguous, with Trans.
        if _blasable(*matrix, k, item):
            layout, lda = COL_MAJOR, matrix[0] // item
        else:
            layout, lda = ROW_MAJOR, matrix[1] // item
        kind = "gemv"
        params = [double, layout, k, rows, lda, vector // item, step // item]
    address = 0 if kind == "noblas" else blas_address(kind, dtype)
    if address is None:
        return None
    operands = (a, b) if order == (0, 1) else (b, a)
    return kind, address, params, order, _batch_offsets((*operands, out))


def view(op: str, x: np.ndarray, arg: Any) -> np.ndarray:
    """A plan's view step (runtime.plan_steps): `op` of `x` as NumPy makes it, `arg` as
    VIEW_ARG prepares it (a copy only where NumPy's reshape needs one)."""
    if op == "slice":
        return x[arg]
    if op == "transpose":
        return x.transpose(arg)
    if op == "reshape":
        return x.reshape(arg)
    return np.broadcast_to(x, arg)


#: The ops a plan runs as views (`view`), and how each one's argument is prepared, once.
VIEW_ARG = {
    "reshape": lambda params: params["shape"],
    "broadcast_to": lambda params: params["shape"],
    "transpose": lambda params: params["axes"],
    "slice": lambda params: as_slices(params["index"]),
}


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
