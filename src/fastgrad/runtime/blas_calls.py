"""Calls into BLAS by address from compiled code (the plan interpreter, runtime.vm, and the
products it cuts across the cores, runtime.gemm_split): `cblas_?gemm` in row-major order,
its precision chosen at run time; the cast of an address to the int64 tables both read;
what the cut's worker calls by address or reads (`int f(sem_t*)` for the POSIX
semaphores, an array element's address, the processor's cycle counter for its timeline,
the C library's semaphore calls); and the test both make of each matrix before a
product, whether it is a syrk (`may_be_syrk`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from fastgrad.compiler.machine_code import helper_njit
from fastgrad.runtime import gemm_bands
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


def _sem_typing(typingctx: Any, address: Any, sem: Any) -> Any:
    """Call `int f(sem_t*)` at integer `address` on the semaphore at integer `sem`."""
    signature = types.int64(address, sem)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        char_p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [char_p])
        function = builder.inttoptr(args[0], fnty.as_pointer())
        result = builder.call(function, [builder.inttoptr(args[1], char_p)])
        return builder.sext(result, ir.IntType(64))

    return signature, codegen


def _address_typing(typingctx: Any, array: Any, index: Any) -> Any:
    """The address of `array[index]` of a 1-D int64 array, as an integer."""
    signature = types.int64(array, index)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(builder.gep(data, [args[1]]), ir.IntType(64))

    return signature, codegen


def _cycles_typing(typingctx: Any) -> Any:
    """The processor's cycle counter (`llvm.readcyclecounter`), for the timeline."""
    signature = types.int64()

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.IntType(64), [])
        counter = cgutils.get_or_insert_function(builder.module, fnty, "llvm.readcyclecounter")
        return builder.call(counter, [])

    return signature, codegen


# Typed as Any: the intrinsics' first argument (the typing context) is Numba's.
gemm: Any = intrinsic(_gemm_typing)
int64_pointer: Any = intrinsic(_int64_pointer_typing)
sem_call: Any = intrinsic(_sem_typing)
address_of: Any = intrinsic(_address_typing)
cycles: Any = intrinsic(_cycles_typing)


#: Whether a product of one matrix by another is a matrix times its own transpose
#: (gemm_bands.may_be_syrk, compiled: the plan interpreter and the cut ask it at each
#: product, a plan's build of its graph's products).
may_be_syrk: Any = helper_njit()(gemm_bands.may_be_syrk)
