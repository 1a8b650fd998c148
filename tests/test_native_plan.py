"""Plans lowered and run before Numba's import (runtime.native_plan): a fresh process
whose kernels and interpreter loop are on disk settles its kernels on their stored
final variants and runs its plan as interpreter segments through ctypes, Numba never
imported, with the bits of a process that takes the usual path (FASTGRAD_NATIVE=0:
Numba's kernels and the interpreter's Numba entry)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastgrad.runtime import native_plan, vm_rows

SCRIPT = """
import sys
import numpy as np
import fastgrad as fg, fastgrad.numpy as fnp

def loss(w1, w2, x):
    h = fnp.tanh(x @ w1 + 0.5)
    return fnp.sum(fnp.exp(-h @ w2) * h[:, :3])

rng = np.random.default_rng(0)
w1, w2, x = (rng.standard_normal(s).astype(np.float32) for s in [(24, 16), (16, 3), (40, 24)])
f = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))
f(w1, w2, x)
fg.warmup(f, w1, w2, x)
value, (g1, g2) = f(w1 + 1, w2, x)
from fastgrad.runtime.executable import Executable
import gc
plans = [o for o in gc.get_objects() if isinstance(o, Executable)]
runs = {type(c.run).__name__ for p in plans for c in p.arena.calls if hasattr(c, "run")}
print("numba", "numba" in sys.modules, "runs", sorted(runs))
print("bits", b"".join(np.asarray(a).tobytes() for a in [value, g1, g2]).hex())
"""


# Not waiting: the first call runs on NumPy while the compile thread loads the stored
# kernels (llvmlite not imported by it); a call after the loads runs them and lowers the
# plan, the next runs it through the Runner.
BACKGROUND = SCRIPT.replace(
    "fg.warmup(f, w1, w2, x)",
    """print("first call: llvmlite", "llvmlite" in sys.modules)
from fastgrad.runtime import background
background.wait_idle(60)
f(w1, w2, x)
background.wait_idle(60)  # (a damaged kernel: Numba compiles it now)
fg.warmup(f, w1, w2, x)""",
)


def _run(
    cache: Path, native: bool, script: str = SCRIPT, warnings: str = "error", **more: str
) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("FASTGRAD_COMPILE", "FASTGRAD_NATIVE")}
    env.update(FASTGRAD_CACHE_DIR=str(cache), FASTGRAD_NATIVE="1" if native else "0", **more)
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def usual(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A cache the usual path filled (kernels, adapters, loop) and what it printed."""
    cache = tmp_path_factory.mktemp("cache")
    out = _run(cache, native=False)
    assert "numba True" in out, out
    return cache, out


@pytest.mark.skipif(sys.platform != "linux", reason="ELF object files")
def test_a_warm_process_runs_its_plan_natively_with_the_usual_bits(usual):
    cache, out = usual
    warm = _run(cache, native=True)
    assert "numba False" in warm and "'Runner'" in warm, warm  # lowered, Numba absent
    assert warm.splitlines()[-1] == out.splitlines()[-1]  # the same bits


@pytest.mark.skipif(sys.platform != "linux", reason="ELF object files")
def test_a_first_call_of_small_loops_leaves_the_loads_to_the_compile_thread(usual, tmp_path):
    """Its loops too small to pay llvmlite's import, the first call runs them with NumPy
    and the compile thread loads their stored kernels; a later call runs them, Numba
    never imported, with the usual path's bits. Kernels found damaged there fall back to
    Numba's path (which compiles them again), with the same bits. (~5 s)"""
    cache, out = usual
    warm = _run(cache, native=True, script=BACKGROUND)
    assert "first call: llvmlite False" in warm, warm
    assert "numba False" in warm and "'Runner'" in warm, warm
    assert warm.splitlines()[-1] == out.splitlines()[-1]
    damaged = tmp_path / "damaged"
    shutil.copytree(cache, damaged)
    for path in (damaged / "kernels").glob("*.nbm"):
        blob = bytearray(path.read_bytes())
        blob[-100] ^= 0xFF
        path.write_bytes(bytes(blob))
    fallen = _run(damaged, native=True, script=BACKGROUND)
    assert "first call: llvmlite False" in fallen, fallen
    assert "numba True" in fallen, fallen  # (Numba's kernels)
    assert fallen.splitlines()[-1] == out.splitlines()[-1]


