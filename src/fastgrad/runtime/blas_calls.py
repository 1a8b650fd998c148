"""Calls into BLAS by address from compiled code (the plan interpreter, runtime.vm, and the
products it cuts across the cores, runtime.gemm_split): `cblas_?gemm` in row-major order,
its precision chosen at run time; and the cast of an address to the int64 tables both
read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from fastgrad.runtime.blas import ROW_MAJOR


def by_precision(builder: Any, double: Any, call: Callable[[Any], None]) -> None:
    """Emit `call(double)` if the int64 `double` is not 0, else `call(float)`: BLAS's d and
    s routines take their scalars in the matrices' precision."""
    zero = ir.Constant(ir.IntType(64), 0)
    with builder.if_else(builder.icmp_signed("!=", double, zero)) as (then, otherwise):
        with then:
            call(ir.DoubleType())
        with otherwise:
            call(ir.FloatType())


def _gemm_typing(
    typingctx: Any, address: Any, double: Any, ta: Any, tb: Any, m: Any, n: Any, k: Any,
    alpha: Any, a: Any, lda: Any, b: Any, ldb: Any, beta: Any, c: Any, ldc: Any,
) -> Any:  # fmt: skip
    """Call `cblas_?gemm` at integer `address` (d if `double`, else s) in row-major order
    with the other arguments (int64s; alpha and beta float64s; the matrices' addresses)."""
    signature = types.void(address, double, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def codegen(context: Any, builder: Any, sig: Any, values: Any) -> Any:
        i32, i64 = ir.IntType(32), ir.IntType(64)
        char_p = ir.IntType(8).as_pointer()

        def call(real: Any) -> None:
            kinds = [i32, i32, i32, i64, i64, i64, real, char_p, i64, char_p, i64, real]
            kinds += [char_p, i64]
            fnty = ir.FunctionType(ir.VoidType(), kinds)
            ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc = values[2:]
            scalar = (
                (lambda x: x)
                if real == ir.DoubleType()
                else (lambda x: builder.fptrunc(x, ir.FloatType()))
            )
            ptr = lambda x: builder.inttoptr(x, char_p)  # noqa: E731
            arguments = [ir.Constant(i32, ROW_MAJOR), builder.trunc(ta, i32)]
            arguments += [builder.trunc(tb, i32), m, n, k, scalar(alpha), ptr(a), lda]
            arguments += [ptr(b), ldb, scalar(beta), ptr(c), ldc]
            builder.call(builder.inttoptr(values[0], fnty.as_pointer()), arguments)

        by_precision(builder, values[1], call)
        return context.get_dummy_value()

    return signature, codegen


def _int64_pointer_typing(typingctx: Any, address: Any) -> Any:
    """Integer `address` as an int64 pointer (a table)."""
    signature = types.CPointer(types.int64)(address)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], ir.IntType(64).as_pointer())

    return signature, codegen


# Typed as Any: the intrinsics' first argument (the typing context) is Numba's.
gemm: Any = intrinsic(_gemm_typing)
int64_pointer: Any = intrinsic(_int64_pointer_typing)
