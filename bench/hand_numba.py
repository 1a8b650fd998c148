"""Hand-fused Numba loops: the practical limit of what a Numba loop reaches.

W1/W5 is one prange loop that reads x and y once and writes the value and both
gradients; W2 and W3 are one row-parallel loop. Outputs are allocated with NumPy and
passed in. W4 is matmul-bound, so there is no hand-fused loop for it. fastmath lets
LLVM vectorize the max and sum reductions (it halves W3's time); the exp/tanh/sin calls
stay scalar, as the llvmlite wheels carry no SVML.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import prange

# Below this many elements, starting threads costs more than the loop itself.
PARALLEL_THRESHOLD = 1 << 15


@functools.cache
def _kernels(dtype: type) -> dict:
    """Compile-on-first-call kernels for one float dtype.

    Constants are closure values of that dtype, so float32 arithmetic stays float32.
    """
    one, two = dtype(1.0), dtype(2.0)

    def elementwise(x, y, gx, gy):
        acc = 0.0  # float64 accumulator: the value stays accurate for float32 too
        for i in prange(x.shape[0]):
            xi, yi = x[i], y[i]
            t = np.tanh(xi * yi + np.sin(xi))
            e = np.exp(-yi * yi)
            r = one / (one + xi * xi)
            ter = t * e * r
            acc += ter
            da = (one - t * t) * e * r
            gx[i] = da * (yi + np.cos(xi)) - two * xi * ter * r
            gy[i] = da * xi - two * yi * ter
        return acc

    def logsumexp_rows(x, g, lse):
        cols = x.shape[1]
        for i in prange(x.shape[0]):
            m = x[i, 0]
            for j in range(1, cols):
                m = max(m, x[i, j])
            s = dtype(0.0)
            for j in range(cols):
                e = np.exp(x[i, j] - m)
                g[i, j] = e
                s += e
            inv = one / s
            for j in range(cols):
                g[i, j] *= inv
            lse[i] = np.log(s) + m

    def xent_rows(logits, labels, scale, g, loss):
        cols = logits.shape[1]
        for i in prange(logits.shape[0]):
            m = logits[i, 0]
            for j in range(1, cols):
                m = max(m, logits[i, j])
            s = dtype(0.0)
            for j in range(cols):
                e = np.exp(logits[i, j] - m)
                g[i, j] = e
                s += e
            inv = scale / s
            for j in range(cols):
                g[i, j] *= inv
            label = labels[i]
            g[i, label] -= scale
            loss[i] = np.log(s) - (logits[i, label] - m)

    kernels = {}
    for name, body in [("elementwise", elementwise), ("lse", logsumexp_rows), ("xent", xent_rows)]:
        # Same source twice: prange is a plain range when parallel=False.
        kernels[name] = (
            numba.njit(parallel=True, fastmath=True)(body),
            numba.njit(fastmath=True)(body),
        )
    return kernels


def _pick(name: str, arr: np.ndarray):
    parallel, serial = _kernels(arr.dtype.type)[name]
    return parallel if arr.size >= PARALLEL_THRESHOLD else serial


def elementwise(x, y):
    gx, gy = np.empty_like(x), np.empty_like(x)
    value = _pick("elementwise", x)(x, y, gx, gy)
    return x.dtype.type(value), (gx, gy)


def logsumexp(x):
    g = np.empty_like(x)
    lse = np.empty(x.shape[0], dtype=x.dtype)
    _pick("lse", x)(x, g, lse)
    return lse.sum(), (g,)


def softmax_xent(logits, labels):
    g = np.empty_like(logits)
    loss = np.empty(logits.shape[0], dtype=logits.dtype)
    scale = logits.dtype.type(1.0 / logits.shape[0])
    _pick("xent", logits)(logits, labels, scale, g, loss)
    return loss.mean(), (g,)


IMPLEMENTATIONS = {
    "W1": elementwise,
    "W2": softmax_xent,
    "W3": logsumexp,
    "W5": elementwise,
}
NOT_APPLICABLE = {"W4": "no hand-fused loop: the work is two matmuls (BLAS)"}
