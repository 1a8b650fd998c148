"""Two products side by side run at once (runtime.gemm_split.pair): each keeps the bits
it has alone; products that read or write what the other writes are never paired; the
plan table puts a backward pass's two products of a matmul side by side (the views
between them moved before), and a program's value and gradients keep the step runner's
bits.

Tolerance against a float64 product as in test_runtime_gemm_split."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime import blas, gemm_split, vm
from fastgrad.runtime.blas import blas_address, region_address
from test_runtime_gemm_split import (  # noqa: F401 - a fixture
    _check,
    _cut_axis,
    _layout,
    _offsets,
    _tiny_pieces,
    _transposed,
    pytestmark,
    split,
)
from test_runtime_vm import _jitted, sync  # noqa: F401 - a fixture

Product = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # c (+)= a @ b


@pytest.fixture
def no_posting(split: np.ndarray) -> Any:  # noqa: F811
    """Plans lowered meanwhile post no product (runtime.plan_posts): they pair them."""
    split[gemm_split.POSTING] = 0
    yield split
    split[gemm_split.POSTING] = 1


def _rows(products: list[Product], cut: bool) -> Any:
    """An interpreter table of one GEMM row per product, in order, run as one segment:
    operand slots 3i, 3i + 1, 3i + 2 are product i's a, b, c."""
    code: list[int] = []
    starts = []
    for i, (a, b, c, beta) in enumerate(products):
        (ta, lda), (tb, ldb) = _layout(a), _layout(b)
        m, k = a.shape[-2:]
        n = b.shape[-1]
        offsets = _offsets(a, b, c)
        ldc = c.strides[-2] // c.itemsize
        params = [int(c.dtype == np.float64), ta, tb, m, n, k, lda, ldb, ldc]
        starts.append(len(code))
        code += [vm.GEMM, 0, 1, 2 if cut else -1, *params, beta, 3 * i, 3 * i + 1, 3 * i + 2]
        code += [len(offsets) // 3, *offsets]
    dtype = products[0][2].dtype
    state = gemm_split.state_address() if cut else 0
    functions = [blas_address("gemm", dtype), blas_address("syrk", dtype), state]
    count = 3 * len(products)
    record = [0, len(products), count, *range(count)]
    table, at = vm.pack(code, starts, functions, count, [], [record], region_address())
    arrays = tuple(x for a, b, c, _ in products for x in (a, b, c))
    return lambda: vm.run_steps(table, at[0], arrays)


def _draw_product(data: Any, dtype: Any, rng: np.random.Generator) -> Product:
    m, k = data.draw(st.integers(1, 60)), data.draw(st.integers(1, 60))
    n = data.draw(st.one_of(st.integers(1, 60), st.sampled_from([16, 32, 48])))
    batch_a, batch_b = data.draw(st.sampled_from([((), ()), ((3,), (3,)), ((2,), ())]))
    flip_a, flip_b, accumulate = (data.draw(st.booleans()) for _ in range(3))
    a = _transposed(rng.standard_normal((*batch_a, m, k)).astype(dtype), flip_a)
    b = _transposed(rng.standard_normal((*batch_b, k, n)).astype(dtype), flip_b)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)
    c = rng.standard_normal(shape).astype(dtype) if accumulate else np.zeros(shape, dtype)
    return a, b, c, int(accumulate)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_paired_products_keep_their_bits(split: np.ndarray, dtype: Any, data: Any) -> None:  # noqa: F811
    """Two independent products of random shapes (transposed, batched, accumulating, the
    second whole or cut into tiny bands): run as a pair, each gives the bits of the same
    table run without the cut (one gemm call per matrix, in order), within the k-term
    bound. A single product cut into bands is held to the bound only: bands this tiny
    (plans cut bands of 2^20 multiply-adds at least) may take OpenBLAS's small-matrix
    kernels where the whole product does not, or the reverse (float64, 26 x 32 @ (48 x
    32).T in bands of 16 columns differed in its last bits, paired or not)."""
    _tiny_pieces(split)
    split[gemm_split.PAIR_PIECES] = data.draw(st.sampled_from([1, gemm_split.MAX_PIECES - 1]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    products = [_draw_product(data, dtype, rng) for _ in range(2)]
    starts = [c.copy() for _, _, c, _ in products]
    whole = [(a, b, c.copy(), beta) for a, b, c, beta in products]
    _rows(whole, cut=False)()
    pairs = split[gemm_split.PAIRS]
    try:
        _rows(products, cut=True)()
    finally:
        split[gemm_split.PAIR_PIECES] = gemm_split.DEFAULT_PAIR_PIECES
    assert split[gemm_split.PAIRS] == pairs + 1
    second = split[gemm_split.JOB + gemm_split.BLOCK + gemm_split.C]
    banded = second if _second_bands(split) > 1 else None  # the address of its c
    for (a, b, c, _), (_, _, expected, _), start in zip(products, whole, starts, strict=True):
        if c.ctypes.data != banded:
            assert np.array_equal(c, expected)
        _check(c, a, b, start)


def test_dependent_products_are_not_paired(split: np.ndarray) -> None:  # noqa: F811
    """The second product reads the first's output, writes the first's input, or
    accumulates where the first writes: run in order, never at once (the same bits as
    the table run without the cut). Two products writing apart halves of one array pair."""
    _tiny_pieces(split)
    rng = np.random.default_rng(3)
    a, b, w = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(3))

    def chained() -> list[Product]:  # reads c
        c = np.empty((64, 64), np.float32)
        return [(a, b, c, 0), (c, w, np.empty((64, 64), np.float32), 0)]

    def overwrites() -> list[Product]:  # writes x, which the first reads
        x = a.copy()
        return [(x, b, np.empty((64, 64), np.float32), 0), (w, b, x, 0)]

    def accumulates() -> list[Product]:  # both write c
        c = np.ones((64, 64), np.float32)
        return [(a, b, c, 1), (w, b, c, 1)]

    def halves() -> list[Product]:  # rows 0-63 and 64-127 of one array
        both = np.zeros((128, 64), np.float32)
        return [(a, b, both[:64], 0), (w, b, both[64:], 0)]

    for make, paired in [(chained, 0), (overwrites, 0), (accumulates, 0), (halves, 1)]:
        expected, got = make(), make()
        _rows(expected, cut=False)()
        pairs = split[gemm_split.PAIRS]
        _rows(got, cut=True)()
        assert split[gemm_split.PAIRS] == pairs + paired, make.__name__
        for e, g in zip(expected, got, strict=True):
            assert all(np.array_equal(x, y) for x, y in zip(e[:3], g[:3], strict=True))


@pytest.mark.usefixtures("sync", "no_posting")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_matmuls_backward_products_run_as_a_pair(split: np.ndarray, dtype: Any) -> None:  # noqa: F811
    """x @ w's backward pass: g @ w.T and x.T @ g, with transposes between, are put side
    by side and run at once; values and gradients keep the step runner's bits."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((512, 128)).astype(dtype)
    w = (rng.standard_normal((128, 256)) * 0.1).astype(dtype)

    def loss(x: Any, w: Any) -> Any:
        return fnp.sum(fnp.tanh(x @ w) ** 2)

    vg = fg.value_and_grad(loss, argnums=(0, 1))
    expected = _jitted(vg, "steps")(x, w)
    g = _jitted(vg, "vm")
    g(x, w)
    pairs = split[gemm_split.PAIRS]
    got = g(x, w)
    assert split[gemm_split.PAIRS] == pairs + 1
    split[gemm_split.PAIRING] = 0  # turned off (tuning): cut one after the other
    try:
        alone = g(x, w)
    finally:
        split[gemm_split.PAIRING] = 1
    assert split[gemm_split.PAIRS] == pairs + 1
    for e, c, a in zip(
        [expected[0], *expected[1]], [got[0], *got[1]], [alone[0], *alone[1]], strict=True
    ):
        assert np.array_equal(np.asarray(e), np.asarray(c))
        assert np.array_equal(np.asarray(e), np.asarray(a))


@pytest.mark.usefixtures("sync", "no_posting")
def test_the_step_runner_runs_blas_on_one_thread_where_the_interpreter_does(
    split: np.ndarray,  # noqa: F811
) -> None:
    """The step runner is the reference whose bits the interpreter's products keep, so it
    runs them on one BLAS thread wherever the interpreter's plan does (which runs them so
    whichever runtime is chosen: thread_budget.shares_cores), though its own products are
    never cut. Here BLAS is set to two threads for the calling thread, as OpenBLAS runs a
    call with no other thread inside it: OpenBLAS's two threads sum some of these
    products' elements in another order than its one (float32, its AVX2 kernels), and the
    step runner's bits were the interpreter's only when another thread was in BLAS."""
    set_local = blas._set_threads_local()
    if set_local is None:
        pytest.skip("BLAS's threads are not set per thread")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((512, 128)).astype(np.float32)
    w = (rng.standard_normal((128, 256)) * 0.1).astype(np.float32)

    def loss(x: Any, w: Any) -> Any:
        return fnp.sum(fnp.tanh(x @ w) ** 2)

    vg = fg.value_and_grad(loss, argnums=(0, 1))
    steps, interpreted = _jitted(vg, "steps"), _jitted(vg, "vm")
    before = set_local(2)
    try:
        expected = [steps(x, w) for _ in range(2)][-1]  # (the second: compiled kernels)
        got = [interpreted(x, w) for _ in range(2)][-1]
    finally:
        set_local(before)
    for e, g in zip([expected[0], *expected[1]], [got[0], *got[1]], strict=True):
        assert np.array_equal(np.asarray(e), np.asarray(g))
    assert steps.lower(x, w).executable.one_blas_thread


@pytest.mark.usefixtures("sync", "no_posting")
def test_the_arena_keeps_what_the_first_product_reads_for_the_pair(split: np.ndarray) -> None:  # noqa: F811
    """s = (x @ a) @ (x @ b): its backward's ds @ v.T and q.T @ ds are side by side, and v
    dies at the first; the arena would give dv v's memory, and the pair could not run at
    once. v lives until dv is written: every side-by-side pair of the plan runs as one,
    with the step runner's bits."""
    rng = np.random.default_rng(5)
    x, a, b = (0.1 * rng.standard_normal((256, 256)) for _ in range(3))

    def loss(x: Any, a: Any, b: Any) -> Any:
        return fnp.sum(fnp.tanh((x @ a) @ (x @ b)))

    vg = fg.value_and_grad(loss, argnums=(0, 1, 2))
    expected = _jitted(vg, "steps")(x, a, b)
    g = _jitted(vg, "vm")
    g(x, a, b)
    pairs = split[gemm_split.PAIRS]
    got = g(x, a, b)
    assert split[gemm_split.PAIRS] == pairs + 4  # (q, v), (dq, dv), (da, dx), (db, dx)
    for e, c in zip([expected[0], *expected[1]], [got[0], *got[1]], strict=True):
        assert np.array_equal(np.asarray(e), np.asarray(c))


