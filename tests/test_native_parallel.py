"""Parallel kernels loaded before Numba's import (runtime.threading_layer, native_code):
a warm process starts Numba's TBB layer from its extension module, runs its stored
parallel kernels with the usual path's bits, forks, and imports Numba afterwards with
one layer still; a user's choice of another layer leaves them to Numba. Each program
runs in a fresh process: the layer is the process's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from test_native_plan import _run as run_child

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="ELF object files, TBB"),
    pytest.mark.skipif(bool(os.environ.get("NUMBA_THREADING_LAYER")), reason="a layer chosen"),
]

SCRIPT = """
import hashlib, os, sys
import numpy as np
import fastgrad as fg, fastgrad.numpy as fnp
from fastgrad.runtime import threading_layer
from fastgrad.runtime.executable import PARALLEL_THRESHOLD

f = fg.jit(fg.value_and_grad(lambda x: fnp.sum(fnp.exp(x * 0.5) * x)))
x = np.linspace(-1.0, 1.0, 2 * PARALLEL_THRESHOLD).astype(np.float32)
f(x)
fg.warmup(f, x)
value, grad = f(x)

def bits(result):
    return hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in result)).hexdigest()

import gc
steps = [o for o in gc.get_objects() if type(o).__name__ == "_KernelStep" and o.parallel]
print("numba", "numba" in sys.modules, "native layer", threading_layer.started_natively())
print("parallel steps", len(steps), sorted({type(s.kernel).__name__ for s in steps}))
print("bits", bits((value, grad)))
"""

# A fork after the layer started: the child runs the parallel kernels again.
FORK = """
pid = os.fork()
if pid == 0:
    os._exit(0 if bits(f(x)) == bits((value, grad)) else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
print("bits", bits(f(x)))
"""

# Numba imported afterwards: its own parallel function runs on the layer started before.
NUMBA_AFTER = """
import numba

@numba.njit(parallel=True)
def total(a):
    s = 0.0
    for i in numba.prange(a.size):
        s += a[i]
    return s

print("numba total", total(np.ones(1 << 16)), numba.threading_layer())
layer = sys.modules["numba.np.ufunc.tbbpool"]
print("one layer", layer.launch_threads == threading_layer._STARTED[0].launch_threads,
      [m for m in ("numba.np.ufunc.omppool", "numba.np.ufunc.workqueue") if m in sys.modules])
print("bits", bits(f(x)))
"""


def _run(cache: Path, script: str, native: bool = True, **more: str) -> str:
    """test_native_plan's `_run`, on two threads whatever the machine (parallel variants)."""
    return run_child(cache, native, script, **{"NUMBA_NUM_THREADS": "2", **more})


@pytest.fixture(scope="module")
def usual(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A cache the usual path filled (parallel kernels, adapters, the loop) and its bits."""
    cache = tmp_path_factory.mktemp("cache")
    out = _run(cache, SCRIPT, native=False)
    assert "numba True" in out and "parallel steps 1" in out, out
    return cache, out.splitlines()[-1]


def test_a_warm_process_runs_parallel_kernels_without_numba_and_forks(usual):
    """The stored parallel variants load natively, Numba never imported, with the usual
    path's bits; a forked child runs them again (TBB's fork handlers) (~2 s)."""
    cache, reference = usual
    out = _run(cache, SCRIPT + FORK)
    assert "numba False native layer True" in out, out
    assert "parallel steps 1 ['NativeKernel']" in out, out
    assert "child 0" in out, out
    assert [line for line in out.splitlines() if line.startswith("bits")] == [reference] * 2


def test_numba_imported_after_a_native_start_adopts_the_layer(usual):
    """Numba's `_launch_threads` finds TBB's layer started: the same module's functions,
    no other layer loaded; its parallel function and the loaded kernels run (~5 s)."""
    cache, reference = usual
    out = _run(cache, SCRIPT + NUMBA_AFTER)
    assert "native layer True" in out, out
    assert "numba total 65536.0 tbb" in out, out
    assert "one layer True []" in out, out
    assert out.splitlines()[-1] == reference


def test_another_layer_chosen_by_the_user_leaves_parallel_kernels_to_numba(usual):
    """NUMBA_THREADING_LAYER set: the layer is Numba's to start, with Numba's import;
    the serial loads before it are unchanged (~3 s)."""
    cache, reference = usual
    out = _run(cache, SCRIPT, NUMBA_THREADING_LAYER="workqueue")
    assert "numba True native layer False" in out, out
    assert "parallel steps 1" in out and "NativeKernel" not in out, out
    assert out.splitlines()[-1] == reference


def test_the_active_layer_is_numbas_where_it_started_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """TBB started here, then another layer chosen in Numba's config and started by it:
    both are loaded, and the fork warning must see Numba's (OpenMP does not survive a
    fork). Before Numba starts one, the layer started here."""
    import numba

    from fastgrad.runtime import threading_layer

    monkeypatch.setattr(threading_layer, "_STARTED", [object()])
    monkeypatch.setattr(numba, "threading_layer", lambda: "omp")
    assert threading_layer.active_layer() == "omp"

    def none_started() -> str:
        raise ValueError("no threading layer has been initialized yet")

    monkeypatch.setattr(numba, "threading_layer", none_started)
    assert threading_layer.active_layer() == "tbb"


def test_a_layer_without_every_symbol_is_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Numba whose TBB module lists fewer functions (older builds): the layer is not
    started here, the kernel takes Numba's path (no AttributeError, no layer started)."""
    import types

    from fastgrad.runtime import numba_load, threading_layer

    fewer = types.SimpleNamespace()  # (none of the functions: nothing could be called)
    monkeypatch.setitem(sys.modules, "numba", None)  # (not imported, as a warm process)
    sys.modules.pop("numba")
    monkeypatch.setattr(threading_layer, "_STARTED", [])
    monkeypatch.setattr(threading_layer, "numbas_choice_is_tbb", lambda: True)
    monkeypatch.setattr(numba_load, "extension", lambda name: fewer)
    assert threading_layer.native_symbols() is None
    assert threading_layer._STARTED == []
