"""Matrix products cut across the cores by threads that never spin-wait for long.

A plan runs BLAS on one thread: its own threads spin while they wait, and beside Numba's
parallel kernels, or a core another process keeps busy, a descheduled one stalls the
other (bench M2 with BLAS on two threads: 11 ms a call quiet, ~1 s with one busy core
beside). Instead, a product of the plan interpreter (runtime.vm) big enough to pay is cut
into pieces, bands of C's rows or columns (one per thread: each band packs the other
operand again, runtime.gemm_jobs) or groups of a batch's matrices, each a one-thread
gemm call. One worker thread (a daemon, started on first use) sleeps on a POSIX
semaphore. The calling thread posts the job, then claims pieces from the front while the
worker claims them from the back, each claim a `sem_trywait` on the piece's own semaphore
of value 1; the caller then waits, asleep (its core free), only for the pieces the worker
holds. So a descheduled worker costs at most the piece it is in, never the whole product,
and one that never wakes costs nothing.

The cut keeps a product's bits, as the plan's step runner (whole products, NumPy's
matmul on one BLAS thread) computes them: a batch is cut between its matrices, each
computed whole; a single product in bands of at least 2^20 multiply-adds (OpenBLAS's
small-matrix kernels take products of at most 100^3) along an axis whose alignment keeps
the bits on this CPU, C's other dimension a multiple of it, bands at multiples of it
(runtime.gemm_probe: OpenBLAS's kernels sum an element over k in another order in a
tile's narrower tail, tiles differing per CPU). Each element of C is then summed over k
in the same order whatever the band (checked over random shapes, both dtypes and
transposes, tests/test_runtime_gemm_split.py).

Two such products side by side in the plan whose operands are apart (the backward pass
of a matmul: g @ B.T and A.T @ g, which the plan table puts side by side) run as one job
(`pair`): the calling thread takes the one with the longer sums whole, the worker the
other, whole where it is no bigger (else in bands, `gemm_jobs.second_bands`). A band
re-reads and packs all of the other operand, which costs most where the sums are long:
bench M2's weight gradients (k = 1024) cost 1.15-1.3x their CPU time cut into bands of
16-64 rows; paired, they are not cut, and the plan has 14 jobs a call instead of 24 (10
pairs; the arena keeps what the first reads alive until the second is written,
runtime.executable._pair_spans).

`trace` records when each thread posts, starts and ends pieces and waits (the processor's
cycle counter), for tools/gemm_timeline.py. The state is one int64 array (its layout
below) holding the semaphores too; compiled code reaches it by its address, which the
plan table keeps among its function addresses. Where there are no unnamed POSIX
semaphores (not Linux) or NumPy's OpenBLAS is not found, products are not cut
(`state_address` is 0).
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from numba import carray, types

from fastgrad.compiler.machine_code import (
    OnceLock,
    cached_cfunc,
    cached_njit,
    helper_njit,
    source_tag,
)
from fastgrad.runtime.blas import SEMAPHORE_CALLS, TRANS, semaphore_calls
from fastgrad.runtime.blas_calls import (
    address_of,
    cycles,
    gemm,
    int64_pointer,
    sem_call,
)
from fastgrad.runtime.gemm_bands import (
    CUT_THREADS,
    DEFAULT_MIN_WORK,
    DEFAULT_PIECE_WORK,
    MAX_PIECES,
)
from fastgrad.runtime.gemm_jobs import (
    ALIGN,
    AXIS,
    BANDS,
    BETA,
    BLOCK,
    BOUNDS,
    COUNT,
    CUT,
    DONE,
    DOUBLE,
    GEMM,
    JOB,
    JOBS,
    LDA,
    LDB,
    LDC,
    LOCK,
    MIN_WORK,
    OFFSETS,
    PAIR_PIECES,
    PAIRED,
    PAIRING,
    PAIRS,
    PIECE,
    PIECE_WORK,
    PIECES,
    POST,
    POSTING,
    POSTS,
    READY,
    SEM_STRIDE,
    SEMS,
    SIZE,
    SPIN,
    STEP,
    STOLEN,
    STOP,
    TA,
    TAKEN,
    TB,
    TRACE,
    TRYWAIT,
    WAIT,
    WAIT_SPIN,
    WORK,
    A,
    B,
    C,
    K,
    M,
    N,
    apart,
    bounds,
    cut,
    load_row,
    second_bands,
    syrk,
)

# Measured on the 2-core development machine (float32, bench M2's products): see
# docs/architecture.md, "Matrix products across the cores".
DEFAULT_SPIN = 2000
DEFAULT_WAIT_SPIN = 200
DEFAULT_PAIR_PIECES = 1
# The timeline (`trace`): events of (cycle counter, kind, piece) per thread, after a count.
TRACE_SIZE = 1 << 14
POSTED, STARTED, FINISHED, WAITED, WOKEN = range(1, 6)


# The helpers below are compiled functions of their own, called, not inlined into their
# callers' Numba IR (see `_rows`), and typed once per kind of arguments (helper_njit).
_helper: Any = helper_njit()


@_helper
def _event(s: Any, thread: int, kind: int, piece: int) -> None:  # pragma: no cover
    """Add (cycles, kind, piece) to `thread`'s timeline (0: the caller), if one is kept."""
    if s[TRACE + thread] != 0:
        events = carray(int64_pointer(s[TRACE + thread]), (TRACE_SIZE,))
        n = events[0]
        if 3 * n + 3 < TRACE_SIZE:
            events[1 + 3 * n], events[2 + 3 * n], events[3 + 3 * n] = cycles(), kind, piece
            events[0] = n + 1


