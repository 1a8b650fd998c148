"""The process's one-BLAS-thread region (runtime.blas): NumPy's OpenBLAS sets one thread
count for the whole process, so the first thread in sets one and the last one out puts
back what it replaced, whether it enters from Python (`OneThread`) or from the plan
interpreter's compiled loop (a table whose header holds the region). Before, a thread
leaving put back two threads while another's product ran (other bits), and the cut's
worker, which never left, kept NumPy on one thread for good."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from fastgrad.runtime import blas, gemm_split, vm

pytestmark = pytest.mark.skipif(
    blas.region_address() == 0, reason="NumPy's BLAS cannot set its thread count"
)


def _count() -> int:
    """BLAS's thread count in force for the process (OpenBLAS's getter, by the name
    NumPy's build gives it)."""
    library = blas._library()
    for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads"):
        get = getattr(library, name, None)
        if get is not None:
            return int(get())
    pytest.skip("no getter of BLAS's thread count")


@pytest.fixture
def two_threads() -> Any:
    """BLAS at two threads, the count put back after."""
    set_local = blas._set_threads_local()
    before = set_local(2)
    yield
    set_local(before)


def _hold(enter: Any, leave: Any) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """A thread that calls `enter`, says so, waits to be told, then calls `leave`."""
    inside, told = threading.Event(), threading.Event()

    def run() -> None:
        enter()
        inside.set()
        told.wait(30)
        leave()

    thread = threading.Thread(target=run)
    thread.start()
    assert inside.wait(30)
    return thread, inside, told


def _python() -> tuple[Any, Any]:
    region = blas.OneThread()
    return region.__enter__, lambda: region.__exit__(None, None, None)


def _compiled() -> tuple[Any, Any]:
    """The interpreter's own entry and exit (compiled: runtime.vm)."""
    address = blas.region_address()
    return (lambda: vm._region(address, 1)), (lambda: vm._region(address, -1))


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("first", [_python, _compiled])
@pytest.mark.parametrize("second", [_python, _compiled])
def test_the_last_thread_out_puts_the_count_back(first: Any, second: Any) -> None:
    """The first thread in leaves first: the count stays one for the second (before,
    the first put two back under the second's products), which then puts two back
    (before, it put back the one it had read)."""
    thread, _, told = _hold(*first())
    enter, leave = second()
    enter()
    try:
        assert _count() == 1
        told.set()
        thread.join()
        assert _count() == 1
    finally:
        leave()
    assert _count() == 2


@pytest.mark.usefixtures("two_threads")
def test_a_table_enters_the_region_its_header_holds() -> None:
    """A small float64 product run by the interpreter from a table whose header holds the
    region: alone, it puts the count back; beside a thread inside, it leaves it at one."""
    a, b = np.ones((4, 3)), np.ones((3, 5))
    c = np.zeros((4, 5))
    functions = [blas.blas_address("gemm", c.dtype), blas.blas_address("syrk", c.dtype), 0]
    row = [vm.GEMM, 0, 1, -1, 1, blas.NO_TRANS, blas.NO_TRANS, 4, 5, 3, 3, 5, 5, 0]
    row += [0, 1, 2, 1, 0, 0, 0]
    table, at = vm.pack(row, [0], functions, 3, [], [[0, 1, 3, 0, 1, 2]], blas.region_address())
    vm.run_steps(table, at[0], (a, b, c))
    assert np.all(c == 3) and _count() == 2
    thread, _, told = _hold(*_python())
    try:
        vm.run_steps(table, at[0], (a, b, c))
        assert _count() == 1
    finally:
        told.set()
        thread.join()
    assert _count() == 2


def test_the_worker_leaves_numpy_its_threads(two_threads: None) -> None:
    """Once the cut's worker serves, NumPy's products still run on BLAS's threads."""
    if blas.semaphore_calls() is None:
        pytest.skip("products are not cut here")
    from test_runtime_gemm_split import _serving, _wait_ready

    _serving()
    s = gemm_split.state()
    assert s is not None
    _wait_ready(s)
    assert _count() == 2


@pytest.mark.usefixtures("two_threads")
def test_a_forked_child_starts_outside_the_region() -> None:
    """Forked while another thread is inside: the child (which has no such thread) has
    BLAS's count put back and a region it can enter and leave (its semaphore made anew:
    the other thread may have held it)."""
    import os
    import warnings

    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    thread, _, told = _hold(*_python())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork beside threads
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0 if _count() == 2 else 1
            with blas.OneThread():
                code = code if _count() == 1 else 2
            os._exit(code if _count() == 2 else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        told.set()
        thread.join()