# Attention's products, batched, big enough that the cut's worker would split them
# (gemm_bands.DEFAULT_MIN_WORK): without Numba they run as host steps (np.matmul).
PRODUCTS = """
import hashlib, sys
import numpy as np
import fastgrad as fg, fastgrad.numpy as fnp

def loss(q, k, v):
    s = q @ fnp.swapaxes(k, -1, -2) * 0.1
    p = fnp.exp(s - fg.stop_gradient(fnp.max(s, axis=-1, keepdims=True)))
    return fnp.mean((p / fnp.sum(p, axis=-1, keepdims=True) @ v) ** 2)

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 128, 128)).astype(np.float32) for _ in range(3))
f = fg.jit(fg.value_and_grad(loss, argnums=(0, 1, 2)))
f(q, k, v)
fg.warmup(f, q, k, v)
value, grads = f(q, k, v)
from fastgrad.runtime.executable import Executable
import gc
plans = [o for o in gc.get_objects() if isinstance(o, Executable)]
runs = {type(c.run).__name__ for p in plans for c in p.arena.calls if hasattr(c, "run")}
print("numba", "numba" in sys.modules, "runs", sorted(runs))
calls = [c for p in plans for c in p.arena.calls]
fresh = {f[4] for c in calls for f in getattr(c, "fresh", ())}  # (slot) a segment allocates
steps = [getattr(getattr(c, "func", None), "__self__", None) for c in calls]
host = {getattr(step, "out", None) for step in steps} - {None}  # host steps' outputs
print("allocated for a host step", sorted(fresh & host))
if "numba" in sys.modules:
    from fastgrad.runtime import gemm_split
    state = gemm_split.state()
    print("cut's worker serving", state is not None and bool(state[gemm_split.READY]))
bits = b"".join(np.asarray(a).tobytes() for a in [value, *grads])
print("bits", hashlib.sha256(bits).hexdigest())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ELF object files")
def test_a_plan_lowered_without_numba_lowers_again_with_the_cut(tmp_path):
    """A product the cut would split runs as a host step in a plan lowered without
    Numba, one BLAS thread at every call (bench W4 f32 in a warm process: 8.1 ms a call,
    4.8 with the cut): lowering asks for the cut's worker (which imports Numba) and
    lowers again through Numba, products cut, the step runner's bits kept. (Its row,
    given up once the product was found too big, had noted the product's fresh output:
    the segment allocated it at each call, in the host step's slot; ~8 s.)"""
    serial = {"NUMBA_NUM_THREADS": "1"}  # (serial kernels: the plan lowers natively)
    _run(tmp_path, native=False, script=PRODUCTS, **serial)  # kernels, adapters, loop
    reference = _run(tmp_path, native=False, script=PRODUCTS, FASTGRAD_RUNTIME="steps", **serial)
    warm = _run(tmp_path, native=True, script=PRODUCTS, **serial)
    assert "numba True" in warm and "['builtin_function_or_method']" in warm, warm
    assert "cut's worker serving True" in warm, warm
    assert "allocated for a host step []" in warm, warm
    assert warm.splitlines()[-1].startswith("bits")
    assert warm.splitlines()[-1] == reference.splitlines()[-1]


def test_what_native_plan_mirrors_without_numba_agrees():
    """The loop's source tag, which runtime.vm keys its loop by too."""
    from fastgrad.runtime import vm

    assert vm_rows.loop_source_tag() == vm._source_tag()