@_helper
def _semaphore(state: int, which: int) -> int:  # pragma: no cover - compiled
    return state + 8 * (SEMS + SEM_STRIDE * which)


@_helper
def _acquire(s: Any, state: int, which: int, spin: int) -> None:  # pragma: no cover
    """Take semaphore `which`: up to `spin` trywait rounds, then asleep."""
    sem = _semaphore(state, which)
    for _ in range(spin):
        if sem_call(s[TRYWAIT], sem) == 0:
            return
    while sem_call(s[WAIT], sem) != 0:  # EINTR: a signal woke it
        pass


@_helper
def _run_units(s: Any, j: int, first: int, last: int) -> None:  # pragma: no cover
    """The gemm calls of units `first` .. `last - 1` of the product in block `j` (its
    entries at s[j + GEMM] ...)."""
    item = 8 if s[j + DOUBLE] else 4
    bands, step = s[j + BANDS], s[j + STEP]
    offsets = carray(int64_pointer(s[j + OFFSETS]), (3 * s[j + COUNT],))
    for u in range(first, last):
        q, band = u // bands, u % bands
        a = s[j + A] + offsets[3 * q]
        b, c = s[j + B] + offsets[3 * q + 1], s[j + C] + offsets[3 * q + 2]
        m, n = s[j + M], s[j + N]
        if bands > 1:
            first_row = band * step
            if s[j + AXIS] == 0:  # rows of C: rows of op(A)
                m = step if band < bands - 1 else m - first_row
                a += first_row * (s[j + LDA] if s[j + TA] != TRANS else 1) * item
                c += first_row * s[j + LDC] * item
            else:  # columns of C: columns of op(B)
                n = step if band < bands - 1 else n - first_row
                b += first_row * (1 if s[j + TB] != TRANS else s[j + LDB]) * item
                c += first_row * item
        gemm(
            s[j + GEMM], s[j + DOUBLE], s[j + TA], s[j + TB], m, n, s[j + K], 1.0, a,
            s[j + LDA], b, s[j + LDB], float(s[j + BETA]), c, s[j + LDC],
        )  # fmt: skip


@_helper
def _run_piece(s: Any, piece: int) -> None:  # pragma: no cover - compiled
    """Piece `piece` of the job: the units s[BOUNDS + piece] .. s[BOUNDS + piece + 1] - 1
    of the one product; of a pair, piece 0 is the first product whole and piece i > 0
    the second's units s[BOUNDS + i - 1] .. s[BOUNDS + i] - 1."""
    if s[PAIRED] == 0:
        _run_units(s, JOB, s[BOUNDS + piece], s[BOUNDS + piece + 1])
    elif piece == 0:
        _run_units(s, JOB, 0, s[JOB + COUNT])
    else:
        _run_units(s, JOB + BLOCK, s[BOUNDS + piece - 1], s[BOUNDS + piece])


