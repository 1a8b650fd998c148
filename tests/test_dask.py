"""fastgrad.dask on a real LocalCluster: two worker processes on the loopback interface.

Results are checked against the single-process jitted gradient over the whole data set
and against the logistic-regression gradient written out in NumPy; chunkings come from
hypothesis (uneven and single-row chunks included). Then the faults: a worker that dies
during a call, workers restarted on an empty kernel cache, and bad chunks.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings

import cloudpickle
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
fgd = pytest.importorskip("fastgrad.dask")
fgd_gradients = pytest.importorskip("fastgrad.dask.gradients")
FutureCancelledError = distributed.client.FutureCancelledError
Status = distributed.core.Status
NANNY_GONE = (Status.closing, Status.closed, Status.closing_gracefully, Status.failed)  # for good

# Workers cannot import this test module: send its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cache_dir(dask_cache_dir):
    return dask_cache_dir


@pytest.fixture(scope="module")
def client(dask_client):
    return dask_client


def logistic(params, x, y):
    """Mean logistic loss; y holds 0/1 labels as floats."""
    z = x @ params["w"] + params["b"]
    return fnp.mean(fnp.softplus(z) - y * z)


def logistic_sum(params, x, y):
    z = x @ params["w"] + params["b"]
    return fnp.sum(fnp.softplus(z) - y * z)


def logistic_aux(params, x, y):
    z = x @ params["w"] + params["b"]
    p = fnp.sigmoid(z)
    return fnp.mean(fnp.softplus(z) - y * z), {
        "mean_p": fnp.mean(p),
        "moments": fnp.mean(x, axis=0),
    }


def numpy_logistic(params, x, y):
    """The oracle: the loss and gradient written out in NumPy, in float64."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    z = x @ params["w"].astype(np.float64) + np.float64(params["b"])
    value = np.mean(np.logaddexp(0, z) - y * z)
    r = (1 / (1 + np.exp(-z)) - y) / len(y)
    return value, {"w": x.T @ r, "b": r.sum()}


def make_data(n, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(dtype)
    y = (rng.random(n) < 0.5).astype(dtype)
    params = {"w": rng.standard_normal(d).astype(dtype), "b": np.asarray(0.3, dtype)}
    return params, x, y


def assert_tree_close(got, want, rtol):
    got_leaves, got_tree = fg.pytree.flatten(got)
    want_leaves, want_tree = fg.pytree.flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves, strict=True):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


RTOL = {np.float32: 2e-5, np.float64: 1e-12}
# A restart waits for the workers to stop (SIGKILL after 4 s) and for new ones to import
# Dask and register (fastgrad and Numba come with their first task): seconds, tens of
# seconds on a busy 2-core machine. Generous, and still a loud failure, not a long hang.
RESTART_TIMEOUT = 120


def restart(client):
    """`client.restart()`, failing at once, naming them, if nannies close during it (a
    closed nanny never brings its worker back: the wait would only run out the timeout),
    and with every nanny's state if the workers are not all back within the timeout."""
    nannies = dict(client.cluster.workers)
    client.restart(timeout=RESTART_TIMEOUT, wait_for_workers=False)
    deadline = time.monotonic() + RESTART_TIMEOUT
    while (back := len(client.nthreads())) < len(nannies):
        states = {name: (str(n.status), n.is_alive()) for name, n in nannies.items()}
        closed = [name for name, n in nannies.items() if n.status in NANNY_GONE]
        if closed or time.monotonic() > deadline:
            pytest.fail(
                f"{back} of {len(nannies)} workers back after a restart; nannies closed: "
                f"{closed}; (status, worker process alive) by worker: {states}"
            )
        time.sleep(0.2)


@st.composite
def chunkings(draw):
    """Row counts of chunks: uneven, with single-row chunks and an occasional empty one."""
    sizes = draw(st.lists(st.integers(1, 9) | st.just(1), min_size=1, max_size=6))
    if draw(st.booleans()) and len(sizes) > 1:
        sizes.insert(draw(st.integers(0, len(sizes))), 0)
    return tuple(sizes)


# Hypothesis warns when the global `random` state changes while it draws an example;
# here the scheduler and client threads of this process use it meanwhile (tornado's
# callback jitter, dask's sizeof sampling), not the strategies: with warnings as errors
# that failed an example at random, then FlakyFailure on replay (seen under load).
@pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies"
    ":hypothesis.errors.HypothesisDeprecationWarning"
)
@given(
    sizes=chunkings(),
    d=st.integers(1, 3),
    dtype=st.sampled_from([np.float32, np.float64]),
    reduce=st.sampled_from(["mean", "sum"]),
)
def test_equals_the_single_process_gradient(client, sizes, d, dtype, reduce):
    n = sum(sizes)
    params, x, y = make_data(n, d, dtype, seed=n * 7 + d)
    xs = client.persist(da.from_array(x, chunks=(sizes, d)))
    ys = client.persist(da.from_array(y, chunks=(sizes,)))
    loss = logistic if reduce == "mean" else logistic_sum
    got = fgd.value_and_grad(loss, reduce=reduce)(params, xs, ys)
    want = fg.jit(fg.value_and_grad(loss))(params, x, y)
    assert_tree_close(got, want, RTOL[dtype])
    value, grads = numpy_logistic(params, x, y)
    scale = 1.0 if reduce == "mean" else n
    np.testing.assert_allclose(got[0], value * scale, rtol=RTOL[dtype] * 10)
    np.testing.assert_allclose(got[1]["w"], grads["w"] * scale, rtol=1e-4, atol=1e-5)