@pytest.mark.skipif(sys.platform != "linux", reason="ELF object files")
def test_the_native_entry_sets_the_pointers_run_steps_sets():
    """The entry compiled with llvmlite writes each array's address where the segment's
    record says, then runs the loop: the table run_steps leaves (0.1 s)."""
    import numpy as np

    from fastgrad.runtime import vm, vm_rows

    loop = vm.table_function()  # (stored in the cache as it compiles or loads)
    address = native_plan.loop()  # the same machine code, loaded again without Numba
    assert address is not None
    code = [vm_rows.VIEW, 0, 1, 8, vm_rows.VIEW, 2, 3, 16]
    x, y = np.arange(4.0), np.arange(6.0)
    tables = []
    for function in (address, loop):
        table, at = vm_rows.pack(code, [0, 4], [], 5, [], [[0, 2, 2, 0, 2]], 0, function)
        run = native_plan.Runner(address, table, at[0]) if function == address else vm.run_steps
        run(table, at[0], (x, y))
        tables.append(table[table[2] : table[2] + 4])
    assert list(tables[0]) == list(tables[1])
    assert list(tables[0]) == [x.ctypes.data, x.ctypes.data + 8, y.ctypes.data, y.ctypes.data + 16]


def test_a_first_call_loads_itself_once_its_loops_on_numpy_add_up():
    """Loops none of which pays for llvmlite's import alone are counted on the first
    call under way; once those NumPy ran reach CALL_WORK, the rest load in the call.
    Loops under SMALL_WORK (NumPy's cost a call's) never count; outside a first call,
    nothing does. (~0.01 s)"""
    from fastgrad.runtime import background

    small, medium = native_plan.SMALL_WORK // 2, native_plan.CALL_WORK // 3 + 1
    assert not native_plan._worth_with_others(medium)  # no first call under way
    with background.first_run("a test"):
        assert not any(native_plan._worth_with_others(small) for _ in range(100))
        assert not native_plan._worth_with_others(medium)
        assert not native_plan._worth_with_others(medium)
        assert native_plan._worth_with_others(medium)  # 3 of a third: loaded now
        assert native_plan._worth_with_others(small)
    with background.first_run("another"):  # counted afresh
        assert not native_plan._worth_with_others(medium)


class _Step:
    """What `native_plan._stored` reads of a kernel step, counting its signature's asks."""

    def __init__(self, form: object, scalars: tuple[object, ...], asked: list[int]):
        self._form, self.sizes, self.scalars, self.asked = form, (4,), scalars, asked

    def adapter_signature(self) -> tuple[int, list[str], list[tuple[int, str]]]:
        self.asked.append(1)
        return 1, [type(s).__name__ for s in self.scalars], [(1, "float32")]


def test_a_stored_kernels_signature_is_asked_once_per_kind_of_step(tmp_path, monkeypatch):
    """Steps alike (kernel, form, NumPy scalars' types) share the answer of the first;
    another form or scalar type is asked afresh, so is a step with a Python scalar
    (whose dtype follows its value), and a kernel not stored answers None. (~0.01 s)"""
    import numpy as np

    from fastgrad.compiler import kernel_cache

    class Final:
        source = f"def fastgrad_kernel(x):  # {tmp_path}\n    return x\n"

    (tmp_path / kernel_cache.FOLDER).mkdir()
    name = f"fastgrad_kernel_{kernel_cache.kernel_key(Final.source)}.0.nbm"
    (tmp_path / kernel_cache.FOLDER / name).write_bytes(b"")
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))
    final, asked, form = Final(), [], object()
    first = native_plan._stored(final, _Step(form, (np.float32(1),), asked))
    assert first is not None and first[0] == (1, ["float32"], [(1, "float32")])
    assert native_plan._stored(final, _Step(form, (np.float32(2),), asked)) is first
    assert len(asked) == 1
    native_plan._stored(final, _Step(object(), (np.float32(2),), asked))
    native_plan._stored(final, _Step(form, (np.float64(2),), asked))
    assert len(asked) == 3
    for _ in range(2):
        assert native_plan._stored(final, _Step(form, (2.0,), asked))[0][1] == ["float"]
    assert len(asked) == 5

    class Missing:
        source = Final.source + "# not stored\n"

    assert native_plan._stored(Missing(), _Step(form, (), asked)) is None