def _second_bands(state: np.ndarray) -> int:
    """Into how many bands the last pair's second product was cut (1: whole)."""
    return int(state[gemm_split.JOB + gemm_split.BLOCK + gemm_split.BANDS])


def test_a_pairs_second_product_is_whole_unless_bigger(split: np.ndarray) -> None:  # noqa: F811
    """A pair of products of as many multiply-adds (a matmul's backward pass): the second
    is whole (PAIR_PIECES, 1: the worker's; each band would pack its operand again), or
    in PAIR_PIECES bands where tuning says so. One with more multiply-adds, W2 = 2 W1 or
    3 W1, is cut into about 2 W2 / (W2 - W1) bands, 4 or 3, so that the caller's share
    after its own (one band) leaves both threads about half; each keeps the uncut bits."""
    assert split[gemm_split.PAIR_PIECES] == gemm_split.DEFAULT_PAIR_PIECES == 1
    rng = np.random.default_rng(6)

    def products(rows: int) -> list[Product]:  # C 192 wide: a multiple of 12, 16, 24, 48
        a, x = (rng.standard_normal((n, 256)).astype(np.float32) for n in (256, rows))
        b = rng.standard_normal((256, 192)).astype(np.float32)
        c, y = (np.empty((n, 192), np.float32) for n in (256, rows))
        return [(a, b, c, 0), (x, b, y, 0)]

    for rows, bands in [(256, 1), (512, 4), (768, 3)]:
        got = products(rows)
        expected = [(a, b, c.copy(), beta) for a, b, c, beta in got]
        _rows(expected, cut=False)()
        pairs = split[gemm_split.PAIRS]
        _rows(got, cut=True)()
        assert split[gemm_split.PAIRS] == pairs + 1
        if _cut_axis(split, np.float32, rows, 192, 256, bands) is None:
            bands = 1  # this machine's BLAS keeps no band's bits here (runtime.gemm_probe)
        assert _second_bands(split) == bands, rows
        assert all(np.array_equal(e[2], g[2]) for e, g in zip(expected, got, strict=True))
    for pieces in (2, gemm_split.MAX_PIECES - 1):
        split[gemm_split.PAIR_PIECES] = pieces
        try:
            got = products(256)
            expected = [(a, b, c.copy(), beta) for a, b, c, beta in got]
            _rows(expected, cut=False)()
            _rows(got, cut=True)()
            assert _second_bands(split) == pieces
            assert all(np.array_equal(e[2], g[2]) for e, g in zip(expected, got, strict=True))
        finally:
            split[gemm_split.PAIR_PIECES] = gemm_split.DEFAULT_PAIR_PIECES