@_helper
def _share(s: Any, state: int, pieces: int) -> None:  # pragma: no cover - compiled
    """Run the job written into the state (its lock held) as `pieces` pieces: arm them,
    wake the worker, claim pieces from the front, wait for those the worker took from
    the back, then free the lock."""
    _event(s, 0, POSTED, pieces)
    for i in range(pieces):  # arm the claims: each post publishes the job written above
        sem_call(s[POST], _semaphore(state, PIECE + i))
    sem_call(s[POST], _semaphore(state, WORK))
    mine = 0
    for i in range(pieces):
        if sem_call(s[TRYWAIT], _semaphore(state, PIECE + i)) == 0:
            _event(s, 0, STARTED, i)
            _run_piece(s, i)
            _event(s, 0, FINISHED, i)
            mine += 1
    for _ in range(pieces - mine):  # the worker's pieces: it posts DONE after each
        _acquire(s, state, DONE, s[WAIT_SPIN])
    _event(s, 0, WAITED, pieces - mine)
    s[JOBS] += 1
    s[TAKEN] += pieces - mine
    sem_call(s[POST], _semaphore(state, LOCK))


@_helper
def product(
    state: int, table: Any, at: int, count: int, address: int, double: int, ta: int, tb: int,
    m: int, n: int, k: int, lda: int, ldb: int, ldc: int, beta: int, a: int, b: int, c: int,
) -> bool:  # pragma: no cover - compiled  # fmt: skip
    """`c (+)= a @ b` (gemm at `address`, its arguments as the interpreter's GEMM row
    holds them) for the `count` matrices whose byte offsets are triples from `table[at]`,
    cut across this thread and the worker. False, and nothing done, where the product is
    too small to pay (below MIN_WORK, or fewer than two pieces of PIECE_WORK), the worker
    is not serving, another thread is cutting a product, the product may be a syrk (one
    operand times its own transpose), or a single matrix may be cut along neither axis
    (gemm_jobs.cut)."""
    s = carray(int64_pointer(state), (SIZE,))
    work = m * n * k * count
    if s[READY] == 0 or work < s[MIN_WORK]:
        return False
    if sem_call(s[TRYWAIT], _semaphore(state, LOCK)) != 0:
        return False
    j = JOB
    s[j + GEMM], s[j + DOUBLE], s[j + TA], s[j + TB] = address, double, ta, tb
    s[j + M], s[j + N], s[j + K], s[j + LDA], s[j + LDB], s[j + LDC] = m, n, k, lda, ldb, ldc
    s[j + BETA], s[j + A], s[j + B], s[j + C] = beta, a, b, c
    s[j + OFFSETS], s[j + COUNT] = address_of(table, at), count
    pieces = 0 if syrk(s, j) else cut(s, j, MAX_PIECES if count > 1 else s[PIECES])
    if pieces < 2:
        sem_call(s[POST], _semaphore(state, LOCK))
        return False
    s[PAIRED] = 0
    bounds(s, j, pieces)
    _share(s, state, pieces)
    return True


@_helper
def pair(
    state: int, table: Any, functions: int, ptrs: int, p: int, q: int
) -> bool:  # pragma: no cover - compiled
    """The interpreter's GEMM rows at `table[p]` and `table[q]` run at once: this thread
    takes the one with the longer sums (k) whole, whose bands would each read and pack
    all of its other operand again (module doc); the other is cut as `product` cuts it
    (gemm_jobs.second_bands: whole where it has no more multiply-adds), the worker taking
    it (or its bands from the back) and this thread the rest once its own is done: a late
    worker costs at most the second's bands it has started. Each keeps the bits it has
    alone. False, and nothing done, where the worker is not serving, another thread is
    cutting a product, either product may be a syrk, or the second reads or writes what
    the first writes, or writes what it reads (bounds of the bytes each may touch)."""
    s = carray(int64_pointer(state), (SIZE,))
    if s[READY] == 0 or s[PAIRING] == 0 or sem_call(s[TRYWAIT], _semaphore(state, LOCK)) != 0:
        return False
    first, second = JOB, JOB + BLOCK
    load_row(s, first, table, functions, ptrs, p)
    load_row(s, second, table, functions, ptrs, q)
    ok = not (syrk(s, first) or syrk(s, second))
    if ok:
        for operand in (A, B, C):
            ok = ok and apart(s, first, operand, second)
        for operand in (A, B):
            ok = ok and apart(s, second, operand, first)
    if not ok:
        sem_call(s[POST], _semaphore(state, LOCK))
        return False
    if s[first + K] < s[second + K]:  # the one whose bands cost more runs whole
        for e in range(BLOCK):
            s[first + e], s[second + e] = s[second + e], s[first + e]
    s[PAIRED] = 1
    s[PAIRS] += 1
    rest = cut(s, second, second_bands(s, first, second))
    bounds(s, second, rest)
    _share(s, state, 1 + rest)
    return True


