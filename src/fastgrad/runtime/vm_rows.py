"""The plan interpreter's table layout (runtime.vm), written with NumPy alone: the rows'
codes, the LOOP row's fields, the table's header and `pack`, which lays out a table.

Lowering a plan (runtime.plan_table, runtime.loop_row) needs only these; a warm process
that runs its plans before Numba is imported (runtime.native_code) lowers them with this
module and calls the loop's stored machine code itself. runtime.vm compiles the loop
that reads what is laid out here.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fastgrad.compiler.machine_code import source_tag

# The rows' first entries (runtime.vm; GEMV, DOT, NOBLAS: runtime.vm_vectors; COPY, ADD,
# SUM: runtime.vm_arrays).
KERNEL, VIEW, GEMM, LOOP = 1, 2, 3, 4
GEMV, DOT, NOBLAS = 5, 6, 7
COPY, ADD, SUM = 8, 9, 10
# A GEMM row handed to the product cut's worker without waiting (POST: a GEMM row's
# layout), and the row that waits for it (JOIN: [JOIN]); runtime.plan_posts places them,
# runtime.gemm_split runs them.
POST, JOIN = 11, 12
# COPY's sizes and strides: at most this many axes (a row with more is not made).
MAX_AXES = 8
# LOOP's entries: where a body input's address comes from (FIXED: an outer pointer; SLICE:
# an outer pointer plus the step times a stride; CARRY: an outer pointer at the first
# iteration, then the previous iteration's output), and a body output's (ADDRESS: fixed;
# POINTER: an entry of the body's pointer table; INPUT: one of its inputs passed through).
FIXED, SLICE, CARRY = 0, 1, 2
ADDRESS, POINTER, INPUT = 0, 1, 2
LOOP_HEAD, LOOP_IN, LOOP_OUT, LOOP_COPY, LOOP_CARRY = 11, 6, 5, 10, 4
# The table starts with where its steps' starts, functions, pointers and floats are, the
# address of the process's one-BLAS-thread region (runtime.blas.region_address) when its
# matmuls are to run on one thread (0: leave BLAS's threads as they are), the address of the
# interpreter's loop (`vm.table_function`) and the table's length.
HEADER = 7
THREADS = 4  # the header's entry of the one-BLAS-thread region's address
LOOP_FUNCTION = 5  # the header's entry of the loop's address
# runtime.vm and the modules whose code its loop inlines (blas: constants), by file name.
_LOOP_SOURCES = (
    "vm", "blas", "blas_calls", "gemm_split", "gemm_jobs", "gemm_bands", "vm_arrays", "vm_rows",
    "vm_vectors",
)  # fmt: skip


@functools.cache
def loop_source_tag() -> str:
    """What the interpreter's cached machine code is keyed by besides Numba's: the source
    of runtime.vm and of the modules whose code it inlines (read, not imported: they
    import Numba), so that a changed interpreter is never loaded from an older cache."""
    here = Path(__file__).parent
    return source_tag("plan interpreter", *(here / f"{name}.py" for name in _LOOP_SOURCES))


def pack(
    code: list[int],
    starts: list[int],
    functions: list[int],
    pointers: int,
    floats: list[float],
    segments: list[list[int]],
    threads: int,
    loop: int,
) -> tuple[np.ndarray, list[int]]:
    """The table the interpreter reads: the HEADER (where the step starts, the functions,
    the pointers and the floats begin; `threads`; `loop`, the loop's address: runtime.vm's
    `table_function`, or its stored machine code loaded by runtime.native_plan), the
    steps' rows (`code`, rows starting at `starts`), then those parts and the segments'
    records. Returns it and where each segment's record is. Floats are kept as their bits.

    >>> from fastgrad.runtime.vm import run_steps, table_function
    >>> table, at = pack([VIEW, 0, 1, 8], [0], [], 2, [], [[0, 1, 1, 0]], 0, table_function())
    >>> x = np.arange(3.0)
    >>> run_steps(table, at[0], (x,))
    >>> int(table[table[2] + 1] - table[table[2]])  # pointer 1 is 8 bytes past pointer 0
    8
    """
    body = HEADER + len(code)
    parts = [starts, functions, [0] * pointers, np.array(floats, np.float64).view(np.int64)]
    heads, where = [], body
    for part in parts:
        heads.append(where)
        where += len(part)
    at = []
    for record in segments:
        at.append(where)
        where += len(record)
    table = np.concatenate(
        [
            np.array([*heads, threads, loop, 0], np.int64),
            np.array(code, np.int64) if code else np.zeros(0, np.int64),
            np.array([HEADER + s for s in starts], np.int64),
            *(np.asarray(part, np.int64) for part in parts[1:]),
            *(np.array(record, np.int64) for record in segments),
            np.zeros(1, np.int64),  # never empty
        ]
    )
    table[6] = len(table)
    return table, at