def test_two_threads_run_pairs_at_once(split: np.ndarray) -> None:  # noqa: F811
    """Two Python threads run tables of a pair each, 40 times: whichever holds the worker
    pairs, the other runs its products in turn; every result has the uncut bits. A
    failure says which product of which iteration, how many elements differ, how many
    were never written (NaN) and the largest difference: a piece lost or run twice (a
    race) leaves NaN or large errors, a band cut where OpenBLAS's tiles change the order
    of the sums only last-bit differences."""
    failures: list[tuple[int, int, int, int, int, float]] = []

    def run(seed: int) -> None:
        rng = np.random.default_rng(seed)
        a, b, x = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(3))
        got = [(a, b, np.empty_like(a), 0), (x, b, np.empty_like(a), 0)]
        expected = [(a, b, c.copy(), beta) for a, b, c, beta in got]
        _rows(expected, cut=False)()
        table = _rows(got, cut=True)
        for iteration in range(40):
            for _, _, c, _ in got:
                c[...] = np.nan
            table()
            for product, (e, g) in enumerate(zip(expected, got, strict=True)):
                if not np.array_equal(e[2], g[2]):
                    unwritten = int(np.isnan(g[2]).sum())
                    largest = float(np.nanmax(np.abs(e[2] - g[2]), initial=0.0))
                    differ = int((e[2] != g[2]).sum())
                    failures.append((seed, iteration, product, differ, unwritten, largest))

    split[gemm_split.MIN_WORK] = 1
    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, f"(seed, iteration, product, differing, NaN, largest): {failures}"