@_helper
def post(
    state: int, table: Any, functions: int, ptrs: int, p: int
) -> bool:  # pragma: no cover - compiled
    """Hand the GEMM row at `table[p]` to the worker whole, not waiting: the caller goes
    on and calls `join` before what needs it (runtime.plan_posts), holding the product
    lock until then (other products run whole). False, and nothing done, where the
    worker is not serving, posting is off, the lock is held, or it may be a syrk."""
    s = carray(int64_pointer(state), (SIZE,))
    if s[READY] == 0 or s[POSTING] == 0 or sem_call(s[TRYWAIT], _semaphore(state, LOCK)) != 0:
        return False
    load_row(s, JOB, table, functions, ptrs, p)
    if syrk(s, JOB):
        sem_call(s[POST], _semaphore(state, LOCK))
        return False
    s[PAIRED] = 0
    bounds(s, JOB, 1)
    _event(s, 0, POSTED, 1)
    sem_call(s[POST], _semaphore(state, PIECE))  # arm its claim: publishes the job
    sem_call(s[POST], _semaphore(state, WORK))
    s[POSTS] += 1
    return True


@_helper
def join(state: int) -> None:  # pragma: no cover - compiled
    """Wait for the product `post` handed to the worker, then free the product lock. If
    the worker has not started it (asleep, descheduled, or slow to wake), the caller
    claims it and runs it itself: a worker that never wakes costs nothing but the
    overlap."""
    s = carray(int64_pointer(state), (SIZE,))
    if sem_call(s[TRYWAIT], _semaphore(state, PIECE)) == 0:
        _event(s, 0, STARTED, 0)
        _run_piece(s, 0)
        _event(s, 0, FINISHED, 0)
        s[STOLEN] += 1
        _event(s, 0, WAITED, 0)
    else:
        _acquire(s, state, DONE, s[WAIT_SPIN])
        s[TAKEN] += 1
        _event(s, 0, WAITED, 1)
    s[JOBS] += 1
    sem_call(s[POST], _semaphore(state, LOCK))


POST_ROW, JOIN_ROW = -2, -3  # `_rows`'s q: `post` the row at p; `join` it

#: `int64 rows(int64* table, int64 p, int64 q)`: the interpreter's GEMM row at table[p]
#: (runtime.vm's layout: [GEMM, gemm, syrk, split, float64?, trans a, trans b, m, n, k,
#: lda, ldb, ldc, beta, pointers a, b, c, count, offsets]) cut across the cores, with the
#: GEMM row at table[q] whose `split` is set too (-1: none) beside it if both can run at
#: once; returns 0 (nothing done: run it whole), 1 (the row at p done) or 2 (both done).
#: With q POST_ROW: 1 where the row at p is posted (`post`), 0 where not (run it whole);
#: with q JOIN_ROW: `join` (what was posted), 1.
ROWS_SIGNATURE = types.int64(types.CPointer(types.int64), types.int64, types.int64)


def _rows(pointer: Any, p: int, q: int) -> int:  # pragma: no cover - compiled
    """`ROWS_SIGNATURE`'s function over the interpreter's table at `pointer` (its header
    says where its functions and pointers are, and its length: entry 6). A C function of
    its own, which the interpreter's loop calls by address (runtime.vm): inlined into
    that loop, it made it take 15 s of CPU to compile cold (~1.7 s now; this, ~2.4 s)."""
    table = carray(pointer, (pointer[6],))
    functions, ptrs = table[1], table[2]
    state = table[functions + table[p + 3]]
    if q == POST_ROW:
        return 1 if post(state, table, functions, ptrs, p) else 0
    if q == JOIN_ROW:
        join(state)
        return 1
    if q >= 0 and pair(state, table, functions, ptrs, p, q):
        return 2
    done = product(
        state, table, p + 18, table[p + 17], table[functions + table[p + 1]],
        table[p + 4], table[p + 5], table[p + 6], table[p + 7], table[p + 8], table[p + 9],
        table[p + 10], table[p + 11], table[p + 12], table[p + 13],
        table[ptrs + table[p + 14]], table[ptrs + table[p + 15]], table[ptrs + table[p + 16]],
    )  # fmt: skip
    return 1 if done else 0