@pytest.mark.skipif(sys.platform != "linux", reason="ELF object files")
def test_the_native_entrys_machine_code_is_stored_and_read_back(tmp_path, monkeypatch):
    """Compiled once and stored; read back after; compiled again where the file is
    damaged (a process running it so: the warm native tests above). (~0.1 s)"""
    from fastgrad.runtime import native_code

    made = native_code.engine()
    if made is None:
        pytest.skip("llvmlite's engine is not available here")
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))
    compiled = []
    entry_ir = native_plan._entry_ir
    monkeypatch.setattr(native_plan, "_entry_ir", lambda: compiled.append(1) or entry_ir())
    code = native_plan._entry_code(made)
    assert native_plan._entry_code(made) == code and len(compiled) == 1
    (path,) = (tmp_path / "adapters").glob("*.nbm")
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    path.write_bytes(bytes(blob))
    assert native_plan._entry_code(made) == code and len(compiled) == 2
    assert native_plan._entry_code(made) == code and len(compiled) == 2


def test_a_step_settles_at_its_runs_end_on_a_kernel_loaded_meanwhile():
    """plan_steps' `_loaded`, asked as the arena binds its unsettled steps after a run:
    a step whose kernel the compile thread has loaded settles then (its plan lowered at
    that run's end), but not while the load runs, nor on values not of a run (a fresh
    arena's empty slots), nor at a first call's end: the step's own run asks later.
    (~0.001 s)"""
    import threading
    from types import SimpleNamespace

    import numpy as np

    from fastgrad.runtime import background, plan_steps

    asked = []

    class Loading:
        settled = threading.Event()

        def answer(self, tier, step, env, bound):
            asked.append(env)
            return False

    step = SimpleNamespace(ins=[0], _reshape_in=(False,), _buffers=[1])
    tier = SimpleNamespace(loading=None)
    env = [np.zeros(3), np.zeros(3)]
    assert not plan_steps._loaded(tier, step, env)
    tier.loading = Loading()
    assert not plan_steps._loaded(tier, step, env)  # still loading
    Loading.settled.set()
    assert not plan_steps._loaded(tier, step, [None, env[1]])  # not a run's values
    with background.first_run("a test"):  # a first call's end: the next call's run asks
        assert not plan_steps._loaded(tier, step, env)
    assert not asked
    assert plan_steps._loaded(tier, step, env) and asked == [env]


def test_loop_source_tag_covers_what_the_loop_imports():
    """The interpreter loop's stored machine code is keyed by the source of every runtime
    module it imports at module level, transitively (a constant it inlines from one left
    out, e.g. the cut state's CUT entry in gemm_jobs, would leave an older loop calling a
    wrong address)."""
    import ast

    root = Path(vm_rows.__file__).parent
    seen, todo = set(), ["vm"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.parse((root / f"{name}.py").read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module == "fastgrad.runtime":
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "fastgrad.runtime."
            ):
                todo.append(node.module.split(".")[2])
    assert seen == set(vm_rows._LOOP_SOURCES)


def test_a_load_asks_again_while_the_engine_is_undecided(monkeypatch):
    """A load that finds the engine neither made nor refused (a fork's handler held
    numba_load's lock across the fork) asks again rather than keeping "no kernel", which
    every tier of that kernel would read, sending the process to Numba's path."""
    from types import SimpleNamespace

    from fastgrad.runtime import native_code

    answers = iter([None, None, "the kernel"])
    monkeypatch.setattr(native_code, "kernel", lambda source, shape: next(answers))
    monkeypatch.setattr(native_code, "undecided", lambda: True)
    monkeypatch.setattr(native_plan, "_numba_to_come", lambda: False)
    monkeypatch.setattr(native_plan, "loop", lambda: None)
    job = native_plan.Load(SimpleNamespace(source="def kernel(): pass"), (0, [], []))
    job.run()
    assert job.kernel == "the kernel" and job.error is None
