"""The plan interpreter's rows for products with a dimension of 1 (runtime.vm): a matrix
times a vector on either side, a row times a column, an outer product. They compute what
`np.matmul` computes, the same way (runtime.plan_rows.vector_row picks the routine and its
arguments by NumPy's own rules), so a scan body with `W @ h` runs whole in the
interpreter (a LOOP) with the bits of the step runner.

Each row's second entry is the index of `vector_function` among the table's functions
(the interpreter calls it with the row; it also runs runtime.vm_arrays' rows); the rest:
  GEMV: [GEMV, gemv, float64?, order, n, m, lda, incx, incy, pointer matrix, pointer
    vector, pointer out, count, <count triples of byte offsets>]: cblas_?gemv(order,
    Trans, n, m, 1, matrix, lda, vector, incx, 0, out, incy), as NumPy's gemv
  DOT: [DOT, dot, float64?, n, inc a, inc b, pointer a, pointer b, pointer out, count,
    <triples>]: `out = 0.0 + cblas_?dot(...)` in float64, then the dtype, as NumPy's dot
  NOBLAS: [NOBLAS, float64?, m, k, p, 6 byte strides (a's two, b's two, out's two),
    pointer a, pointer b, pointer out, count, <triples>]: NumPy's matmul loop without
    BLAS, `out[i, j] = 0; out[i, j] += a[i, n] * b[n, j]` in the dtype
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from fastgrad.compiler.machine_code import OnceLock, cached_cfunc, source_tag
from fastgrad.runtime import blas, vm_arrays, vm_rows
from fastgrad.runtime.blas import TRANS
from fastgrad.runtime.vm_arrays import COPY, run_array, typed_pointer
from fastgrad.runtime.vm_rows import DOT, GEMV, NOBLAS

_f64, _f32 = typed_pointer(types.float64), typed_pointer(types.float32)


def _gemv(real: Any) -> Any:
    """An intrinsic calling `cblas_?gemv` (s for float, d for double) at an integer address
    with int64 sizes and the matrices' addresses; alpha 1, beta 0, Trans."""

    def typing(
        typingctx: Any, address: Any, order: Any, n: Any, m: Any, a: Any, lda: Any, x: Any,
        incx: Any, y: Any, incy: Any,
    ) -> Any:  # fmt: skip
        signature = types.void(address, order, n, m, a, lda, x, incx, y, incy)

        def codegen(context: Any, builder: Any, sig: Any, values: Any) -> Any:
            i32, i64 = ir.IntType(32), ir.IntType(64)
            char_p = ir.IntType(8).as_pointer()
            kinds = [i32, i32, i64, i64, real, char_p, i64, char_p, i64, real, char_p, i64]
            fnty = ir.FunctionType(ir.VoidType(), kinds)
            order, n, m, a, lda, x, incx, y, incy = values[1:]
            ptr = lambda v: builder.inttoptr(v, char_p)  # noqa: E731
            arguments = [builder.trunc(order, i32), ir.Constant(i32, TRANS), n, m]
            arguments += [ir.Constant(real, 1.0), ptr(a), lda, ptr(x), incx]
            arguments += [ir.Constant(real, 0.0), ptr(y), incy]
            builder.call(builder.inttoptr(values[0], fnty.as_pointer()), arguments)
            return context.get_dummy_value()

        return signature, codegen

    return intrinsic(typing)


def _dot(real: Any, result: Any) -> Any:
    """An intrinsic calling `cblas_?dot` at an integer address: (n, x, incx, y, incy)."""

    def typing(typingctx: Any, address: Any, n: Any, x: Any, incx: Any, y: Any, inc: Any) -> Any:
        signature = result(address, n, x, incx, y, inc)

        def codegen(context: Any, builder: Any, sig: Any, values: Any) -> Any:
            i64, char_p = ir.IntType(64), ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(real, [i64, char_p, i64, char_p, i64])
            n, x, incx, y, incy = values[1:]
            arguments = [n, builder.inttoptr(x, char_p), incx, builder.inttoptr(y, char_p), incy]
            return builder.call(builder.inttoptr(values[0], fnty.as_pointer()), arguments)

        return signature, codegen

    return intrinsic(typing)


