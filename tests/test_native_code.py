"""Stored kernels run before Numba's import (runtime.native_code): a fresh process with
its kernels on disk answers its first call through them, Numba not imported, with the
bits of the compiled path; a damaged file leaves that kernel to NumPy and Numba."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fastgrad.runtime import native_code

SCRIPT = """
import sys
import numpy as np
import fastgrad as fg, fastgrad.numpy as fnp
from fastgrad.runtime import background, native_code

native_code.IMPORT_WORK = native_code.WHOLE_WORK = 0  # every kernel, however small
native_code.LOAD_WORK = 0
calls = []
call = native_code.NativeKernel.__call__
# Numba imported or not as each kernel runs (after the first call, the compile thread
# imports it at once)
native_code.NativeKernel.__call__ = lambda self, *a: (
    calls.append("numba" in sys.modules), call(self, *a)
)[1]

def loss(x, y):
    return fnp.sum(fnp.tanh(x * y) * fnp.exp(-y * y) + fnp.log1p(x * x))

rng = np.random.default_rng(0)
x, y = (rng.standard_normal(301).astype(np.{dtype}) for _ in range(2))
f = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))
value, (gx, gy) = f(x, y)
first = [np.asarray(value), gx, gy]
print("numba", any(calls), "native calls", len(calls))
f.compile(x, y)  # settled: Numba's kernels (cold), or the plan run natively (warm)
value, (gx, gy) = f(x, y)
same = all(a.tobytes() == np.asarray(b).tobytes() for a, b in zip(first, [value, gx, gy]))
print("same bits", same)
"""


def _run(cache: Path, dtype: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("FASTGRAD_COMPILE", "FASTGRAD_NATIVE")}
    env["FASTGRAD_CACHE_DIR"] = str(cache)
    run = [sys.executable, "-c", SCRIPT.replace("{dtype}", dtype)]
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="ELF object files")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_warm_first_call_runs_stored_kernels_without_numba(tmp_path, dtype):
    cold = _run(tmp_path, dtype)  # compiles and stores every kernel
    assert "native calls 0" in cold, cold
    warm = _run(tmp_path, dtype)
    assert "numba False" in warm, warm  # the kernels ran compiled, Numba absent
    assert "native calls 0" not in warm, warm
    assert "same bits True" in warm, warm
    for path in (tmp_path / "kernels").glob("*.nbm"):  # damaged: NumPy, then Numba compiles
        blob = bytearray(path.read_bytes())
        blob[-100] ^= 0xFF
        path.write_bytes(bytes(blob))
    damaged = _run(tmp_path, dtype)
    assert "native calls 0" in damaged, damaged


def test_kernel_types_are_numbas():
    numba = pytest.importorskip("numba")
    from fastgrad.runtime.kernel_entry import kernel_signature

    shape = (2, ["float32", "int64", "bool"], [(1, "float64"), (3, "int32"), (0, "bool")])
    assert native_code.kernel_types(*shape) == str(kernel_signature(*shape))
    assert numba  # (imported for kernel_entry)


@pytest.mark.skipif(sys.platform != "linux", reason="ELF object files")
def test_the_engine_keys_machine_code_as_numba_does():
    from numba.core.registry import cpu_target

    made = native_code.engine()
    assert made is not None
    assert made.magic == repr(cpu_target.target_context.codegen().magic_tuple())


def test_undefined_symbols_of_an_object_file():
    made = native_code.engine()
    if made is None:
        pytest.skip("no engine here")
    llvm = made.llvm
    module = llvm.parse_assembly(
        "declare double @not_here(double)\n"
        "define double @f(double %x) {\n  %y = call double @not_here(double %x)\n"
        "  ret double %y\n}\n"
    )
    machine = llvm.Target.from_default_triple().create_target_machine()
    code = machine.emit_object(module)
    assert native_code.undefined(code) == ["not_here"]
    with pytest.raises(ValueError):
        native_code.undefined(b"not an object file")
    assert np  # (NumPy: the module's arrays)


def _stored(tmp_path: Path, code: bytes, symbols: list[str], key: bytes) -> Path:
    """A file laid out as compiler.machine_code stores a compile result."""
    import hashlib
    import pickle

    payload = pickle.dumps((("f", "object", (code, b""), symbols), None))
    path = tmp_path / "f.nbm"
    path.write_bytes(hashlib.sha256(key + payload).digest() + payload)
    return path


def test_a_file_needing_an_unknown_symbol_or_damaged_is_not_loaded(tmp_path):
    made = native_code.engine()
    if made is None:
        pytest.skip("no engine here")
    llvm = made.llvm
    machine = llvm.Target.from_default_triple().create_target_machine(codemodel="jitdefault")

    def compiled(body: str, name: str) -> bytes:
        source = f"declare double @{name}_other(double)\n" if "other" in body else ""
        source += f'define double @"cfunc.{name}"(double %x) {{\n{body}}}\n'
        return machine.emit_object(llvm.parse_assembly(source))

    calls = "  %y = call double @g_other(double %x)\n  ret double %y\n"
    path = _stored(tmp_path, compiled(calls, "g"), ["g", "cfunc.g"], b"key")
    assert made.load(path, b"key") is None  # g_other: nobody gave LLVM its address
    good = tmp_path / "good"
    good.mkdir()
    path = _stored(good, compiled("  %y = fadd double %x, 1.0\n  ret double %y\n", "h"),
                   ["h", "cfunc.h"], b"key")  # fmt: skip
    assert made.load(path, b"other key") is None  # its digest binds another key
    address = made.load(path, b"key")
    assert address
    import ctypes

    assert ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)(address)(2.0) == 3.0


class _Tier:
    """What for_tier reads of a kernel tier (runtime.background.KernelTier)."""

    def __init__(self) -> None:
        self.native = None
        self.stored = [type("Variant", (), {"source": "def k(): pass"})()]
        self.numpy_loop = type("Loop", (), {"blocked": None})()

    def _work(self, ops: int = 0) -> int:
        return 1 << 40 if not ops else 1


def test_a_loop_asked_while_numbas_import_holds_the_engine_is_asked_again(monkeypatch):
    """engine() is None while Numba's import (on the compile thread) holds its lock: the
    tier asks again at its next call; only a machine where the path cannot run (the
    engine made as None) ends the question for good."""
    monkeypatch.setattr(native_code, "needs_build", lambda source: False)
    monkeypatch.setattr(native_code, "ENABLED", True)
    step = type("Step", (), {"adapter_signature": lambda self: (1, [], [(1, "float64")])})()
    monkeypatch.setattr(native_code, "_ENGINE", [])
    monkeypatch.setattr(native_code, "engine", lambda: None)  # busy: nothing kept
    tier = _Tier()
    assert native_code.for_tier(tier, step, []) is None
    assert tier.native is None
    monkeypatch.setattr(native_code, "_ENGINE", [None])  # cannot run here
    assert native_code.for_tier(tier, step, []) is None
    assert tier.native is False


def test_lowering_a_plan_imports_no_numba():
    """What lays out the interpreter's table (runtime.vm_rows) and lowers plans to it
    imports NumPy alone: a warm process may lower before Numba's import."""
    modules = "plan_table, loop_row, loop_table, small_call, vm_rows"
    code = f"import sys; from fastgrad.runtime import {modules}; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("held_for", [0.3, 30.0])
