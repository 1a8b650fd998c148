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
f.compile(x, y)  # the usual path: Numba's kernels, the plan interpreter
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
