"""Hypothesis profiles: CI runs a fixed, derandomized set of examples; `dev` explores more.
And a Dask cluster for the modules that need one: two worker processes on the loopback
interface, one per module, with a kernel cache of their own.
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


@pytest.fixture(scope="module")
def dask_client(dask_cache_dir):
    distributed = pytest.importorskip("distributed")
    env = {"FASTGRAD_CACHE_DIR": str(dask_cache_dir), "NUMBA_NUM_THREADS": "1"}
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


@pytest.fixture
def compiled_first_call():
    """Each first call waits for its kernels, so that it runs them, not NumPy (for tests of
    the kernels themselves)."""
    import fastgrad as fg

    before = fg.config.compile
    fg.config.update("compile", "sync")
    yield
    fg.config.update("compile", before)