def test_the_timeline_shows_each_threads_pieces(split: np.ndarray) -> None:  # noqa: F811
    """With a timeline kept (gemm_split.trace), a pair's job is one POSTED event of its
    pieces; the pieces each thread STARTED and FINISHED, in order of its cycle counter,
    add up to them, and WAITED names the worker's. Nothing is written once it stops."""
    split[gemm_split.PAIR_PIECES] = gemm_split.DEFAULT_PAIR_PIECES
    rng = np.random.default_rng(8)
    a, b, x = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(3))
    table = _rows([(a, b, np.empty_like(a), 0), (x, b, np.empty_like(a), 0)], cut=True)
    caller, worker = (np.zeros(gemm_split.TRACE_SIZE, np.int64) for _ in range(2))
    gemm_split.trace(caller, worker)
    try:
        table()
        threading.Event().wait(0.05)  # the worker's last event
    finally:
        gemm_split.trace(None, None)
    events = [e[1 : 1 + 3 * e[0]].reshape(-1, 3) for e in (caller, worker)]
    kinds = [list(e[:, 1]) for e in events]
    pieces = 1 + gemm_split.DEFAULT_PAIR_PIECES  # the first whole, the second in bands
    assert kinds[0][0] == gemm_split.POSTED and events[0][0, 2] == pieces
    assert kinds[0][-1] == gemm_split.WAITED
    ran = [k.count(gemm_split.STARTED) for k in kinds]
    assert ran == [k.count(gemm_split.FINISHED) for k in kinds]
    assert sum(ran) == pieces and events[0][-1, 2] == ran[1]
    assert all(np.all(np.diff(e[:, 0]) >= 0) for e in events)
    table()
    assert caller[0] == len(events[0])
    with pytest.raises(ValueError, match="caller needs"):
        gemm_split.trace(np.zeros(4, np.int64), None)
