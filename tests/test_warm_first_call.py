"""A warm process's first call (its plan built from the steps stored with it, its loops
on NumPy while the kernels load: runtime.stored_plan, runtime.background) gives the bits
of a cold process's first call (the plan prepared afresh), for an unrolled RNN's
jit(value_and_grad) in float32 and float64. Cost: two processes, ~5 s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
import numpy as np
import fastgrad as fg, fastgrad.numpy as fnp
from fastgrad.compiler import plan_cache

plan_cache.MIN_NODES = 0  # (the cache at this small length too)

def loss(w, u, xs, h):
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] @ w + h @ u)
    return fnp.sum(h * h)

rng = np.random.default_rng(0)
for dtype in (np.float32, np.float64):
    w, u = rng.standard_normal((2, 12, 12)).astype(dtype) * 0.3
    xs, h = rng.standard_normal((6, 5, 12)).astype(dtype), np.zeros((5, 12), dtype)
    f = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))
    value, grads = f(w, u, xs, h)
    bits = b"".join(np.asarray(a).tobytes() for a in [value, *grads])
    print(np.dtype(dtype).name, bits.hex())
print("stored steps read", plan_cache.COUNTERS.loaded)
"""


def _first_calls(cache: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "FASTGRAD_COMPILE"}
    env.update(FASTGRAD_CACHE_DIR=str(cache), FASTGRAD_COMPILE="background")
    env.update(FASTGRAD_COMPILE_NOTICE="0")
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_warm_first_call_gives_a_cold_first_calls_bits(tmp_path: Path) -> None:
    cold = _first_calls(tmp_path)
    assert cold[-1] == "stored steps read 0", cold
    warm = _first_calls(tmp_path)
    assert warm[-1] == "stored steps read 2", warm  # (both plans built from their steps)
    assert [line.split()[0] for line in warm[:-1]] == ["float32", "float64"]
    assert warm[:-1] == cold[:-1]