def _source_tag() -> str:
    """What the worker's cached machine code is keyed by besides Numba's: this module's
    source and that of the code it inlines (the job, the cut's rule, the BLAS call), and
    of TRANS's module."""
    here = Path(__file__).parent
    names = ("gemm_split", "gemm_jobs", "gemm_bands", "blas_calls", "blas")
    return source_tag("gemm split", *(here / f"{name}.py" for name in names))


@cached_njit(_source_tag(), nogil=True)
def _serve(state: int) -> None:  # pragma: no cover - compiled
    """The worker: asleep until a job is posted, then it claims and runs pieces from the
    back, posting DONE after each, until STOP. Every piece's claim is tried (one that
    fails is the caller's, or a piece of no job): a worker woken late never reads a job's
    size before the job is armed."""
    s = carray(int64_pointer(state), (SIZE,))
    while True:
        _acquire(s, state, WORK, s[SPIN])
        if s[STOP]:
            return
        _event(s, 1, WOKEN, 0)
        for i in range(MAX_PIECES - 1, -1, -1):
            if sem_call(s[TRYWAIT], _semaphore(state, PIECE + i)) == 0:
                _event(s, 1, STARTED, i)
                _run_piece(s, i)
                _event(s, 1, FINISHED, i)
                sem_call(s[POST], _semaphore(state, DONE))


_ROWS: list[Any] = []  # the compiled `_rows`, kept alive
_ROWS_LOCK = OnceLock()


def rows_function() -> int:
    """The address of `_rows` (`ROWS_SIGNATURE`), compiled or loaded on first use."""
    with _ROWS_LOCK:
        if not _ROWS:
            _ROWS.append(cached_cfunc(_rows, ROWS_SIGNATURE, _source_tag()))
        return int(_ROWS[0].address)


def build() -> int:
    """Compile (or load) the worker's loop and the cut, then start the worker (unless
    stopped meanwhile); the cut's address. Run once per process by the compile thread
    (runtime.adapters.product_worker), in turn with kernels and under its watchdog (on
    a thread of its own it held Numba's compiler lock 3-4 s while a cold plan's first
    adapter waited). Where either fails to compile, products run whole, with a warning."""
    what = "loop (_serve)"
    try:
        _serve.compile((types.int64,))
        what = "cut (_rows)"
        cut = rows_function()
    except Exception as error:
        warnings.warn(
            f"fastgrad: the {what} of the worker that cuts matrix products across the cores"
            f" could not be compiled ({type(error).__name__}: {error}); products run whole",
            RuntimeWarning,
            stacklevel=1,
        )
        raise
    _WORKER.serve(cut)
    return cut


