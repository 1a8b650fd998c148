"""Hypothesis profiles: CI runs a fixed, derandomized set of examples; `dev` explores more.
And a Dask cluster for the modules that need one: two worker processes on the loopback
interface, one per module, with a kernel cache of their own; and a plan cache of its own
for the tests of plans on disk (test_plan_cache*.py).
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def dask_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("worker-kernels")


# Each time a worker leaves the scheduler (a restart, a worker that died), the cluster
# object arms a timer: `lost-worker-timeout` (15 s) later, if no worker of that name is
# connected at that moment, it closes the worker's nanny for good. Nothing disarms the
# timer when the nanny's new worker arrives, so a second restart whose workers are away
# 15 s after the first restart's (or a killed worker's) removal lost both nannies, and
# `client.restart` waited its whole timeout with no worker process alive (twice in CI,
# in tests/test_dask.py; reproduced at will by restarting 13 s after a restart). Here
# the nannies restart their workers themselves: the timer only ever fires too late.
LOST_WORKER_TIMEOUT = "1 hour"


@pytest.fixture(scope="module")
def dask_client(dask_cache_dir):
    dask = pytest.importorskip("dask")
    distributed = pytest.importorskip("distributed")
    env = {"FASTGRAD_CACHE_DIR": str(dask_cache_dir), "NUMBA_NUM_THREADS": "1"}
    # Read at each worker removal, so set for the cluster's whole life.
    with dask.config.set({"distributed.deploy.lost-worker-timeout": LOST_WORKER_TIMEOUT}):
        cluster = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",  # a free port: None means 8787, which another run may hold
            env=env,
        )
        with distributed.Client(cluster) as client:
            yield client
        cluster.close()


# How long a compile may run under `patient_watchdog` (and so `compiled_first_call`)
# before the watchdog lets its loop run with NumPy. "sync" waits for a kernel only until
# its compile is found overdue (config.compile_timeout, 60 s): on a loaded 2-core machine
# with an empty cache the plan interpreter's compile ran past a minute, the kernels queued
# behind it were settled at once, and a call a test compares bit for bit with another ran
# a loop with NumPy (tests/test_scan_call.py: float32 results a unit in the last place
# apart; every run with FASTGRAD_COMPILE_TIMEOUT=0.3 and an empty cache). A compile that
# hangs still ends the test, after this long.
KERNEL_TEST_COMPILE_TIMEOUT = 1800.0


@pytest.fixture
def patient_watchdog():
    """A compile is not found overdue during the test (and those handed on before it,
    under another timeout, are done): a test that a call waits for its kernels does not
    see NumPy answer instead when the machine is loaded."""
    import fastgrad as fg
    from fastgrad.runtime import background

    before = fg.config.compile_timeout
    fg.config.update("compile_timeout", KERNEL_TEST_COMPILE_TIMEOUT)
    background.wait_idle(KERNEL_TEST_COMPILE_TIMEOUT)
    yield
    fg.config.update("compile_timeout", before)


@pytest.fixture
def compiled_first_call(patient_watchdog):
    """Each first call waits for its kernels, so that it runs them, not NumPy (for tests of
    the kernels themselves): "sync" mode under a patient watchdog."""
    import fastgrad as fg

    before = fg.config.compile
    fg.config.update("compile", "sync")
    yield
    fg.config.update("compile", before)


@pytest.fixture
def plans(tmp_path, monkeypatch):
    """A plan cache of its own in tmp_path, plans of every size stored, its counters (and
    the build tables') at zero. Kernels stay in the session's cache: they are not what is
    tested, and compiling them again would only cost time."""
    from fastgrad.compiler import plan_cache
    from fastgrad.core.config import config
    from fastgrad.runtime import build_tables

    monkeypatch.setattr(plan_cache, "path_of", lambda key, kind="plan": tmp_path / f"{key}.{kind}")
    monkeypatch.setattr(plan_cache, "COUNTERS", plan_cache.Counters())
    monkeypatch.setattr(plan_cache, "GRAPH_COUNTERS", plan_cache.Counters())
    monkeypatch.setattr(build_tables, "COUNTERS", plan_cache.Counters())
    monkeypatch.setattr(plan_cache, "MIN_NODES", 0)  # the test programs are small
    config.update("plan_cache", True)
    yield tmp_path
