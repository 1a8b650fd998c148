"""A job of the product cut (runtime.gemm_split): the layout of the state array the
calling thread and the worker share, a job's products as the interpreter's GEMM rows
hold them, and how each is cut into pieces: how many bands, along which axis.

A band re-reads and packs all of the product's other operand: OpenBLAS packs C = A @ B's
B (row-major terms) again for each block of some thousands of A's rows, and A once, so
each band of C's rows packs all of B, each band of its columns all of A. Bands cost
their repacking (W4's 256 x 784 @ 784 x 512, float32, quiet machine: 2 bands took 1.05x
the whole product's CPU, 8 bands 1.10x, and no less wall time), so a single product is
cut along the axis whose other operand is smaller (forcing the other axis on W4's two
products cost 1.5-4.5% more CPU a call), into as many bands as threads run them
(gemm_bands.CUT_THREADS); a pair's second product by `second_bands`.
"""

from __future__ import annotations

from typing import Any

from numba import carray

from fastgrad.compiler.machine_code import helper_njit
from fastgrad.runtime import gemm_bands
from fastgrad.runtime.blas import TRANS
from fastgrad.runtime.blas_calls import address_of, int64_pointer, may_be_syrk
from fastgrad.runtime.gemm_bands import ANSWER, MAX_PIECES

# The state's entries: the semaphore calls' addresses; whether the worker serves (READY)
# or is to stop (STOP); the worker's bounded spin (trywait rounds before it sleeps); the
# least multiply-adds of a piece and of a product that is cut; counters (tests, tuning);
# the caller's bounded spin before it sleeps until the worker's pieces are done; whether
# the job is a pair of products (PAIRED) and the pairs run; whether products side by side
# are paired (PAIRING, 1 unless a test or tuning turns it off); how many pieces at most the
# second product of a pair is cut into where it is no bigger than the first (PAIR_PIECES);
# where the caller and the worker write their timelines (TRACE, TRACE + 1; 0: not kept);
# the address of the C function the plan interpreter calls to cut its products (CUT,
# `rows_function`; set before READY, kept across a reset); into how many bands at most a
# single product alone is cut (PIECES: as many as threads run them, module doc); whether
# products are posted (POSTING, 1 unless a test or tuning turns it off: gemm_split.post),
# how many were and how many of them the caller ran itself at the join (counters).
(WAIT, TRYWAIT, POST, READY, STOP, SPIN, PIECE_WORK, MIN_WORK, JOBS, TAKEN, WAIT_SPIN, PAIRED,
 PAIRS, PAIRING, PAIR_PIECES, TRACE) = range(16)  # fmt: skip
CUT, PIECES, POSTING, POSTS, STOLEN = TRACE + 2, TRACE + 3, TRACE + 4, TRACE + 5, TRACE + 6
# The job: one product per block (a pair: two), each BLAS's gemm and its arguments, the
# matrices' base addresses, where their byte offsets are (count triples of int64s), and
# the cut: bands per matrix, along which axis (0: C's rows), of how many rows or columns
# (the last band: the rest). Block b's entries are at JOB + BLOCK * b + the names below.
JOB, BLOCK = STOLEN + 1, 20
(GEMM, DOUBLE, TA, TB, M, N, K, LDA, LDB, LDC, BETA, A, B, C) = range(14)
OFFSETS, COUNT, BANDS, AXIS, STEP = range(14, 19)
BOUNDS = JOB + 2 * BLOCK  # the pieces' first units (unit u: band u % bands of matrix u // bands)
SEMS = BOUNDS + MAX_PIECES + 8  # semaphores, 64 bytes apart (a sem_t is 32 bytes)
LOCK, WORK, DONE, PIECE = 0, 1, 2, 3  # PIECE + i: piece i's claim
SEM_STRIDE = 8
# Where bands of a product keep its bits on this machine: runtime.gemm_probe's answer, in
# gemm_bands' layout (`gemm_bands.rule` reads a dtype's).
ALIGN = SEMS + SEM_STRIDE * (PIECE + MAX_PIECES)
SIZE = ALIGN + ANSWER


@helper_njit()
def load_row(
    s: Any, j: int, table: Any, functions: int, ptrs: int, p: int
) -> None:  # pragma: no cover - compiled
    """Block `j` of the job: the product of the interpreter's GEMM row at `table[p]`
    (runtime.vm's layout, as `ROWS_SIGNATURE` says), whole."""
    s[j + GEMM] = table[functions + table[p + 1]]
    for e in range(10):  # DOUBLE .. BETA, in the row's order
        s[j + DOUBLE + e] = table[p + 4 + e]
    for e in range(3):  # A, B, C
        s[j + A + e] = table[ptrs + table[p + 14 + e]]
    s[j + OFFSETS], s[j + COUNT] = address_of(table, p + 18), table[p + 17]
    s[j + BANDS], s[j + AXIS], s[j + STEP] = 1, 0, 0


@helper_njit()
def syrk(s: Any, j: int) -> bool:  # pragma: no cover - compiled
    """Whether a matrix of the product in block `j` is one times its own transpose, which
    the interpreter computes with syrk as NumPy's matmul does (blas_calls.may_be_syrk)."""
    offsets = carray(int64_pointer(s[j + OFFSETS]), (3 * s[j + COUNT],))
    for u in range(s[j + COUNT]):
        a, b = s[j + A] + offsets[3 * u], s[j + B] + offsets[3 * u + 1]
        if may_be_syrk(
            a, b, s[j + M], s[j + N], s[j + TA], s[j + TB], s[j + LDA], s[j + LDB], s[j + BETA]
        ):
            return True
    return False


@helper_njit()
def _span(s: Any, j: int, operand: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """The bytes [low, high) that operand A, B or C of block `j` may touch."""
    m, n, k = s[j + M], s[j + N], s[j + K]
    if operand == A:
        rows, cols, ld = (m, k, s[j + LDA]) if s[j + TA] != TRANS else (k, m, s[j + LDA])
    elif operand == B:
        rows, cols, ld = (k, n, s[j + LDB]) if s[j + TB] != TRANS else (n, k, s[j + LDB])
    else:
        rows, cols, ld = m, n, s[j + LDC]
    offsets = carray(int64_pointer(s[j + OFFSETS]), (3 * s[j + COUNT],))
    low, high = offsets[operand - A], offsets[operand - A]
    for q in range(s[j + COUNT]):
        low = min(low, offsets[3 * q + operand - A])
        high = max(high, offsets[3 * q + operand - A])
    item = 8 if s[j + DOUBLE] else 4
    base = s[j + operand]
    return base + low, base + high + ((rows - 1) * ld + cols) * item


@helper_njit()
def apart(s: Any, j: int, operand: int, other: int) -> bool:  # pragma: no cover
    """Whether block j's C and operand `operand` of block `other` share no byte."""
    c_low, c_high = _span(s, j, C)
    low, high = _span(s, other, operand)
    return c_high <= low or high <= c_low


_pieces = helper_njit()(gemm_bands.pieces)
_rule = helper_njit()(gemm_bands.rule)


@helper_njit()
def cut(s: Any, j: int, most: int) -> int:  # pragma: no cover - compiled
    """Into how many pieces (at most `most`; 1: whole) the product in block `j` is cut,
    its bands set: a batch's matrices in groups (no operand packed twice); a single
    matrix in bands of C's rows or columns, each of PIECE_WORK multiply-adds at least, at
    multiples of the alignment that keeps its bits on this machine (ALIGN), by
    runtime.gemm_bands' rule (the one a plan's build reads: thread_budget.cut_pieces)."""
    rule = _rule(s[ALIGN : ALIGN + ANSWER], s[j + DOUBLE])
    pieces, axis, step = _pieces(
        s[j + M], s[j + N], s[j + K], s[j + COUNT], most, s[PIECE_WORK], rule
    )
    bands = pieces if s[j + COUNT] == 1 and pieces > 1 else 1
    s[j + BANDS], s[j + AXIS], s[j + STEP] = bands, axis, step
    return pieces


@helper_njit()
def second_bands(s: Any, first: int, second: int) -> int:  # pragma: no cover - compiled
    """Into how many bands at most a pair's second product (block `second`) is cut. The
    caller runs the first whole, then takes the second's bands from the front while the
    worker takes them from the back: the worker's share should be about half of both.
    Where the second has no more multiply-adds than the first, all of it (PAIR_PIECES
    bands, 1: whole; the caller takes it if the worker has not started it by then); else
    about 2 W2 / (W2 - W1) bands, the caller's one of them about (W2 - W1) / 2."""
    w1, w2 = _work(s, first), _work(s, second)
    if w2 <= w1:
        return s[PAIR_PIECES]
    return min(MAX_PIECES - 1, max(2, (4 * w2 + w2 - w1) // (2 * (w2 - w1))))


@helper_njit()
def _work(s: Any, j: int) -> int:  # pragma: no cover - compiled
    """The multiply-adds of the product in block `j`."""
    return s[j + M] * s[j + N] * s[j + K] * s[j + COUNT]


@helper_njit()
def bounds(s: Any, j: int, pieces: int) -> None:  # pragma: no cover - compiled
    """The pieces' first units: block j's units (its matrices times their bands) in
    `pieces` runs of about equal length."""
    units = s[j + COUNT] * s[j + BANDS]
    for i in range(pieces + 1):
        s[BOUNDS + i] = units * i // pieces