def test_has_aux_argnums_tuple_and_lists_of_futures(client):
    params, x, y = make_data(50, 3, np.float64)
    bounds = [0, 7, 8, 30, 50]
    x_parts = client.scatter([x[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
    y_parts = client.scatter([y[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])

    def loss(w, b, x, y, shift):
        return logistic_aux({"w": w, "b": b + shift}, x, y)

    args = (params["w"], params["b"], x_parts, y_parts, 0.5)
    got = fgd.value_and_grad(loss, argnums=(0, 1), has_aux=True)(*args)
    want = fg.jit(fg.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        params["w"], params["b"], x, y, 0.5
    )
    assert_tree_close(got, want, 1e-12)
    # Delayed chunks work too, and a dask array may be mixed with a list.
    x_delayed = [dask.delayed(np.copy)(part) for part in x_parts]
    ys = da.from_array(y, chunks=(tuple(np.diff(bounds)),))
    got = fgd.value_and_grad(loss, argnums=(0, 1), has_aux=True)(*args[:2], x_delayed, ys, 0.5)
    assert_tree_close(got, want, 1e-12)


def test_the_jitted_function_compiles_once_per_worker(client):
    params, x, y = make_data(400, 4, np.float64, seed=3)
    xs = client.persist(da.from_array(x, chunks=(100, 4)))
    ys = client.persist(da.from_array(y, chunks=100))
    vg = fgd.value_and_grad(logistic)

    def compile_mode(mode):
        before = fg.config.compile
        fg.config.update("compile", mode)
        return before

    def idle():
        from fastgrad.runtime.background import wait_idle

        return wait_idle(timeout=0)

    # In the default mode, where a first call does not wait for its kernels (the test
    # session's workers inherit FASTGRAD_COMPILE=sync from conftest.py), warmup waits.
    modes = client.run(compile_mode, "background")
    try:
        seconds = vg.warmup(params, xs, ys)
        assert all(client.run(idle).values())  # no worker is still compiling
    finally:
        client.run(compile_mode, next(iter(modes.values())))
    assert sorted(seconds) == sorted(client.nthreads())

    def counters():
        from fastgrad.api.jit import _LIVE
        from fastgrad.compiler.kernel_cache import STATS

        traced = {k: len(j._cache) for k, j in _LIVE.items()}
        return STATS.numba_compiles() + STATS.cache_loads(), STATS.modules_loaded, traced

    before = client.run(counters)
    for step in range(3):
        got = vg({"w": params["w"] * step, "b": params["b"]}, xs, ys)
    want = fg.jit(fg.value_and_grad(logistic))({"w": params["w"] * 2, "b": params["b"]}, x, y)
    assert_tree_close(got, want, 1e-12)
    after = client.run(counters)
    assert after == before  # nothing traced, compiled or loaded again
    for _, _, traced in after.values():
        assert traced[vg.chunk_fun._token] == 1  # one chunk shape, one trace per worker


def test_a_worker_killed_during_a_call(client, tmp_path):
    marker = str(tmp_path / "killed")

    def dies_once(params, x, y):
        # Runs while the call traces on a worker: the first worker to get here exits.
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            os._exit(1)
        return logistic(params, x, y)

    rng = da.random.default_rng(42)  # chunks a restarted worker can recompute exactly
    xs = client.persist(rng.standard_normal((600, 3), chunks=(50, 3)))
    ys = client.persist((rng.random(600, chunks=50) < 0.5).astype(np.float64))
    distributed.wait([xs, ys])
    x, y = client.compute([xs, ys], sync=True)
    params = {"w": np.array([0.5, -1.0, 2.0]), "b": np.asarray(0.1)}
    with warnings.catch_warnings():
        # Dask usually recomputes what the dead worker held; when it gives up instead, the
        # call runs again, saying so (test_a_call_that_loses_its_work_runs_again).
        warnings.filterwarnings("ignore", "fastgrad.dask.*lost work", RuntimeWarning)
        got = fgd.value_and_grad(dies_once)(params, xs, ys)
    assert os.path.exists(marker)  # a worker did die
    want = fg.jit(fg.value_and_grad(logistic))(params, x, y)
    assert_tree_close(got, want, 1e-12)
    client.wait_for_workers(2, timeout=120)


def test_a_call_that_loses_its_work_runs_again(client, monkeypatch):
    params, x, y = make_data(60, 2, np.float64, seed=3)
    xs, ys = da.from_array(x, chunks=(20, 2)), da.from_array(y, chunks=20)
    vg = fgd.value_and_grad(logistic)
    real, losses = vg._sum_chunks, [fgd_gradients._ATTEMPTS - 1]  # calls still to fail

    def loses_work(*args):
        if losses[0] > 0:
            losses[0] -= 1
            raise FutureCancelledError("combine-1", reason="already forgotten")
        return real(*args)

    monkeypatch.setattr(vg, "_sum_chunks", loses_work)
    with pytest.warns(RuntimeWarning, match="lost work") as caught:
        got = vg(params, xs, ys)
    assert len(caught) == fgd_gradients._ATTEMPTS - 1
    assert_tree_close(got, fg.jit(fg.value_and_grad(logistic))(params, x, y), 1e-12)
    losses[0] = 1
    monkeypatch.setattr(fgd_gradients, "_ATTEMPTS", 1)  # out of attempts: the error stands
    with pytest.raises(FutureCancelledError):
        vg(params, xs, ys)


def test_workers_restarted_on_an_empty_cache(client, cache_dir):
    params, x, y = make_data(90, 2, np.float32, seed=5)
    want = fg.jit(fg.value_and_grad(logistic))(params, x, y)

    def compiles():
        from fastgrad.compiler.kernel_cache import STATS

        return STATS.numba_compiles(), STATS.cache_loads()

    def run():
        xs = client.persist(da.from_array(x, chunks=(30, 2)))
        ys = client.persist(da.from_array(y, chunks=30))
        vg = fgd.value_and_grad(logistic)
        vg.warmup(params, xs, ys)
        assert_tree_close(vg(params, xs, ys), want, RTOL[np.float32])
        return client.run(compiles)

    shutil.rmtree(cache_dir)
    restart(client)
    cold = run()
    assert sum(c for c, _ in cold.values()) >= 1  # someone compiled; no cache to load
    restart(client)
    warm = run()
    assert all(c == 0 and h >= 1 for c, h in warm.values())  # every worker loaded from disk


def test_a_chunk_with_nan_is_named(client):
    params, x, y = make_data(40, 2, np.float64)
    x[23, 1] = np.nan
    xs = da.from_array(x, chunks=(10, 2))
    ys = da.from_array(y, chunks=10)
    with pytest.raises(fgd.ChunkError) as exc:
        fgd.value_and_grad(logistic)(params, xs, ys)
    msg = str(exc.value)
    assert "chunk 2 (rows 20 to 29)" in msg and "x holds NaN" in msg and "row 23 of x" in msg


def test_chunks_of_the_wrong_dtype_or_shape_are_named(client):
    params, x, y = make_data(30, 2, np.float64)
    good = [x[:10], x[10:20], x[20:]]
    y_parts = client.scatter([y[:10], y[10:20], y[20:]])
    vg = fgd.value_and_grad(logistic)

    wrong_dtype = client.scatter([good[0], good[1].astype(np.float32), good[2]])
    with pytest.raises(fgd.ChunkError, match=r"dtype float32.* in chunk 1 but dtype float64"):
        vg(params, wrong_dtype, y_parts)

    wrong_shape = client.scatter([good[0], good[1], np.ones((10, 3))])
    with pytest.raises(fgd.ChunkError, match="chunk 2"):
        vg(params, wrong_shape, y_parts)

    short = client.scatter([good[0], good[1][:9], good[2]])
    with pytest.raises(fgd.ChunkError, match=r"chunk 1: .*differ in row count \(x has 9, y has"):
        vg(params, short, y_parts)

    # A dask array whose blocks do not match its declared chunks is caught too.
    lying = da.map_blocks(lambda b: b[:, :1], da.from_array(x, chunks=(10, 2)), dtype=x.dtype)
    with pytest.raises(
        fgd.ChunkError, match=r"chunk \d \(rows \d+ to \d+\): x has .*\(1,\), expected .*\(2,\)"
    ):
        vg(params, lying, da.from_array(y, chunks=10))


def test_bad_calls_get_clear_errors(client):
    params, x, y = make_data(20, 2, np.float64)
    vg = fgd.value_and_grad(logistic)
    with pytest.raises(TypeError, match="no data argument"):
        vg(params, x, y)
    with pytest.raises(ValueError, match="chunked differently"):
        vg(params, da.from_array(x, chunks=(10, 2)), da.from_array(y, chunks=5))
    with pytest.raises(ValueError, match="same number of chunks"):
        vg(params, client.scatter([x[:10], x[10:]]), client.scatter([y]))
    with pytest.raises(TypeError, match="argument params is differentiated but is chunked"):
        vg(da.from_array(x), x, da.from_array(y))
    with pytest.raises(ValueError, match="reduce must be"):
        fgd.value_and_grad(logistic, reduce="max")
    with pytest.raises(ValueError, match="argnums 3 is out of range"):
        fgd.value_and_grad(logistic, argnums=3)(params, da.from_array(x), da.from_array(y))
    # A failure inside the function names the chunk, with the original message.
    with pytest.raises(fgd.ChunkError, match=r"chunk 0 \(rows 0 to 19\): .*shape"):
        vg({"w": np.ones(5), "b": params["b"]}, da.from_array(x), da.from_array(y))
