"""How the product cut (runtime.gemm_split) cuts one product: into how many pieces, and a
single matrix along which axis, in bands of how many of C's rows or columns. Plain
arithmetic on ints, which the cut's compiled code runs at each product
(runtime.gemm_jobs.cut) and Python runs when a plan is built, to decide whether the cut
will take the plan's products (runtime.thread_budget.cut_pieces): one rule for both.

A band re-reads and packs all of the product's other operand (gemm_jobs' doc), so a
single product is cut along the axis whose other operand is smaller, where its bands keep
the whole product's bits (the probe's answer, runtime.gemm_probe: an alignment of the
bands per axis, and whether C's other dimension may be any length or must be a multiple
of it), else along the other axis where that one keeps them, else not at all.
"""

from __future__ import annotations

from typing import Any

# The most pieces a product is cut into (the state's room for their claims: gemm_jobs).
MAX_PIECES = 8
# Measured on the 2-core development machine (float32, bench M2's products): see
# docs/architecture.md, "Matrix products across the cores".
DEFAULT_PIECE_WORK = 1 << 20  # > 100^3: OpenBLAS's small-matrix path takes none
DEFAULT_MIN_WORK = 1 << 21
# Into how many bands at most a single product alone is cut: as many as threads run them
# (the caller and the worker), each band packing the other operand again (gemm_jobs); and
# a pair's second product where it is no bigger than the first: whole, the worker's.
# Bench W4 (two 784 x 512 x 256 products, quiet machine): 2 bands took 0.94x the CPU of 8
# and no more wall time; M2 (10 pairs of equal products) 0.96x the CPU and 0.92x the wall
# time with its pairs' second products whole rather than in 7 bands (docs/architecture.md,
# "Matrix products across the cores").
CUT_THREADS = 2
# The probe's answer (runtime.gemm_probe), as the cut's state holds it (gemm_jobs.ALIGN)
# and a plan's build reads it (thread_budget.cut_pieces): `RULE` ints per dtype, float32's
# first, each the `rule` that `pieces` takes.
RULE = 4
ANSWER = 2 * RULE


def rule(answer: Any, double: int) -> tuple[int, int, int, int]:
    """The dtype's `rule` in the probe's `answer` (ANSWER ints): float64's where `double`
    is not 0, else float32's.

    >>> rule((12, 1, 0, 0, 16, 1, 16, 1), 0), rule((12, 1, 0, 0, 16, 1, 16, 1), 1)
    ((12, 1, 0, 0), (16, 1, 16, 1))
    """
    at = RULE if double else 0
    return (answer[at], answer[at + 1], answer[at + 2], answer[at + 3])


def pieces(
    m: int, n: int, k: int, count: int, most: int, piece_work: int, rule: tuple[int, ...]
) -> tuple[int, int, int]:
    """(pieces, axis, step): into how many pieces (at most `most`; 1: whole) the product
    of `count` matrices C (m x n) = A (m x k) @ B (k x n) is cut; for a single matrix,
    along which axis (0: C's rows) in bands of `step` rows or columns (the last: the
    rest). A batch is cut between its matrices; a single matrix into bands of at least
    `piece_work` multiply-adds at multiples of its axis's alignment. `rule`: the probe's
    answer for the dtype, (rows' alignment, whether C's columns may be any number,
    columns' alignment, whether C's rows may be), an alignment 0 where that axis is never
    cut (runtime.gemm_probe).

    >>> pieces(256, 512, 784, 1, 2, 1 << 20, (12, 1, 0, 0))  # bench W4's float32 forward
    (2, 0, 120)
    >>> pieces(256, 512, 784, 1, 2, 1 << 20, (12, 0, 0, 0))  # 512 not a multiple of 12
    (1, 0, 0)
    """
    if count > 1:  # whole matrices of the batch
        return min(count, most, max(2, m * n * k * count // piece_work)), 0, 0
    first = 0 if n <= m else 1  # bands of rows pack B (k x n) again, of columns A (m x k)
    for axis in (first, 1 - first):
        size, other = (m, n) if axis == 0 else (n, m)
        align, any_other = rule[2 * axis], rule[2 * axis + 1]
        if align > 0 and (any_other != 0 or other % align == 0):
            least = max(align, -(-piece_work // (other * k)))
            least = -(-least // align) * align
            bands = min(most, size // least)
            if bands < 2:
                return 1, 0, 0
            return bands, axis, size // bands // align * align  # step >= least
    return 1, 0, 0  # a band's bits might change along either axis


def may_be_syrk(
    a: int, b: int, m: int, n: int, ta: int, tb: int, lda: int, ldb: int, beta: int
) -> bool:
    """Whether the product of one matrix at address `a` by one at `b` (BLAS's flags and
    leading dimensions; `beta`: added to C) is a matrix times its own transpose, which
    NumPy's matmul computes with syrk (then its upper triangle mirrored: other bits than
    gemm's in the last place, a 33 x 100 float32 matrix for one) and so does the plan
    interpreter, matrix by matrix of a batch (runtime.vm), and runtime.gemm_split, which
    then leaves the product to it, whole (so a plan's build counts it among the products
    the cut does not take: runtime.thread_budget). Asked of each matrix: a batch's
    operands may be different arrays that coincide at one matrix."""
    return beta == 0 and a == b and m == n and ta != tb and lda == ldb
