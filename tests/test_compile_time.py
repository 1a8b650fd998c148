"""Compile time: kernels whose shape sent LLVM into compiles of minutes.

A loop over an axis of size 1 reads index 0 there: with a runtime trip count, its body is
the same at every iteration, and reductions marked reassociable inside made LLVM's loop
vectorizer run for minutes (a (3, 1) float64 loop of three tanh_f64 and two sums: more
than 88 s of CPU, stopped, against ~3 s with the trip count written as 1). Its first call
in sync mode runs in a child process here, bounded, so a regression fails rather than
hangs the suite.
"""

import os
import subprocess
import sys

import numpy as np

import fastgrad as fg
import fastgrad.numpy as fnp


def size_one_loss(x0, x1, x2):
    return fnp.sum(1.0 / (1.5 + fnp.tanh(fnp.tanh(x2) * 0.7 - fnp.tanh(x1 + x0) * 0.7)))


def inputs():
    return np.float64(0.3), np.linspace(-1, 1, 3).reshape(3, 1), np.linspace(0, 1, 3)[:, None]


def test_an_axis_of_size_one_gets_a_literal_trip_count():
    f = fg.jit(fg.value_and_grad(size_one_loss, argnums=(0, 1, 2)))
    (source,) = f.lower(*inputs()).kernels  # generated, not compiled
    # The size-1 axis is looped over with the literal trip count, or merged away (a loop
    # whose operands are all (3, 1) runs flat over 3): never with a runtime one.
    assert "for i1 in range(np.uint64(1)):" in source or "for i1 in" not in source, source
    assert "range(np.uint64(n1))" not in source, source


CHILD = """
import numpy as np, fastgrad as fg
from tests.test_compile_time import inputs, size_one_loss
f = fg.jit(fg.value_and_grad(size_one_loss, argnums=(0, 1, 2)))
value, grads = f(*inputs())  # sync: compiles the kernel, then runs it
(traced,) = f._cache.values()
assert traced.executable.compiled
reference = fg.jit(fg.value_and_grad(size_one_loss, argnums=(0, 1, 2)), fuse=False)(*inputs())
np.testing.assert_allclose(value, reference[0], rtol=1e-13)
for g, r in zip(grads, reference[1], strict=True):
    np.testing.assert_allclose(g, r, rtol=1e-13, atol=1e-15)
"""


def test_the_size_one_kernel_compiles_in_seconds(tmp_path):
    # ~3 s of CPU for the compile (plus imports); the bound leaves room for a loaded machine.
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(tmp_path), FASTGRAD_COMPILE="sync")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    run = [sys.executable, "-c", CHILD]
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr
