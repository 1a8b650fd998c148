"""The plan interpreter's rows for the work a scan does for all its steps at once around
its loop (runtime.loop_hoisting), so that a scan with such work runs as rows of the
enclosing plan's table too (runtime.loop_row): a copy of an array of another layout into
a C-contiguous one (a const transposed before the loop, the initial carry into the first
row of the array two stacks share, a stack transposed after it), an elementwise sum (a
carry's initial value plus the total summed after the loop) and a sum over leading axes
(a bias gradient's total). Each computes what NumPy computes, the same way, for the same
bits: a copy moves bits; `np.add` of two arrays of one float dtype rounds each sum once
in that dtype; `x.sum(axis=leading)` keeping at least 2 elements per row adds the rows in
order from 0 (NumPy's reduction adds row after row there; with one element kept it sums
pairwise, which these rows are not used for).

Each row's second entry is the index of vm_vectors' C function among the table's
functions (the interpreter calls it with the row, which hands these rows to `run_array`):
  COPY: [COPY, function, ndim, itemsize, pointer in, pointer out, <ndim sizes>, <ndim
    byte strides of the input>]: out, C-contiguous, = the input (any strides)
  ADD: [ADD, function, float64?, n, pointer a, pointer b, pointer out]: out = a + b
  SUM: [SUM, function, float64?, rows, cols, pointer in, pointer out]: out[j] = 0 +
    in[0, j] + in[1, j] + ... in the dtype, `in` (rows, cols) C-contiguous
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from fastgrad.runtime.vm_rows import ADD, COPY, MAX_AXES
from fastgrad.runtime.vm_rows import SUM as SUM  # (re-exported)


def typed_pointer(dtype: Any) -> Any:
    """An intrinsic making an integer address a pointer to `dtype` (a Numba type)."""

    @intrinsic
    def pointer(typingctx: Any, address: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

        return types.CPointer(dtype)(address), codegen

    return pointer


_f64, _f32 = typed_pointer(types.float64), typed_pointer(types.float32)
_i64, _i32 = typed_pointer(types.int64), typed_pointer(types.int32)
_u8 = typed_pointer(types.uint8)


@njit(inline="always")
def run_array(table: Any, p: int, op: int) -> None:  # pragma: no cover - compiled
    """The COPY, ADD or SUM row at `table[p]` (the module's docstring; `op` its first
    entry)."""
    ptrs = table[2]
    if op == COPY:
        _copy(table, p, table[ptrs + table[p + 4]], table[ptrs + table[p + 5]])
        return
    double, n = table[p + 2], table[p + 3]
    if op == ADD:
        a, b = table[ptrs + table[p + 4]], table[ptrs + table[p + 5]]
        c = table[ptrs + table[p + 6]]
        if double:
            _add(carray(_f64(a), (n,)), carray(_f64(b), (n,)), carray(_f64(c), (n,)))
        else:
            _add(carray(_f32(a), (n,)), carray(_f32(b), (n,)), carray(_f32(c), (n,)))
        return
    cols = table[p + 4]  # SUM: n rows
    a, c = table[ptrs + table[p + 5]], table[ptrs + table[p + 6]]
    if double:
        _sum_rows(carray(_f64(a), (n, cols)), carray(_f64(c), (cols,)))
    else:
        _sum_rows(carray(_f32(a), (n, cols)), carray(_f32(c), (cols,)))


@njit(inline="always")
def _add(x: Any, y: Any, z: Any) -> None:  # pragma: no cover - compiled
    for i in range(len(z)):
        z[i] = x[i] + y[i]


@njit(inline="always")
def _sum_rows(x: Any, z: Any) -> None:  # pragma: no cover - compiled
    """z = 0 + x[0] + x[1] + ..., in z's dtype."""
    z[:] = 0
    for i in range(x.shape[0]):
        for j in range(len(z)):
            z[j] += x[i, j]


@njit(inline="always")
def _copy(table: Any, p: int, source: int, destination: int) -> None:  # pragma: no cover
    """COPY's elements, in C order of the output: the last axis innermost, each element
    moved as an integer of its size (its bits as they are)."""
    ndim, item = table[p + 2], table[p + 3]
    sizes, strides = p + 6, p + 6 + ndim
    total = 1
    for d in range(ndim):
        total *= table[sizes + d]
    if total == 0:
        return
    last = table[sizes + ndim - 1] if ndim > 0 else 1
    step = table[strides + ndim - 1] if ndim > 0 else item
    index = np.zeros(MAX_AXES, np.int64)  # the outer axes' counters
    at, out = source, destination
    for _ in range(total // last):
        for i in range(last):
            if item == 8:
                _i64(out + i * 8)[0] = _i64(at + i * step)[0]
            elif item == 4:
                _i32(out + i * 4)[0] = _i32(at + i * step)[0]
            else:
                for b in range(item):
                    _u8(out + i * item + b)[0] = _u8(at + i * step + b)[0]
        out += last * item
        d = ndim - 2  # the next outer index, carried as in an odometer
        while d >= 0:
            index[d] += 1
            at += table[strides + d]
            if index[d] < table[sizes + d]:
                break
            at -= index[d] * table[strides + d]
            index[d] = 0
            d -= 1
