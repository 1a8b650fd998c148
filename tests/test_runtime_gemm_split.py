"""Products cut across the cores (runtime.gemm_split) against NumPy: random shapes
(1-row and 1-column ones included), transposed operands, batches (broadcast ones too),
accumulation, float32 and float64; the same bits as one uncut gemm; many cut products
from two Python threads at once; a stopped worker, a forked child and interpreter exit;
whole programs through the interpreter with and without the cut, against the step
runner.

Tolerance against a float64 product of the same inputs: |c - exact| <= 2 k eps (|a| @ |b|),
the textbook bound of a k-term dot product (the cut does not change the bits, a test
below checks, but a band may take another of OpenBLAS's kernels when tests make bands
tiny)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime import background, blas, gemm_bands, gemm_split, vm
from fastgrad.runtime.blas import OneThread, blas_address, region_address
from fastgrad.runtime.plan_rows import NO_TRANS, TRANS
from test_runtime_vm import _jitted, sync  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or blas_address("gemm", np.dtype(np.float32)) is None,
    reason="products are cut on Linux with NumPy's OpenBLAS only",
)


@pytest.fixture(scope="module")
def split() -> Iterator[np.ndarray]:
    """The worker serving, its settings restored after the test."""
    _serving()
    s = gemm_split.state()
    assert s is not None
    before = s.copy()
    _wait_ready(s)
    yield s
    for entry in (gemm_split.SPIN, gemm_split.PIECE_WORK, gemm_split.MIN_WORK):
        s[entry] = before[entry]
    s[gemm_split.PAIR_PIECES] = before[gemm_split.PAIR_PIECES]
    s[gemm_split.PIECES] = before[gemm_split.PIECES]


def _serving() -> None:
    """Ask for the worker as a plan does: its state, and its compile queued (once)."""
    from fastgrad.runtime import adapters

    gemm_split.state_address()
    adapters.product_worker(False)


def _wait_ready(s: np.ndarray) -> None:
    # The worker compiles (or loads) its loop first: over 20 s on a machine loaded ~15.
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if s[gemm_split.READY]:
            return
        threading.Event().wait(0.01)
    raise AssertionError("the worker did not start")


def _cut_axis(s: np.ndarray, dtype: Any, m: int, n: int, k: int, most: int) -> int | None:
    """Along which axis (0: C's rows) the cut takes a single m x k @ k x n product, by
    the rule a plan's build reads too (runtime.gemm_bands) with the probe's answer in the
    state (runtime.gemm_probe), or None where it runs whole."""
    at = gemm_split.ALIGN + 4 * int(np.dtype(dtype) == np.float64)
    rule = tuple(int(g) for g in s[at : at + 4])
    pieces, axis, _ = gemm_bands.pieces(m, n, k, 1, most, int(s[gemm_split.PIECE_WORK]), rule)
    return axis if pieces > 1 else None


def _tiny_pieces(s: np.ndarray) -> None:
    s[gemm_split.PIECE_WORK], s[gemm_split.MIN_WORK] = 16, 1


def _layout(x: np.ndarray) -> tuple[int, int]:
    """BLAS's transpose flag and leading dimension for a 2-D operand (as test arrays are
    made: C-contiguous, or the transpose of a C-contiguous array)."""
    rows, cols = x.shape[-2:]
    item = x.itemsize
    if x.strides[-1] == item:
        return NO_TRANS, max(x.strides[-2] // item, cols, 1)
    return TRANS, max(x.strides[-1] // item, rows, 1)


def _offsets(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> list[int]:
    """A GEMM row's byte offsets of each matrix of c's batch into a, b and c (broadcast)."""
    offsets: list[int] = []
    for index in itertools.product(*map(range, c.shape[:-2])):
        for x in (a, b, c):
            dims = x.shape[:-2]
            lead = index[len(index) - len(dims) :]
            offsets += [sum(i * s for i, d, s in zip(lead, dims, x.strides, strict=False) if d > 1)]
    return offsets


def _table(a: np.ndarray, b: np.ndarray, c: np.ndarray, beta: int, cut: bool) -> Any:
    """An interpreter table of one GEMM row, `c (+)= a @ b` over the broadcast batch."""
    (ta, lda), (tb, ldb) = _layout(a), _layout(b)
    m, k = a.shape[-2:]
    n = b.shape[-1]
    offsets = _offsets(a, b, c)
    double = int(c.dtype == np.float64)
    params = [double, ta, tb, m, n, k, lda, ldb, n, beta]
    state = gemm_split.state_address() if cut else 0
    functions = [blas_address("gemm", c.dtype), blas_address("syrk", c.dtype), state]
    row = [vm.GEMM, 0, 1, 2 if cut else -1, *params, 0, 1, 2, len(offsets) // 3, *offsets]
    table, at = vm.pack(row, [0], functions, 3, [], [[0, 1, 3, 0, 1, 2]], region_address())
    return lambda: vm.run_steps(table, at[0], (a, b, c))


def _transposed(x: np.ndarray, flip: bool) -> np.ndarray:
    """`x` as it is, or the transposed view of a C-contiguous copy of its transpose."""
    return np.ascontiguousarray(np.swapaxes(x, -1, -2)).swapaxes(-1, -2) if flip else x


def _check(c: np.ndarray, a: np.ndarray, b: np.ndarray, start: np.ndarray) -> None:
    exact = start.astype(np.float64) + np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.abs(start) + np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    bound = 2 * (a.shape[-1] + 1) * np.finfo(c.dtype).eps * scale + np.finfo(c.dtype).tiny
    assert np.all(np.abs(c - exact) <= bound), np.max(np.abs(c - exact) - bound)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_cut_products_equal_numpys(split: np.ndarray, dtype: Any, data: Any) -> None:
    _tiny_pieces(split)
    split[gemm_split.PIECES] = data.draw(st.sampled_from([2, 3, gemm_split.MAX_PIECES]))
    m, k = data.draw(st.integers(1, 70)), data.draw(st.integers(1, 70))
    n = data.draw(st.one_of(st.integers(1, 70), st.sampled_from([16, 32, 48, 64])))
    batch_a, batch_b = data.draw(
        st.sampled_from([((), ()), ((3,), (3,)), ((2, 3), (1, 3)), ((4,), ())])
    )
    flip_a, flip_b, accumulate = (data.draw(st.booleans()) for _ in range(3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a = _transposed(rng.standard_normal((*batch_a, m, k)).astype(dtype), flip_a)
    b = _transposed(rng.standard_normal((*batch_b, k, n)).astype(dtype), flip_b)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)
    start = rng.standard_normal(shape).astype(dtype) if accumulate else np.zeros(shape, dtype)
    c = start.copy()
    jobs = split[gemm_split.JOBS]
    cuts = _cut_axis(split, dtype, m, n, k, int(split[gemm_split.PIECES])) is not None
    try:
        _table(a, b, c, int(accumulate), cut=True)()
    finally:
        split[gemm_split.PIECES] = gemm_split.CUT_THREADS
    _check(c, a, b, start)
    if int(np.prod(shape[:-2])) > 1 or cuts:
        assert split[gemm_split.JOBS] == jobs + 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("flips", [(False, False), (True, False), (False, True)])
def test_the_cut_keeps_the_bits_of_one_gemm(split: np.ndarray, dtype: Any, flips: Any) -> None:
    """Bands of at least 2^20 multiply-adds at multiples of the alignment this machine's
    BLAS keeps the bits at (runtime.gemm_probe), of a product whose other dimension is a
    multiple of it, or any length where the probe found that to keep them too: its bits
    are those of the uncut product (NumPy's matmul on one BLAS thread). Products the rule
    does not allow are not cut; the shapes whose dimensions are multiples of 48 are cut on
    every machine whose BLAS keeps the bits at 12, 16, 24 or 48 along some axis."""
    rng = np.random.default_rng(1)
    shapes = [(1024, 128, 128), (200, 704, 64), (96, 96, 300), (1000, 48, 100), (200, 768, 64)]
    cut = 0
    for m, n, k in shapes:
        a = _transposed(rng.standard_normal((m, k)).astype(dtype), flips[0])
        b = _transposed(rng.standard_normal((k, n)).astype(dtype), flips[1])
        c = np.empty((m, n), dtype)
        jobs = split[gemm_split.JOBS]
        _table(a, b, c, 0, cut=True)()
        cuts = _cut_axis(split, dtype, m, n, k, gemm_split.CUT_THREADS) is not None
        assert split[gemm_split.JOBS] == jobs + cuts, (m, n, k)
        cut += cuts
        with OneThread():
            assert np.array_equal(c, a @ b), (m, n, k)
    at = gemm_split.ALIGN + 4 * int(np.dtype(dtype) == np.float64)
    if any(split[at + 2 * axis] in (12, 16, 24, 48) for axis in (0, 1)):
        assert cut >= 2
    a, b = rng.standard_normal((1023, 128)), rng.standard_normal((128, 701))
    a, b = a.astype(dtype), b.astype(dtype)  # odd: cut where any other dimension keeps bits
    jobs, c = split[gemm_split.JOBS], np.empty((1023, 701), dtype)
    _table(a, b, c, 0, cut=True)()
    cuts = _cut_axis(split, dtype, 1023, 701, 128, gemm_split.CUT_THREADS) is not None
    assert split[gemm_split.JOBS] == jobs + cuts
    with OneThread():
        assert np.array_equal(c, a @ b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("flips", [(False, False), (True, False), (False, True), (True, True)])
def test_a_product_alone_is_cut_into_a_band_per_thread(
    split: np.ndarray, dtype: Any, flips: Any
) -> None:
    """A single product is cut into as many bands as threads run them (CUT_THREADS: this
    one and the worker), not 8: each band packs the other operand again. Along C's rows
    where B (k x n) is the smaller operand to pack again, else its columns, where this
    machine's alignments allow it (else along the other axis, or whole: `_cut_axis`); the
    last band takes the rest (999 rows: 496 and 503). Each gives the uncut product's
    bits; a batch is still cut between its matrices into up to 8 groups."""
    assert split[gemm_split.PIECES] == gemm_split.CUT_THREADS == 2
    rng = np.random.default_rng(4)
    block = gemm_split.JOB
    shapes = [(256, 784, 512), (784, 256, 512), (999, 200, 64), (160, 304, 1008)]
    shapes += [(192, 784, 480), (480, 256, 192)]  # multiples of 48
    for m, k, n in shapes:  # W4's x @ w1 and x.T @ dpre, odd rows, wide
        a = _transposed(rng.standard_normal((m, k)).astype(dtype), flips[0])
        b = _transposed(rng.standard_normal((k, n)).astype(dtype), flips[1])
        c = np.full((m, n), np.nan, dtype)
        jobs = split[gemm_split.JOBS]
        _table(a, b, c, 0, cut=True)()
        axis = _cut_axis(split, dtype, m, n, k, gemm_split.CUT_THREADS)
        assert split[gemm_split.JOBS] == jobs + (axis is not None), (m, k, n)
        if axis is not None:
            assert split[block + gemm_split.BANDS] == 2, (m, k, n)
            assert split[block + gemm_split.AXIS] == axis, (m, k, n)
        with OneThread():
            assert np.array_equal(c, a @ b), (m, k, n)
    a = rng.standard_normal((16, 64, 128)).astype(dtype)
    b = _transposed(rng.standard_normal((16, 128, 96)).astype(dtype), flips[1])
    c = np.empty((16, 64, 96), dtype)
    _table(a, b, c, 0, cut=True)()
    assert split[block + gemm_split.COUNT] == 16 and split[block + gemm_split.BANDS] == 1
    assert split[gemm_split.BOUNDS + 1] == 2  # 8 groups of 2 matrices
    with OneThread():
        assert np.array_equal(c, np.matmul(a, b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_batch_whose_operands_coincide_at_one_matrix_keeps_numpys_syrk(
    split: np.ndarray, dtype: Any
) -> None:
    """A and B different arrays whose matrices coincide at one of the batch (there a
    matrix times its own transpose): the interpreter, cut or not, computes that one as
    NumPy's matmul does (syrk, whose bits differ from gemm's at 33 x 100), the others by
    gemm; the cut leaves such a product whole. It once looked at the operands' base
    addresses only, and cut it (gemm throughout)."""
    _tiny_pieces(split)
    x = np.random.default_rng(3).standard_normal((2, 33, 100)).astype(dtype)
    a, b = x, x[1:].swapaxes(-1, -2)  # a[1] @ b[0]: x[1] @ x[1].T
    with OneThread():
        expected = np.matmul(a, b)
    assert not np.array_equal(expected[1], x[1] @ x[1].T.copy())  # else nothing to see
    for cut in (False, True):
        c = np.full((2, 33, 33), np.nan, dtype)
        jobs = split[gemm_split.JOBS]
        _table(a, b, c, 0, cut=cut)()
        assert np.array_equal(c, expected), cut
        assert split[gemm_split.JOBS] == jobs  # left whole to the interpreter


def test_two_threads_cut_products_at_once(split: np.ndarray) -> None:
    """Two Python threads each run cut products (one holds the worker, the other runs its
    products whole; OpenBLAS is called from three threads at once)."""
    _tiny_pieces(split)
    rng = np.random.default_rng(2)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            a = rng.standard_normal((160 + seed, 48)).astype(np.float32)
            b = rng.standard_normal((48, 96)).astype(np.float32)
            c = np.zeros((160 + seed, 96), np.float32)
            run = _table(a, b, c, 0, cut=True)
            with OneThread():
                expected = a @ b
            for _ in range(300):
                c[:] = np.nan
                run()
                _check(c, a, b, np.zeros_like(c))
                np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_a_stopped_worker_leaves_products_whole(split: np.ndarray) -> None:
    a, b = np.ones((512, 64)), np.ones((64, 256))
    c = np.zeros((512, 256))
    run = _table(a, b, c, 0, cut=True)
    gemm_split.stop()
    try:
        jobs = split[gemm_split.JOBS]
        run()
        assert np.all(c == 64) and split[gemm_split.JOBS] == jobs
    finally:
        gemm_split.state_address()
        _wait_ready(split)
    c[:] = 0
    run()
    assert np.all(c == 64) and split[gemm_split.JOBS] == jobs + 1


def test_stopping_the_worker_waits_for_a_product_under_way(split: np.ndarray) -> None:
    """`stop` re-creates the state's semaphores: it takes the product lock first, else a
    product cut in another thread at that moment hung (or ran from a zeroed job)."""
    a, b = np.ones((512, 64)), np.ones((64, 256))
    c = np.zeros((512, 256))
    run, done, wrong = _table(a, b, c, 0, cut=True), threading.Event(), []

    def work() -> None:
        while not done.is_set():
            c[:] = 0
            run()
            if not np.all(c == 64):
                wrong.append(c.copy())

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        for _ in range(30):
            gemm_split.stop()
            gemm_split.state_address()
            _wait_ready(split)
    finally:
        done.set()
        thread.join(60)
    assert not thread.is_alive(), "a product hung across a stop"
    assert not wrong


@pytest.mark.usefixtures("sync")
def test_plans_offer_the_worker_products_above_its_threshold_of_the_moment(
    split: np.ndarray,
) -> None:
    """A plan lowered after tuning lowers MIN_WORK offers the worker its products above
    that threshold, not above the default one (below which none was ever cut)."""
    settings = split[gemm_split.MIN_WORK], split[gemm_split.PIECE_WORK]
    split[gemm_split.MIN_WORK], split[gemm_split.PIECE_WORK] = 1 << 16, 1 << 15
    try:
        a, b = np.ones((256, 16)), np.ones((16, 256))  # 2^20 multiply-adds
        f = _jitted(lambda a, b: (a @ b + 1.0,), "vm")
        jobs = split[gemm_split.JOBS]
        for _ in range(3):
            assert np.array_equal(f(a, b)[0], a @ b + 1.0)
        assert split[gemm_split.JOBS] > jobs
    finally:
        split[gemm_split.MIN_WORK], split[gemm_split.PIECE_WORK] = settings


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_cuts_products_after_restarting_the_worker(split: np.ndarray) -> None:
    a, b = np.ones((512, 64)), np.ones((64, 256))
    c = np.zeros((512, 256))
    run = _table(a, b, c, 0, cut=True)
    run()
    pid = os.fork()
    if pid == 0:  # the child: no worker; products whole, then cut by a new worker
        code = 1
        try:
            s = gemm_split.state()
            jobs = s[gemm_split.JOBS]
            run()
            whole = np.all(c == 64) and s[gemm_split.JOBS] == jobs
            gemm_split.state_address()
            _wait_ready(s)
            c[:] = 0
            run()
            code = 0 if whole and np.all(c == 64) and s[gemm_split.JOBS] == jobs + 1 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_worker_does_not_keep_the_process_alive() -> None:
    code = (
        "import numpy as np\n"
        "from fastgrad.runtime import adapters, gemm_split\n"
        "gemm_split.state_address()\n"
        "adapters.product_worker(True)\n"
        "print('started')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == b"started", done.stderr


@pytest.mark.usefixtures("sync")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_programs_give_the_same_bits_cut_or_not(split: np.ndarray, dtype: Any, data: Any) -> None:
    """A two-layer network's value and gradients (products big enough to cut, some with
    transposed weights, over a batch or not): the interpreter with the cut, without it,
    and the step runner give the same bits."""
    flip = data.draw(st.booleans())
    batch = data.draw(st.sampled_from([(), (2,)]))
    rows, width = data.draw(st.sampled_from([(256, 96), (160, 128)]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal((*batch, rows, width)).astype(dtype)
    w1 = (rng.standard_normal((width, 2 * width)) * 0.1).astype(dtype)
    w2 = (rng.standard_normal((width, 2 * width) if flip else (2 * width, width)) * 0.1).astype(
        dtype
    )

    def loss(x: Any, w1: Any, w2: Any) -> Any:
        h = fnp.tanh(x @ w1)
        return fnp.sum((h @ (w2.T if flip else w2)) ** 2)

    vg = fg.value_and_grad(loss, argnums=(0, 1, 2))
    expected = _jitted(vg, "steps")(x, w1, w2)
    g = _jitted(vg, "vm")
    jobs = split[gemm_split.JOBS]
    got = g(x, w1, w2)
    got = g(x, w1, w2)
    assert split[gemm_split.JOBS] > jobs  # products were cut
    gemm_split.stop()
    try:
        whole = g(x, w1, w2)
    finally:
        gemm_split.state_address()
        _wait_ready(split)
    for e, c, w in zip(
        [expected[0], *expected[1]], [got[0], *got[1]], [whole[0], *whole[1]], strict=True
    ):
        assert np.array_equal(np.asarray(e), np.asarray(c)) and np.array_equal(
            np.asarray(e), np.asarray(w)
        )


@pytest.mark.usefixtures("sync")
def test_the_cut_can_be_turned_off(split: np.ndarray) -> None:
    """`config.cut_products` off: BLAS's own threads for a large product, as before."""
    from fastgrad.core.config import config
    from fastgrad.runtime.thread_budget import cuts_products

    ones = partial(np.broadcast_to, np.float32(1))  # lowered only: no memory needed
    args = ones((1024, 1 << 18)), ones((1 << 18, 512))  # 2^37 multiply-adds
    assert fg.jit(lambda x, w: fnp.sum(x @ w)).lower(*args).executable.one_blas_thread
    config.update("cut_products", False)
    try:
        assert not cuts_products()
        assert not fg.jit(lambda x, w: fnp.sum(x @ w)).lower(*args).executable.one_blas_thread
        # Beside parallel kernels BLAS still runs on one thread, its products whole.
        x, w = np.ones((1024, 64), np.float32), np.ones((64, 512), np.float32)
        f = fg.jit(lambda x, w: fnp.sum(fnp.tanh(x @ w)))
        jobs = split[gemm_split.JOBS]
        for _ in range(3):
            f(x, w)
        assert split[gemm_split.JOBS] == jobs
    finally:
        config.update("cut_products", True)
    assert cuts_products()