_sgemv, _dgemv = _gemv(ir.FloatType()), _gemv(ir.DoubleType())
_sdot, _ddot = _dot(ir.FloatType(), types.float32), _dot(ir.DoubleType(), types.float64)


@njit(inline="always")
def run_vector(table: Any, p: int, op: int) -> None:  # pragma: no cover - compiled
    """The GEMV, DOT or NOBLAS row at `table[p]` (the module's docstring; `op` its first
    entry)."""
    ptrs, functions = table[2], table[1]
    double = table[p + 2] if op != NOBLAS else table[p + 1]
    head = 9 if op == GEMV else 6 if op == DOT else 11
    a = table[ptrs + table[p + head]]
    b = table[ptrs + table[p + head + 1]]
    c = table[ptrs + table[p + head + 2]]
    first = p + head + 4
    for q in range(first, first + 3 * table[p + head + 3], 3):
        pa, pb, pc = a + table[q], b + table[q + 1], c + table[q + 2]
        if op == GEMV:
            f = table[functions + table[p + 1]]
            order, n, m, lda = table[p + 3], table[p + 4], table[p + 5], table[p + 6]
            incx, incy = table[p + 7], table[p + 8]
            if double:
                _dgemv(f, order, n, m, pa, lda, pb, incx, pc, incy)
            else:
                _sgemv(f, order, n, m, pa, lda, pb, incx, pc, incy)
        elif op == DOT:
            f = table[functions + table[p + 1]]
            n, inca, incb = table[p + 3], table[p + 4], table[p + 5]
            if double:
                _f64(pc)[0] = 0.0 + _ddot(f, n, pa, inca, pb, incb)
            else:
                _f32(pc)[0] = np.float32(0.0 + np.float64(_sdot(f, n, pa, inca, pb, incb)))
        else:
            _noblas(table, p, double, pa, pb, pc)


@njit(inline="always")
def _noblas(table: Any, p: int, double: int, pa: int, pb: int, pc: int) -> None:  # pragma: no cover
    m, k, n = table[p + 2], table[p + 3], table[p + 4]
    s1m, s1n, s2n, s2p, som, sop = (
        table[p + 5], table[p + 6], table[p + 7], table[p + 8], table[p + 9], table[p + 10],
    )  # fmt: skip
    for i in range(m):
        for j in range(n):
            if double:
                total = 0.0
                for r in range(k):
                    total += _f64(pa + i * s1m + r * s1n)[0] * _f64(pb + r * s2n + j * s2p)[0]
                _f64(pc + i * som + j * sop)[0] = total
            else:
                single = np.float32(0.0)
                for r in range(k):
                    single += _f32(pa + i * s1m + r * s1n)[0] * _f32(pb + r * s2n + j * s2p)[0]
                _f32(pc + i * som + j * sop)[0] = single


def _vector_row(pointer: Any, p: int) -> None:  # pragma: no cover - compiled
    """The row at `table[p]`, [op, this function's index, <the row as the module's
    docstring gives it, from its second entry>], of the table at `pointer`. Compiled as a
    C function of its own (`vector_function`), which the interpreter calls by address:
    the interpreter's loop does not carry these routines (~0.9 s of CPU more to compile
    from an empty cache), and a plan without such products never compiles them."""
    table = carray(pointer, (pointer[6],))
    op = table[p]
    if op >= COPY:  # runtime.vm_arrays' rows: the same function serves them
        run_array(table, p, op)
    else:
        run_vector(table, p + 1, op)


_FUNCTION: list[Any] = []  # the compiled `_vector_row`, kept alive
_LOCK = OnceLock()


def vector_function() -> int:
    """The address of `_vector_row` compiled (or loaded from fastgrad's cache), a C
    function `(int64* table, int64 at)` as the interpreter's loop is."""
    with _LOCK:
        if not _FUNCTION:
            tag = source_tag(
                "vector rows", __file__, blas.__file__, vm_arrays.__file__, vm_rows.__file__
            )
            signature = types.void(types.CPointer(types.int64), types.int64)
            _FUNCTION.append(cached_cfunc(_vector_row, signature, tag))
        return int(_FUNCTION[0].address)
