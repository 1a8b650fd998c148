"""Large outputs' memory handed out again (runtime.recycling): only once nothing can reach
it. Oracles: NumPy values of the same maths, copies of the results taken when they were
returned, and addresses (memory handed out again shows the same address)."""

import gc
import threading
import weakref

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime import recycling
from fastgrad.runtime.arena import staggered_empty

N = 1 << 18  # 2 MiB of float64: above recycling.MIN_BYTES
SIZE = 1 << 21


@pytest.fixture
def pool():
    """An empty pool, and the setting as it was after the test."""
    limit = fg.config.output_pool_mb
    fg.release_buffers()
    yield recycling.POOL
    fg.config.update("output_pool_mb", limit)
    fg.release_buffers()


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _reach(held):
    """The array `held` reaches."""
    if isinstance(held, weakref.ref):
        return held()
    return held[0] if isinstance(held, tuple) else np.asarray(held)


def test_a_block_is_handed_out_again_only_once_nothing_reaches_it(pool):
    holders = [
        lambda a: a,
        lambda a: a[::3],  # a view: its base is the block
        lambda a: a.reshape(-1, 2).T,
        lambda a: memoryview(a),
        lambda a: np.frombuffer(memoryview(a), np.uint8),
        lambda a: (a, 1),
        lambda a: np.lib.stride_tricks.as_strided(a, (4,), (8,)),
        lambda a: weakref.ref(a.base),  # a weak reference to the block itself
    ]
    for hold in holders:
        block = pool.take(SIZE)
        held = hold(block[8:])
        del block
        again = pool.take(SIZE)
        assert not np.shares_memory(again, _reach(held))
        del again, held
    block = pool.take(SIZE)
    address = _address(block)
    del block
    assert _address(pool.take(SIZE)) == address  # nobody holds it: handed out again


def test_small_blocks_are_not_kept_and_the_setting_bounds_what_is(pool):
    small = pool.take(recycling.MIN_BYTES - 1)
    assert pool.held == 0 and small.size == recycling.MIN_BYTES - 1
    fg.config.update("output_pool_mb", 5)  # two blocks of 2 MiB fit, not three
    kept = [pool.take(SIZE) for _ in range(3)]
    assert pool.held == 2 * SIZE
    del kept
    fg.config.update("output_pool_mb", 0)
    assert pool.take(SIZE) is not None and pool.held == 0  # off: forgets what it kept
    fg.config.update("output_pool_mb", 512)
    pool.take(SIZE)
    fg.release_buffers()
    assert pool.held == 0 and not pool.blocks
    with pytest.raises(ValueError, match="output_pool_mb"):
        fg.config.update("output_pool_mb", -1)


def test_a_new_block_lets_go_of_free_ones_of_other_sizes_and_the_cap_of_the_oldest(pool):
    fg.config.update("output_pool_mb", 6)  # three blocks of 2 MiB
    older = pool.take(SIZE)
    free = pool.take(SIZE)
    free_address = _address(free)
    del free
    newer = pool.take(SIZE)  # the free block, handed out again
    assert _address(newer) == free_address
    del newer
    third = pool.take(SIZE + 1)  # a new block: the free one of another size goes
    kept = [b for blocks in pool.blocks.values() for b in blocks]
    assert pool.held == 2 * SIZE + 1
    assert {_address(b) for b in kept} == {_address(older), _address(third)}
    fourth = pool.take(SIZE + 2)
    fifth = pool.take(SIZE + 2)  # past the cap, all held: the oldest goes (the caller's)
    kept = [b for blocks in pool.blocks.values() for b in blocks]
    assert pool.held <= 6 << 20 and all(b is not older for b in kept)
    del older, third, fourth, fifth


def _program(x, y, a, b):
    return fnp.sum(fnp.tanh(x * y)), x * y + 1.0, fnp.exp(-x).reshape(-1, 2).T, a @ b


def _expected(x, y, a, b):
    return np.sum(np.tanh(x * y)), x * y + 1.0, np.exp(-x).reshape(-1, 2).T, a @ b


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return (*rng.standard_normal((2, N)), *rng.standard_normal((2, 512, 512)))


@pytest.mark.parametrize("runtime", ["vm", "steps"])
def test_results_kept_across_calls_never_change(pool, runtime):
    """Kernel outputs, a view of one and a matmul's (each 2 MiB), by the interpreter and
    the step runner: results of earlier calls (whole, or a view of them only) stay as
    they were; dropped ones' memory is handed out again."""
    before = fg.config.runtime
    fg.config.update("runtime", runtime)
    try:
        f = fg.warmup(fg.jit(_program), *_inputs(0))
        kept, views, copies = [], [], []
        for seed in range(6):
            args = _inputs(seed)
            out = f(*args)
            for got, want in zip(out, _expected(*args), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-12)
            if seed % 2:
                kept.append(out)
                copies.append([np.array(o) for o in out])
            else:
                views.append((out[1][5:], out[3][:, 1]))
                copies.append([np.array(v) for v in views[-1]])
            del out
            gc.collect()
        for held, copy in zip(
            [x for pair in zip(views, kept, strict=True) for x in pair], copies, strict=True
        ):
            for a, b in zip(held, copy, strict=True):
                np.testing.assert_array_equal(a, b)
        addresses = {_address(o) for o in f(*_inputs(9))[1:]}
        again = {_address(o) for o in f(*_inputs(9))[1:]}
        assert addresses & again, "dropped outputs' memory was not handed out again"
    finally:
        fg.config.update("runtime", before)


def test_two_threads_calling_keep_their_own_results(pool):
    f = fg.warmup(fg.jit(_program), *_inputs(0))
    errors = []

    def worker(seed):
        try:
            history = []
            for k in range(12):
                args = _inputs(seed + k % 3)
                history = [*history[-2:], (f(*args), _expected(*args))]
                for out, want in history:
                    for a, b in zip(out, want, strict=True):
                        np.testing.assert_allclose(a, b, rtol=1e-12)
        except Exception as error:  # (re-raised in the main thread)
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (10, 20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_staggered_outputs_take_recycled_blocks(pool):
    a = staggered_empty((N,), np.dtype(np.float64), 0)
    address = _address(a.base)
    del a
    b = staggered_empty((N,), np.dtype(np.float64), 2)
    assert _address(b.base) == address  # at another offset: (k + 1) * STAGGER


def test_a_weakly_referenced_scan_output_is_never_handed_out_again():
    """A scan's stacked outputs are kept from call to call (control_flow.StackPool): one
    the caller reaches through a weak reference only (a weak-valued cache of results)
    must not change at the next call."""

    def f(h, xs):
        def step(h, x):
            h = fnp.tanh(h * 0.5 + x)
            return h, h

        return fg.scan(step, h, xs)

    h, xs = np.zeros(4), np.random.default_rng(0).standard_normal((50, 4))
    jf = fg.warmup(fg.jit(f), h, xs)
    cache = weakref.WeakValueDictionary()
    cache["ys"] = jf(h, xs)[1]
    copy = np.array(cache["ys"])
    second = jf(h, xs + 1)[1]
    assert "ys" not in cache or np.array_equal(cache["ys"], copy)
    assert not np.array_equal(second, copy)