def test_products_are_not_cut_in_a_process_on_one_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On one CPU the worker would only take turns with the calling thread: no cut."""
    from fastgrad.runtime.thread_budget import cuts_products

    assert cuts_products()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert not cuts_products()


class _Serve:
    """A stand-in for the worker's loop whose compile notes its thread, waits for
    `release`, then fails."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.release = threading.Event()

    def compile(self, signature: Any) -> None:
        self.threads.append(threading.current_thread().name)
        self.release.wait(60)
        raise RuntimeError("no LLVM today")


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, _Serve]]:
    """A worker of its own whose loop does not compile, a fresh product-worker job."""
    if blas.semaphore_calls() is None:
        pytest.skip("products are not cut on this platform")
    from fastgrad.runtime import adapters

    serve, worker = _Serve(), gemm_split._Worker()
    monkeypatch.setattr(gemm_split, "_serve", serve)
    monkeypatch.setattr(gemm_split, "_WORKER", worker)
    monkeypatch.setattr(adapters, "_JOBS", {})
    yield worker, serve
    serve.release.set()


def test_a_worker_that_cannot_be_compiled_says_so_and_leaves_products_whole(
    broken: tuple[Any, _Serve],
) -> None:
    """The worker compiles on the compile thread, in turn with kernels (before, on its
    own thread, it held Numba's compiler lock while a first adapter waited)."""
    from fastgrad.runtime import adapters

    worker, serve = broken
    serve.release.set()
    with pytest.warns(RuntimeWarning, match=r"loop \(_serve\).*could not be compiled.*no LLVM"):
        assert worker.address()
        adapters.product_worker(True)
    assert serve.threads == ["fastgrad-compile"]
    assert worker.thread is None and worker.state[gemm_split.READY] == 0


