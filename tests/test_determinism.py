"""Results do not depend on where arrays sit in memory or on the thread count.

Generated loops iterate with unsigned indices, so Numba emits no negative-index
wraparound, and kernels are compiled with their arguments marked noalias
(codegen.support.NoAlias), so LLVM makes no run-time alias checks between inputs and
outputs: the vectorized loop always runs, and a reduction always adds in the same order.
Before, an output that started within 32 bytes after an input's end (signed indices), or
within a vector body's 256 bytes after an input's start (a short loop: the step runner's
first call gave another float32 loss than its later calls), sent the loop down its scalar
path, and the sum came out different.
"""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.executable import _KernelStep

LOSSES = {
    "square": lambda x: fnp.sum(x * x),
    "exp": lambda x: fnp.sum(fnp.exp(x) * x),
    "sin": lambda x: fnp.sum(fnp.sin(x) ** 2) + fnp.mean(x),
}


def _placed(buffer: np.ndarray, offset: int, n: int, dtype: np.dtype) -> np.ndarray:
    return buffer[offset : offset + n * dtype.itemsize].view(dtype)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [5003, 20, 40])
def test_reduction_ignores_output_addresses(name, dtype, n, compiled_first_call):
    """The kernel of value_and_grad (one loop: the sum and the gradient) called on an input
    and outputs laid out back to back with gaps of 0 to 260 bytes, at several offsets in a
    page: every layout gives the same bits (before: two results for square/float64 and
    exp/float32 at n = 5003, split at a 32-byte gap; before noalias, for square/float32 at
    n = 20 and 40, split where the gradient started 256 bytes past the input)."""
    dtype = np.dtype(dtype)
    # serial kernel, odd length: a vector body and a remainder; short ones: a few vectors
    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    f = fg.jit(fg.value_and_grad(LOSSES[name]))
    expected = f(x)
    (step,) = [s for s in f.lower(x).executable.plan if isinstance(s, _KernelStep)]
    assert step.kernel is not None and not step.parallel
    assert len(step.source.outputs) == 2  # the value and the gradient, from one loop
    results = set()
    nbytes = n * dtype.itemsize
    for gap in range(0, 264, dtype.itemsize):  # each output right after the last array
        for shift in (0, 8, 24, 4096 - 8):
            buffer = np.zeros(2 * nbytes + 2 * gap + shift + 4096, np.uint8)
            xs = _placed(buffer, shift, n, dtype)
            xs[:] = x
            outs = []
            at = shift + nbytes + gap
            for out in step.source.outputs:
                size = max(out.aval.size, 1)
                outs.append(_placed(buffer, at, size, dtype))
                at += size * dtype.itemsize + gap
            step.kernel(*step.sizes, step.nchunks, *step.scalars, xs, *outs)
            results.add(b"".join(o.tobytes() for o in outs))
    assert len(results) == 1
    value, grad = expected
    assert results == {b"".join(np.asarray(a).tobytes() for a in (value, grad))} or (
        results == {b"".join(np.asarray(a).tobytes() for a in (grad, value))}
    )


_CHILD = """
import hashlib, numpy as np, fastgrad as fg, fastgrad.numpy as fnp
def loss(x, y):
    return fnp.sum(fnp.exp(x * 0.5) * y + x * x) + fnp.sum(fnp.tanh(x).reshape(-1, 8)[:, 3])
rng = np.random.default_rng(1)
parts = []
for dtype in (np.float32, np.float64):
    x, y = (rng.standard_normal(300_000).astype(dtype) for _ in range(2))
    value, grads = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))(x, y)
    parts += [np.asarray(value).tobytes()] + [g.tobytes() for g in grads]
    m = rng.standard_normal((600, 700)).astype(dtype)
    parts.append(fg.jit(lambda m: fnp.sum(m * m, axis=0) + fnp.max(m, axis=1).sum())(m).tobytes())
    # Short rows (bench M4's logsumexp over (N, 8)): serial at any thread count.
    s = rng.standard_normal((1 << 15, 8)).astype(dtype)
    parts.append(np.asarray(fg.jit(lambda s: fnp.sum(fnp.logsumexp(s, axis=1)))(s)).tobytes())
print(hashlib.sha256(b"".join(parts)).hexdigest())
"""


def test_results_equal_across_thread_counts():
    """A kernel above the parallel threshold runs in chunks across threads; one thread
    runs the serial variant. Partials are combined in a fixed order either way."""
    digests = []
    for threads in ("1", "2"):
        env = {**os.environ, "NUMBA_NUM_THREADS": threads}
        out = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        digests.append(out.stdout.split()[-1])
    assert digests[0] == digests[1]
    assert len(digests[0]) == len(hashlib.sha256().hexdigest())