class _Worker:
    """The process's state array and worker thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: np.ndarray | None = None
        self.thread: threading.Thread | None = None
        self.calls: dict[str, Any] | None = None
        self.looked = False
        self.wanted = False  # serve once built: `address` asked, `stop` not called since

    def address(self) -> int:
        with self.lock:
            if not self.looked:
                self.calls, self.looked = semaphore_calls(), True
            if self.calls is None:
                return 0
            if self.state is None:
                self.state = np.zeros(SIZE, np.int64)
                self._reset()
            self.wanted = True
            self._start()
            return int(self.state.ctypes.data)

    def _reset(self) -> None:
        """Fresh semaphores (the lock free, no job) and settings; not serving."""
        s, calls = self.state, self.calls
        assert s is not None and calls is not None
        s[:CUT], s[CUT + 1 :] = 0, 0  # (the cut's address stays valid: same process)
        s[WAIT], s[TRYWAIT], s[POST] = (calls[n] for n in SEMAPHORE_CALLS)
        s[SPIN], s[PIECE_WORK], s[MIN_WORK] = DEFAULT_SPIN, DEFAULT_PIECE_WORK, DEFAULT_MIN_WORK
        s[WAIT_SPIN], s[PAIRING], s[PAIR_PIECES] = DEFAULT_WAIT_SPIN, 1, DEFAULT_PAIR_PIECES
        s[PIECES], s[POSTING] = CUT_THREADS, 1
        from fastgrad.runtime import gemm_probe  # (Python: not a source of vm's loop)

        s[ALIGN:SIZE] = gemm_probe.alignments()  # (once per process; gemm_bands.ANSWER)
        for which in range(PIECE + MAX_PIECES):
            calls["sem_init"](_semaphore_at(s, which), 0, int(which == LOCK))

    def serve(self, cut: int) -> None:
        """Serve, the cut at `cut` (`build` calls this once the worker's loop and the cut
        are built), unless stopped since the last `address()`."""
        with self.lock:
            assert self.state is not None
            self.state[CUT] = cut
            self._start()

    def _start(self) -> None:
        """Start the worker thread (the lock held) if asked for, not running, and built."""
        assert self.state is not None
        if self.wanted and self.thread is None and self.state[CUT] != 0:
            self.thread = threading.Thread(target=self._run, name="fastgrad-gemm", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        # No BLAS setting of its own: BLAS's thread count is the process's, and the
        # worker runs pieces only while a caller's table is in the one-thread region
        # (runtime.blas; a plan cuts products only where it runs BLAS on one thread).
        # Holding the region for its whole life kept NumPy on one thread for good.
        state = self.state
        assert state is not None
        state[READY] = 1
        _serve(int(state.ctypes.data))

    def stop(self) -> None:
        """Stop the worker and wait for it; products are not cut until `address()`."""
        with self.lock:
            thread, s = self.thread, self.state
            self.wanted = False
            if thread is None or s is None:
                return
            # Take the product lock first: a product under way in another thread holds it
            # and runs its pieces from this state, which `_reset` re-creates (its lock too).
            call = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
            while call(int(s[WAIT]))(_semaphore_at(s, LOCK)) != 0:  # (EINTR: again)
                pass
            s[READY] = 0
            s[STOP] = 1
            call(int(s[POST]))(_semaphore_at(s, WORK))
            thread.join()
            self.thread = None
            self._reset()

    def after_fork(self) -> None:
        """In a forked child no worker survives: products are not cut until a plan is
        lowered again (runtime.plan_table calls `state_address`), which starts one, or
        the worker's compile under way in the parent ends in the child's compile thread
        (runtime.background; the cut's lock made anew: machine_code.OnceLock)."""
        self.lock = threading.Lock()
        self.thread = None
        if self.state is not None:
            self._reset()


def _semaphore_at(s: np.ndarray, which: int) -> int:
    return int(s.ctypes.data) + 8 * (SEMS + SEM_STRIDE * which)


_WORKER = _Worker()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKER.after_fork)


def state_address() -> int:
    """The address of the state (for the plan table); 0 where products are not cut. The
    worker serves from then on once built (`build`: runtime.adapters.product_worker
    queues it; products run whole until then)."""
    return _WORKER.address()


def state() -> np.ndarray | None:
    """The state array (tests and tuning set SPIN, PIECE_WORK, MIN_WORK; read JOBS and
    TAKEN), or None before first use."""
    return _WORKER.state


def stop() -> None:
    """Stop the worker thread: products are not cut until `state_address` is called."""
    _WORKER.stop()


def trace(caller: np.ndarray | None, worker: np.ndarray | None) -> None:
    """Keep the timelines of the jobs from now on in `caller` and `worker` (int64 arrays
    of TRACE_SIZE: a count, then (cycles, kind, piece) per event: POSTED with the pieces,
    STARTED and FINISHED with the piece, WAITED with the pieces the worker ran, WOKEN);
    None, None: stop. The arrays must live until then."""
    s = _WORKER.state
    if s is None:
        raise RuntimeError("no worker yet: trace after the first plan that cuts a product")
    for thread, events in enumerate((caller, worker)):
        if events is not None and (events.dtype != np.int64 or events.size < TRACE_SIZE):
            raise ValueError(f"trace: {('caller', 'worker')[thread]} needs {TRACE_SIZE} int64s")
        s[TRACE + thread] = 0 if events is None else events.ctypes.data