def test_the_workers_compile_is_under_the_watchdog(broken: tuple[Any, _Serve]) -> None:
    """A plan waiting for the worker waits at most `compile_timeout`: its products run
    whole meanwhile."""
    from fastgrad.core.config import config
    from fastgrad.runtime import adapters

    worker, serve = broken
    before = config.compile_timeout
    config.update("compile_timeout", 0.3)
    try:
        with pytest.warns(RuntimeWarning, match="could not be compiled"):
            assert worker.address()
            adapters.product_worker(True)
            assert worker.thread is None and worker.state[gemm_split.READY] == 0
            assert serve.threads == ["fastgrad-compile"]
            serve.release.set()
            assert background.wait_idle(60)
    finally:
        config.update("compile_timeout", before)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_amid_the_workers_compile_leaves_the_child_cutting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forked while the compile thread is inside the cut's compile (holding its lock, and
    the job's): the child's compile thread builds the worker again and it serves. Before,
    the child waited for locks no thread of its own would release: products never cut."""
    if blas.semaphore_calls() is None:
        pytest.skip("products are not cut on this platform")
    from fastgrad.runtime import adapters

    parent, entered, release = os.getpid(), threading.Event(), threading.Event()
    real = gemm_split.cached_cfunc

    def held(*args: Any) -> Any:  # the parent's compile: held here until after the fork
        if os.getpid() == parent:
            entered.set()
            release.wait(60)
        return real(*args)

    worker = gemm_split._Worker()
    monkeypatch.setattr(gemm_split, "cached_cfunc", held)
    monkeypatch.setattr(gemm_split, "_ROWS", [])
    monkeypatch.setattr(gemm_split, "_WORKER", worker)
    monkeypatch.setattr(adapters, "_JOBS", {})
    try:
        worker.address()
        adapters.product_worker(False)
        assert entered.wait(60)
        pid = os.fork()
        if pid == 0:  # the child: the worker serves once its compile thread has built it
            code = 1
            try:
                for _ in range(3000):
                    if worker.state is not None and worker.state[gemm_split.READY]:
                        code = 0
                        break
                    threading.Event().wait(0.01)
            finally:
                os._exit(code)
        release.set()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert background.wait_idle(60) and worker.state[gemm_split.READY]
    finally:
        release.set()
        worker.stop()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize(
    "module, lock, build",
    [
        ("gemm_split", "_ROWS_LOCK", "rows_function"),
        ("vm", "_TABLE_LOCK", "table_function"),
        ("vm_vectors", "_LOCK", "vector_function"),
    ],
)
def test_a_child_forked_while_a_once_compile_holds_its_lock_compiles_it(
    module: str, lock: str, build: str
) -> None:
    """The compile thread holds the lock of a compile made once per process while it
    waits for Numba's compiler lock, which a fork takes: the child, which has no such
    thread, makes the lock anew and compiles (or loads) the function itself. Before, it
    waited for ever (the cut's lock: products never cut; the interpreter's loop: plans
    run step by step, the child's compile thread stuck)."""
    import importlib

    owner = importlib.import_module(f"fastgrad.runtime.{module}")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with getattr(owner, lock):
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(60)
    try:
        pid = os.fork()
        if pid == 0:  # the child: the function within 30 s
            code = 1
            try:
                done: list[int] = []
                worker = threading.Thread(target=lambda: done.append(getattr(owner, build)()))
                worker.daemon = True
                worker.start()
                worker.join(30)
                code = 0 if done and done[0] else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        holder.join(60)