def test_a_fork_waits_for_a_load_under_way_or_leaves_the_child_numbas_path(held_for):
    """The compile thread holds native_code's lock while it imports llvmlite and links
    stored files (runtime.native_plan.Load). A fork waits for it (held 0.3 s): the
    child's lock is free and its engine kept. Where the wait times out (compile_timeout
    0.5 s, held 30 s), the child's lock is free too and the path is off there (its
    engine may be half-changed): never a hang. (~1 s)"""
    import threading
    import time

    from fastgrad.core.config import config

    if native_code.engine() is None:
        pytest.skip("no engine here")
    held, release = threading.Event(), threading.Event()

    def load() -> None:
        with native_code._LOCK:
            held.set()
            release.wait(held_for)

    holder = threading.Thread(target=load, daemon=True)
    before = config.compile_timeout
    config.update("compile_timeout", 0.5)
    try:
        holder.start()
        assert held.wait(60)
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: the lock free at once, the engine kept unless timed out
            code = 1
            try:
                free = native_code._LOCK.acquire(timeout=5)
                off = native_code._ENGINE == [None]
                code = 0 if free and off == (held_for > 1) else 2
            finally:
                os._exit(code)
        waited = time.perf_counter() - start
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert waited >= min(held_for, 0.5) - 0.05, waited
        assert native_code._ENGINE != [None]  # (the parent's engine untouched)
    finally:
        config.update("compile_timeout", before)
        release.set()
        holder.join(60)
