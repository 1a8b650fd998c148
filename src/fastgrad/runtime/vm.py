"""The plan interpreter: one compiled loop over an int64 step table, shared by every plan
(compiled once per kind of argument tuple, not per plan). It never sees a kernel's
types: each kernel is called through its adapter, a C function of one uniform signature
`(int64* row, int64* ptrs, float64* scalars)` that rebuilds the kernel's arrays from the
pointer table (compiler.codegen.adapter).

Step table (`pack`): the steps' rows, step i's at `starts[i]`; `functions` holds addresses.
  KERNEL: [KERNEL, function, <the adapter's row: sizes, chunks, scalars, operands>]
  VIEW: [VIEW, pointer in, pointer out, byte offset]: reshape, transpose, slice and
    broadcast views share their input's memory; only the address moves
  GEMM: [GEMM, gemm, syrk, split, float64?, trans a, trans b, m, n, k, lda, ldb, ldc,
    beta, pointer a, pointer b, pointer c, count, <count triples of byte offsets into a, b,
    c>]: `c = a @ b (+ c)` per matrix of a batch, through cblas_?gemm (row-major); a matrix
    times its own transpose (one address, found at run time) through cblas_?syrk and a
    copy of its upper triangle to the lower, as `np.matmul` does, for the same bits. With
    `split` (an index into the functions: the address of runtime.gemm_split's state; -1:
    none) a product big enough to pay is cut across the cores by gemm_split; two such
    rows side by side run as one job, one whole on the calling thread (gemm_split.pair);
    both through a C function of their own (gemm_split.rows_function), once compiled
  POST: a GEMM row handed to gemm_split's worker whole, not waited for (gemm_split.post;
    run whole here where it cannot be posted), until the next JOIN row: [JOIN]
    (gemm_split.join; the caller runs it if the worker has not started it) or the
    segment's end. runtime.plan_posts places both: the JOIN before the first row that
    reads what the product writes or writes what it reads
  LOOP: a scan's iterations, each a call of one of two body segments (tables of their
    own, used in turn) with its inputs' pointers set first; see `_run_loop`
  GEMV, DOT, NOBLAS: products with a dimension of 1, as `np.matmul` computes them: a
    call of runtime.vm_vectors' C function (its index the row's second entry) with the row
  COPY, ADD, SUM: a scan's work around its loop (runtime.vm_arrays), called so too
`ptrs[j]` is the address of operand slot j, filled before each segment runs (or once, for
buffers and constants).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np
from llvmlite import ir
from numba import carray, literal_unroll, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from fastgrad.compiler.machine_code import (
    OnceLock,
    cached_cfunc,
    cached_njit,
)
from fastgrad.runtime import vm_rows
from fastgrad.runtime.blas import (
    REGION_COUNT,
    REGION_POST,
    REGION_SAVED,
    REGION_SETTER,
    REGION_SIZE,
    REGION_WAIT,
    ROW_MAJOR,
)
from fastgrad.runtime.blas_calls import by_precision, gemm, int64_pointer, may_be_syrk, sem_call
from fastgrad.runtime.gemm_split import CUT, JOIN_ROW, POST_ROW
from fastgrad.runtime.vm_rows import (  # the table's layout (NumPy alone)
    FIXED,
    GEMM,
    GEMV,
    INPUT,
    JOIN,
    KERNEL,
    LOOP,
    LOOP_CARRY,
    LOOP_COPY,
    LOOP_FUNCTION,
    LOOP_HEAD,
    LOOP_IN,
    LOOP_OUT,
    POINTER,
    POST,
    SLICE,
    THREADS,
    VIEW,
)
from fastgrad.runtime.vm_vectors import typed_pointer as _typed_pointer

# Callers' names for the layout's pieces that this module does not use itself.
ADDRESS, CARRY, HEADER = vm_rows.ADDRESS, vm_rows.CARRY, vm_rows.HEADER
UPPER = 121  # CBLAS: the upper triangle

#: The interpreter loop's C signature: the table, where the segment's record is.
TABLE_SIGNATURE = types.void(types.CPointer(types.int64), types.int64)

#: The adapters' C signature: the step's row, the pointer table, the float scalars.
ADAPTER_SIGNATURE = types.void(
    types.CPointer(types.int64), types.CPointer(types.int64), types.CPointer(types.float64)
)


def _call_adapter_typing(typingctx: Any, address: Any, row: Any, ptrs: Any, scalars: Any) -> Any:
    """Call the C function at integer `address` with (int64*, int64*, float64*)."""
    signature = types.void(address, row, ptrs, scalars)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i64p = ir.IntType(64).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i64p, i64p, ir.DoubleType().as_pointer()])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), args[1:])
        return context.get_dummy_value()

    return signature, codegen


def _syrk_typing(
    typingctx: Any, address: Any, double: Any, trans: Any, n: Any, k: Any, a: Any, lda: Any,
    c: Any, ldc: Any,
) -> Any:  # fmt: skip
    """Call `cblas_?syrk` at integer `address` (d if `double`, else s): the upper triangle
    of `c = a @ a.T` (`a.T @ a` with `trans`), row-major, alpha 1 and beta 0."""
    signature = types.void(address, double, trans, n, k, a, lda, c, ldc)

    def codegen(context: Any, builder: Any, sig: Any, values: Any) -> Any:
        i32, i64 = ir.IntType(32), ir.IntType(64)
        char_p = ir.IntType(8).as_pointer()

        def call(real: Any) -> None:
            kinds = [i32, i32, i32, i64, i64, real, char_p, i64, real, char_p, i64]
            fnty = ir.FunctionType(ir.VoidType(), kinds)
            trans, n, k, a, lda, c, ldc = values[2:]
            arguments = [ir.Constant(i32, ROW_MAJOR), ir.Constant(i32, UPPER)]
            arguments += [builder.trunc(trans, i32), n, k, ir.Constant(real, 1.0)]
            arguments += [builder.inttoptr(a, char_p), lda, ir.Constant(real, 0.0)]
            arguments += [builder.inttoptr(c, char_p), ldc]
            builder.call(builder.inttoptr(values[0], fnty.as_pointer()), arguments)

        by_precision(builder, values[1], call)
        return context.get_dummy_value()

    return signature, codegen


def _call_table_typing(typingctx: Any, address: Any, table: Any, at: Any) -> Any:
    """Call the C function `void f(int64*, int64)` at integer `address`."""
    signature = types.void(address, table, at)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(ir.VoidType(), [i64.as_pointer(), i64])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), args[1:])
        return context.get_dummy_value()

    return signature, codegen


def _call_cut_typing(typingctx: Any, address: Any, table: Any, p: Any, q: Any) -> Any:
    """Call the C function `int64 f(int64*, int64, int64)` at integer `address`."""
    signature = types.int64(address, table, p, q)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64.as_pointer(), i64, i64])
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), args[1:])

    return signature, codegen


def _set_threads_typing(typingctx: Any, address: Any, count: Any) -> Any:
    """Call `int f(int)` at integer `address` (OpenBLAS's thread count setter)."""
    signature = types.int64(address, count)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(i32, [i32])
        result = builder.call(
            builder.inttoptr(args[0], fnty.as_pointer()), [builder.trunc(args[1], i32)]
        )
        return builder.sext(result, ir.IntType(64))

    return signature, codegen


def _float_pointer_typing(typingctx: Any, array: Any, index: Any) -> Any:
    """The address of `array[index]` of a 1-D int64 array holding float64 bits, as a
    float64 pointer."""
    signature = types.CPointer(types.float64)(array, index)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.bitcast(builder.gep(data, [args[1]]), ir.DoubleType().as_pointer())

    return signature, codegen


def _element_pointer_typing(typingctx: Any, array: Any, index: Any) -> Any:
    """The address of `array[index]` of a 1-D array, as a typed pointer."""
    signature = types.CPointer(array.dtype)(array, index)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.gep(data, [args[1]])

    return signature, codegen


def _copy_typing(typingctx: Any, destination: Any, source: Any, nbytes: Any) -> Any:
    """memcpy `nbytes` from integer address `source` to integer address `destination`."""
    signature = types.void(destination, source, nbytes)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        char_p = ir.IntType(8).as_pointer()
        to, start = (builder.inttoptr(a, char_p) for a in args[:2])
        cgutils.raw_memcpy(builder, to, start, args[2], 1)
        return context.get_dummy_value()

    return signature, codegen


# Typed as Any: the intrinsics' first argument (the typing context) is Numba's, not the caller's.
_call_adapter: Any = intrinsic(_call_adapter_typing)
_syrk: Any = intrinsic(_syrk_typing)
_element_pointer: Any = intrinsic(_element_pointer_typing)
_float_pointer: Any = intrinsic(_float_pointer_typing)
_set_threads: Any = intrinsic(_set_threads_typing)
_call_table: Any = intrinsic(_call_table_typing)
_call_cut: Any = intrinsic(_call_cut_typing)
_copy: Any = intrinsic(_copy_typing)
_table_pointer: Any = int64_pointer


#: address -> typed pointer, by NumPy dtype name: the adapters' globals.
POINTERS = {
    name: _typed_pointer(numba_type)
    for name, numba_type in [
        ("float64", types.float64),
        ("float32", types.float32),
        ("int64", types.int64),
        ("int32", types.int32),
        ("bool", types.boolean),
    ]
}


def _source_tag() -> str:
    """The key of the interpreter's cached machine code (runtime.vm_rows, which a process
    before Numba's import reads it by too)."""
    return vm_rows.loop_source_tag()


_float64_pointer, _float32_pointer = POINTERS["float64"], POINTERS["float32"]


@njit
def _mirror_upper(double: int, address: int, n: int, ld: int) -> None:  # pragma: no cover
    """Copy the upper triangle of the n x n row-major matrix at `address` (leading
    dimension `ld`) to its lower triangle: what `np.matmul` does after its syrk."""
    if double:
        x = carray(_float64_pointer(address), (n * ld,))
        for i in range(n):
            for j in range(i + 1, n):
                x[j * ld + i] = x[i * ld + j]
    else:
        y = carray(_float32_pointer(address), (n * ld,))
        for i in range(n):
            for j in range(i + 1, n):
                y[j * ld + i] = y[i * ld + j]


def _run_table(pointer: Any, at: int) -> None:  # pragma: no cover - compiled
    """The interpreter's loop over the segment whose record starts at `table[at]`:
    [first step, step count, ...]. Compiled once, as a C function (`table_function`)."""
    table = carray(pointer, (pointer[6],))
    starts, functions, ptrs, floats = table[0], table[1], table[2], table[3]
    region = table[THREADS]  # blas.region_address(), or 0: BLAS's threads as they are
    if region != 0:
        _region(region, 1)
    first = table[at]
    end = first + table[at + 1]
    paired = -1  # a GEMM row run already, beside the one before it (gemm_split.pair)
    posted = 0  # the cut's address while a product posted by this call is not joined
    posted_at = 0  # that POST row
    for i in range(first, end):
        p = table[starts + i]
        op = table[p]
        if p == paired:
            continue
        if op == KERNEL:
            _call_adapter(
                table[functions + table[p + 1]],
                _element_pointer(table, p + 2),
                _element_pointer(table, ptrs),
                _float_pointer(table, floats),
            )
        elif op == VIEW:
            table[ptrs + table[p + 2]] = table[ptrs + table[p + 1]] + table[p + 3]
        elif op == JOIN:
            if posted != 0:
                _call_cut(posted, pointer, posted_at, JOIN_ROW)
                posted = 0
        elif op == GEMM or op == POST:
            a = table[ptrs + table[p + 14]]
            b = table[ptrs + table[p + 15]]
            c = table[ptrs + table[p + 16]]
            double, ta, tb = table[p + 4], table[p + 5], table[p + 6]
            m, n, k = table[p + 7], table[p + 8], table[p + 9]
            lda, ldb, ldc, beta = table[p + 10], table[p + 11], table[p + 12], table[p + 13]
            count, gemm_address, split = (
                table[p + 17],
                table[functions + table[p + 1]],
                table[p + 3],
            )
            # cut across the cores (gemm_split.rows_function: a C function of its own, its
            # address in gemm_split's state once compiled), with the next row if it is one
            cut = _table_pointer(table[functions + split])[CUT] if split >= 0 else 0
            if cut != 0 and op == POST:  # on the worker while this thread goes on
                if posted == 0 and _call_cut(cut, pointer, p, POST_ROW) != 0:
                    posted, posted_at = cut, p
                    continue
            elif cut != 0:
                q = table[starts + i + 1] if i + 1 < end else -1
                q = q if q >= 0 and table[q] == GEMM and table[q + 3] >= 0 else -1
                done = _call_cut(cut, pointer, p, q)
                if done == 2:
                    paired = q
                if done != 0:
                    continue
            for q in range(p + 18, p + 18 + 3 * count, 3):
                pa, pb, pc = a + table[q], b + table[q + 1], c + table[q + 2]
                if may_be_syrk(pa, pb, m, n, ta, tb, lda, ldb, beta):
                    _syrk(table[functions + table[p + 2]], double, ta, n, k, pa, lda, pc, ldc)
                    _mirror_upper(double, pc, n, ldc)
                else:
                    gemm(
                        gemm_address, double, ta, tb, m, n, k, 1.0, pa, lda, pb, ldb,
                        float(beta), pc, ldc,
                    )  # fmt: skip
        elif op == LOOP:
            _run_loop(table, p)
        elif op >= GEMV:  # runtime.vm_vectors' rows, by their function's address
            _call_table(table[functions + table[p + 1]], pointer, p)
    if posted != 0:  # (runtime.plan_posts puts a JOIN before whatever needs it)
        _call_cut(posted, pointer, posted_at, JOIN_ROW)
    if region != 0:
        _region(region, -1)


@njit(nogil=True)
def _region(address: int, step: int) -> None:  # pragma: no cover - compiled
    """Enter (`step` 1) or leave (-1) the process's one-BLAS-thread region at `address`
    (runtime.blas, as `OneThread` does): the first in sets one thread and saves the count
    it replaced, the last out puts it back; under the region's semaphore if it has one."""
    r = carray(int64_pointer(address), (REGION_SIZE,))
    if r[REGION_WAIT] != 0:
        while sem_call(r[REGION_WAIT], address) != 0:  # EINTR: a signal woke it
            pass
    if step > 0 and r[REGION_COUNT] == 0:
        r[REGION_SAVED] = _set_threads(r[REGION_SETTER], 1)
    r[REGION_COUNT] += step
    if step < 0 and r[REGION_COUNT] == 0:
        _set_threads(r[REGION_SETTER], r[REGION_SAVED])
    if r[REGION_POST] != 0:
        sem_call(r[REGION_POST], address)


@njit(nogil=True)
def _run_loop(table: Any, p: int) -> None:  # pragma: no cover - compiled
    """The LOOP row at `table[p]`: [LOOP, length, reverse, inputs, outputs, copies,
    carries, body 0's table address and record, body 1's], then per body input [kind,
    outer pointer index, stride or output number, pointer index in body 0, in body 1 (-1:
    unread), its address this iteration]; per body output [kind, address or pointer index
    in body 0, in body 1, input number, its address after the last iteration]; per stacked
    output [output number, outer pointer index of the stack, bytes per row, bytes, pointer
    indices of its buffer in body 0 and in body 1 (-1: copied), those of its buffer in
    the kernel's shape (-1: none), the address they hold in each], first those of the
    carries handed on [-1 - output number, outer pointer index of a pair of buffers, bytes
    of one, bytes, -1, -1, -1, -1, 0, 0] (a carry output that is a carry input, or a view
    of one, lives in the buffers the next iteration writes: iteration i copies it into
    half i % 2 and hands on that); a stacked output with pointer indices is written in
    place, its buffer's pointers set to row t of its stack before the body runs (and put
    back after the loop), not copied; per final carry [output number, input number,
    outer pointer index, bytes]. Iteration i runs body i % 2 (step t: i, or length - 1 - i with
    `reverse`); what it reads was checked once before the loop (runtime.loop_table)."""
    ptrs = table[2]
    length, reverse, n_in, n_out = table[p + 1], table[p + 2], table[p + 3], table[p + 4]
    n_copy, n_carry = table[p + 5], table[p + 6]
    ins = p + LOOP_HEAD
    outs = ins + LOOP_IN * n_in
    copies = outs + LOOP_OUT * n_out
    carries = copies + LOOP_COPY * n_copy
    for parity in range(2):  # the consts' pointers, once: no iteration changes them
        head = _table_pointer(table[p + 7 + 2 * parity])
        for e in range(ins, outs, LOOP_IN):
            if table[e] == FIXED:
                table[e + 5] = table[ptrs + table[e + 1]]
                if table[e + 3 + parity] >= 0:
                    head[head[2] + table[e + 3 + parity]] = table[e + 5]
    for i in range(length):
        t = length - 1 - i if reverse else i
        parity = i % 2
        address = table[p + 7 + 2 * parity]
        head = _table_pointer(address)
        body = carray(head, (head[6],))
        body_ptrs = body[2]
        for e in range(ins, outs, LOOP_IN):
            kind = table[e]
            if kind == FIXED:
                continue
            outer = table[ptrs + table[e + 1]]
            if kind == SLICE:
                outer += t * table[e + 2]
            elif i > 0:  # CARRY
                outer = table[outs + LOOP_OUT * table[e + 2] + 4]
            table[e + 5] = outer
            index = table[e + 3 + parity]
            if index >= 0:
                body[body_ptrs + index] = outer
        for c in range(copies, carries, LOOP_COPY):  # the stacks written in place
            if table[c + 4 + parity] >= 0:
                row = table[ptrs + table[c + 1]] + t * table[c + 2]
                for q in range(c + 4 + parity, c + 8, 2):
                    if table[q] >= 0:
                        body[body_ptrs + table[q]] = row
        _call_table(body[5], head, table[p + 8 + 2 * parity])
        for o in range(outs, copies, LOOP_OUT):
            kind, where = table[o], table[o + 1 + parity]
            if kind == POINTER:
                where = body[body_ptrs + where]
            elif kind == INPUT:
                where = table[ins + LOOP_IN * table[o + 3] + 5]
            table[o + 4] = where
        for c in range(copies, carries, LOOP_COPY):
            k = table[c]
            if k < 0:  # a carry handed on: into the half of its pair the next one reads
                o = outs + LOOP_OUT * (-1 - k) + 4
                destination = table[ptrs + table[c + 1]] + parity * table[c + 2]
                _copy(destination, table[o], table[c + 3])
                table[o] = destination
                continue
            if table[c + 4 + parity] < 0:
                source = table[outs + LOOP_OUT * k + 4]
                _copy(table[ptrs + table[c + 1]] + t * table[c + 2], source, table[c + 3])
    for parity in range(2):  # the buffers' own addresses back, for the bodies' other runs
        head = _table_pointer(table[p + 7 + 2 * parity])
        for c in range(copies, carries, LOOP_COPY):
            for q in range(c + 4 + parity, c + 8, 2):
                if table[q] >= 0:
                    head[head[2] + table[q]] = table[c + 8 + parity]
    for c in range(carries, carries + LOOP_CARRY * n_carry, LOOP_CARRY):
        if length > 0:
            source = table[outs + LOOP_OUT * table[c] + 4]
        else:
            source = table[ptrs + table[ins + LOOP_IN * table[c + 1] + 1]]
        _copy(table[ptrs + table[c + 2]], source, table[c + 3])


_TABLE_FUNCTION: list[Any] = []  # the compiled `_run_table`, kept alive
_TABLE_LOCK = OnceLock()


def table_function() -> int:
    """The address of the interpreter's loop, compiled (or loaded from fastgrad's cache)
    on first use: a C function `(int64* table, int64 at)`, the same for every plan."""
    with _TABLE_LOCK:
        if not _TABLE_FUNCTION:
            _TABLE_FUNCTION.append(cached_cfunc(_run_table, TABLE_SIGNATURE, _source_tag()))
        return int(_TABLE_FUNCTION[0].address)


@cached_njit(_source_tag(), nogil=True)
def run_steps(table: np.ndarray, at: int, arrays: tuple[np.ndarray, ...]) -> None:
    """Run the segment whose record starts at `table[at]`: [first step, step count, k,
    k pointer indices], after setting the pointers it names to the addresses of `arrays`
    (the call's arguments and fresh outputs; taking addresses here costs a fraction of
    NumPy's `.ctypes.data`, ~5 us each). One int64 table holds everything (one argument
    for the dispatcher to check rather than eight): HEADER gives where its parts start.
    Compiled once per kind of `arrays` tuple (its arrays' dtypes and ranks), a small
    function: the loop itself is compiled once for all (`table_function`)."""
    k = at + 3
    for array in literal_unroll(arrays):
        table[table[2] + table[k]] = array.ctypes.data
        k += 1
    _call_table(table[LOOP_FUNCTION], _element_pointer(table, 0), at)


def pack(
    code: list[int],
    starts: list[int],
    functions: list[int],
    pointers: int,
    floats: list[float],
    segments: list[list[int]],
    threads: int = 0,
) -> tuple[np.ndarray, list[int]]:
    """The table `run_steps` reads (runtime.vm_rows' `pack`), with the loop compiled here."""
    return vm_rows.pack(
        code, starts, functions, pointers, floats, segments, threads, table_function()
    )


def compile_adapter(source: str, tag: str = "") -> Any:
    """The C function that `source` (compiler.codegen.adapter) defines, its machine code
    kept in fastgrad's cache under `tag` (which must name the source; "": not kept).
    It calls kernels by the address in its row (runtime.kernel_entry), so one serves
    every kernel of its signature.

    >>> from fastgrad.compiler.codegen.adapter import adapter_source
    >>> from fastgrad.runtime.kernel_entry import entry_address, kernel_signature
    >>> from numba import njit
    >>> @njit
    ... def double(n, chunks, x, y):
    ...     for i in range(n):
    ...         y[i] = 2 * x[i]
    >>> operands = [(1, "float64"), (1, "float64")]
    >>> signature = kernel_signature(1, [], operands)
    >>> entry = double.compile(signature)
    >>> c = compile_adapter(adapter_source(1, [], operands))
    >>> x, y = np.arange(3.0), np.zeros(3)
    >>> row = [entry_address(double, signature), 3, 1, 0, 3, 1, 3]  # x, y: pointers 0, 1
    >>> table, at = pack([KERNEL, 0, *row], [0], [c.address], 2, [], [[0, 1, 2, 0, 1]])
    >>> run_steps(table, at[0], (x, y))
    >>> y
    array([0., 2., 4.])
    """
    from fastgrad.runtime.kernel_entry import call_kernel

    # A module of its own, found by name when machine code is loaded from the cache.
    module = ModuleType(f"fastgrad_adapter_{tag or id(source)}")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    namespace.update(
        np=np,
        carray=carray,
        call_kernel=call_kernel,
        **{f"pointer_{n}": p for n, p in POINTERS.items()},
    )
    exec(compile(source, "<fastgrad adapter>", "exec"), namespace)
    return cached_cfunc(namespace["adapter"], ADAPTER_SIGNATURE, tag or None)
