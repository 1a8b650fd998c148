"""The benchmark workloads: each loss is defined once, against a small `ops` namespace.

Every autodiff system (fastgrad, autograd, JAX, PyTorch) runs the same loss function
with its own `ops` (see systems.py); hand-written NumPy and Numba versions of the same
maths live in hand_numpy.py and hand_numba.py. Inputs are made here, from a seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

CLASSES = 1000  # W2/W3: columns of the logits matrix
MLP_IN, MLP_HIDDEN, MLP_OUT = 784, 512, 10  # W4: an MNIST-shaped two-layer MLP
INDEX_ITEMSIZE = 8  # labels are int64


@dataclass(frozen=True)
class Workload:
    key: str  # "W1"
    name: str  # "elementwise": also accepted on the command line
    title: str  # one line for the table
    size_name: str  # what `--size` sets: "N", "rows" or "batch"
    default_size: int
    quick_size: int
    argnums: tuple[int, ...]  # the differentiated arguments
    loss: Callable  # loss(ops, *inputs) -> scalar
    make_inputs: Callable[[int, np.dtype, np.random.Generator], tuple]
    min_bytes: Callable[[int, int], int]  # (size, itemsize) -> bytes a perfect kernel moves
    shape: Callable[[int], str]  # human-readable input shape for a size
    flops: Callable[[int], int] | None = None  # for compute-bound workloads only
    note: str = ""
    systems: tuple[str, ...] | None = None  # who runs it; None: fastgrad and --compare

    def size(self, quick: bool, override: int | None) -> int:
        if override is not None:
            return override
        return self.quick_size if quick else self.default_size


# ---------------------------------------------------------------- loss definitions


def elementwise_loss(ops, x, y):
    """W1/W5: a chain of elementwise ops feeding one sum."""
    return ops.sum(ops.tanh(x * y + ops.sin(x)) * ops.exp(-y * y) / (1 + x * x))


def softmax_xent(ops, logits, labels):
    """Mean softmax cross-entropy; the row max is a constant shift, so no gradient."""
    z = logits - ops.stop_gradient(ops.max(logits, axis=1, keepdims=True))
    rows = ops.arange(z.shape[0])
    return ops.mean(ops.logsumexp(z, axis=1) - z[rows, labels])


def logsumexp_loss(ops, x):
    """W3: row-wise logsumexp over the last axis, summed."""
    return ops.sum(ops.logsumexp(x, axis=-1))


def mlp_loss(ops, w1, b1, w2, b2, x, labels):
    """W4: two-layer tanh MLP with softmax cross-entropy; grads for all four parameters."""
    hidden = ops.tanh(x @ w1 + b1)
    return softmax_xent(ops, hidden @ w2 + b2, labels)


# ---------------------------------------------------------------- inputs


def _normal(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def elementwise_inputs(n, dtype, rng):
    return _normal(rng, n, dtype), _normal(rng, n, dtype)


def logits_inputs(rows, dtype, rng):
    logits = _normal(rng, (rows, CLASSES), dtype, scale=3.0)
    labels = rng.integers(0, CLASSES, size=rows, dtype=np.int64)
    return logits, labels


def matrix_inputs(rows, dtype, rng):
    return (_normal(rng, (rows, CLASSES), dtype, scale=3.0),)


def mlp_inputs(batch, dtype, rng):
    w1 = _normal(rng, (MLP_IN, MLP_HIDDEN), dtype, scale=MLP_IN**-0.5)
    b1 = _normal(rng, MLP_HIDDEN, dtype, scale=0.1)
    w2 = _normal(rng, (MLP_HIDDEN, MLP_OUT), dtype, scale=MLP_HIDDEN**-0.5)
    b2 = _normal(rng, MLP_OUT, dtype, scale=0.1)
    x = _normal(rng, (batch, MLP_IN), dtype)
    labels = rng.integers(0, MLP_OUT, size=batch, dtype=np.int64)
    return w1, b1, w2, b2, x, labels


# ---------------------------------------------------------------- cost models
# The least traffic any implementation needs: read every input once, write every
# gradient once. Temporaries a library keeps in memory are its own cost.

_MLP_PARAMS = MLP_IN * MLP_HIDDEN + MLP_HIDDEN + MLP_HIDDEN * MLP_OUT + MLP_OUT


def _mlp_bytes(batch, itemsize):
    return batch * MLP_IN * itemsize + batch * INDEX_ITEMSIZE + 2 * _MLP_PARAMS * itemsize


def _mlp_flops(batch):
    # forward: two matmuls; backward: dW2, dh and dW1 (no gradient for x)
    return 2 * batch * (2 * MLP_IN * MLP_HIDDEN + 3 * MLP_HIDDEN * MLP_OUT)


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        key="W1",
        name="elementwise",
        title="elementwise chain sum(tanh(x*y+sin x)*exp(-y*y)/(1+x*x)), grad x,y",
        size_name="N",
        default_size=10**7,
        quick_size=10**6,
        argnums=(0, 1),
        loss=elementwise_loss,
        make_inputs=elementwise_inputs,
        min_bytes=lambda n, isz: 4 * n * isz,
        shape=lambda n: f"x, y: ({n:,})",
    ),
    Workload(
        key="W2",
        name="softmax-xent",
        title="softmax cross-entropy, stop_gradient row max, integer labels",
        size_name="rows",
        default_size=4096,
        quick_size=256,
        argnums=(0,),
        loss=softmax_xent,
        make_inputs=logits_inputs,
        min_bytes=lambda r, isz: 2 * r * CLASSES * isz + r * INDEX_ITEMSIZE,
        shape=lambda r: f"logits: ({r:,}, {CLASSES}), labels: ({r:,},) int64",
    ),
    Workload(
        key="W3",
        name="logsumexp",
        title="sum of logsumexp over the last axis",
        size_name="rows",
        default_size=4096,
        quick_size=256,
        argnums=(0,),
        loss=logsumexp_loss,
        make_inputs=matrix_inputs,
        min_bytes=lambda r, isz: 2 * r * CLASSES * isz,
        shape=lambda r: f"x: ({r:,}, {CLASSES})",
    ),
    Workload(
        key="W4",
        name="mlp",
        title=f"two-layer MLP {MLP_IN}-{MLP_HIDDEN}(tanh)-{MLP_OUT}, softmax xent, all grads",
        size_name="batch",
        default_size=256,
        quick_size=32,
        argnums=(0, 1, 2, 3),
        loss=mlp_loss,
        make_inputs=mlp_inputs,
        min_bytes=_mlp_bytes,
        shape=lambda b: f"x: ({b:,}, {MLP_IN}), params: {_MLP_PARAMS:,}",
        flops=_mlp_flops,
        note="compute-bound (matmuls): GB/s and % bandwidth are shown for completeness",
    ),
    Workload(
        key="W5",
        name="overhead",
        title="W1 at N=16: per-call overhead",
        size_name="N",
        default_size=16,
        quick_size=16,
        argnums=(0, 1),
        loss=elementwise_loss,
        make_inputs=elementwise_inputs,
        min_bytes=lambda n, isz: 4 * n * isz,
        shape=lambda n: f"x, y: ({n:,})",
        note="time is dominated by per-call dispatch, not by arithmetic",
    ),
    # ------------------------------------------------------------------------------
    # Seed use-case workloads go here once their examples exist (one Workload each,
    # its loss written against `ops` like the ones above, plus a hand-written NumPy
    # version in hand_numpy.py):
    #   W6 "em-step"    one EM step of a Gaussian mixture
    #   W7 "cd-step"    one contrastive-divergence step of an RBM
    #   W8 "fgsm-step"  one fast-gradient-sign attack step on a classifier
)


# ---------------------------------------------------------------- scale-out (run when named)
# D1: the full-batch logistic-regression gradient in one process and on a Dask cluster.
# The data is made chunk by chunk from per-chunk seeds, so the cluster's workers can make
# their own chunks and every system still sees the same numbers.

DASK_FEATURES = 100
DASK_CHUNKS = 16


def logistic_loss(ops, w, x, y):
    """D1: mean logistic loss of 0/1 labels y for scores x @ w."""
    z = x @ w
    return ops.mean(ops.softplus(z) - y * z)


def dask_chunk_rows(rows: int) -> list[int]:
    base, extra = divmod(rows, DASK_CHUNKS)
    return [base + (i < extra) for i in range(DASK_CHUNKS) if base + (i < extra)]


def dask_chunk(index: int, rows: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Chunk `index` of D1's data: standard normal features, 0/1 labels."""
    rng = np.random.default_rng([17, index])
    x = rng.standard_normal((rows, DASK_FEATURES)).astype(dtype)
    y = (rng.random(rows) < 0.5).astype(dtype)
    return x, y


def dask_params(dtype) -> np.ndarray:
    return _normal(np.random.default_rng(5), DASK_FEATURES, dtype, scale=0.1)


def logistic_inputs(rows, dtype, rng):
    chunks = [dask_chunk(i, r, dtype) for i, r in enumerate(dask_chunk_rows(rows))]
    return (
        dask_params(dtype),
        np.concatenate([x for x, _ in chunks]),
        np.concatenate([y for _, y in chunks]),
    )


DASK = Workload(
    key="D1",
    name="dask",
    title="full-batch logistic-regression gradient: one process vs fastgrad.dask, 1 and 2 workers",
    size_name="rows",
    default_size=4 * 10**6,
    quick_size=2 * 10**5,
    argnums=(0,),
    loss=logistic_loss,
    make_inputs=logistic_inputs,
    min_bytes=lambda r, isz: r * (DASK_FEATURES + 1) * isz + 2 * DASK_FEATURES * isz,
    shape=lambda r: f"x: ({r:,}, {DASK_FEATURES}) in {DASK_CHUNKS} chunks, y: ({r:,},)",
    note="run only when named; the dask rows split each call into compute and overhead",
    systems=("fastgrad", "numpy", "dask-1", "dask-2"),
)
OPT_IN: tuple[Workload, ...] = (DASK,)


def find(name: str) -> Workload:
    """Look a workload up by key ("W1", "w1") or name ("elementwise")."""
    wanted = name.strip().lower()
    for w in WORKLOADS + OPT_IN:
        if wanted in (w.key.lower(), w.name):
            return w
    known = ", ".join(f"{w.key} ({w.name})" for w in WORKLOADS + OPT_IN)
    raise KeyError(f"unknown workload {name!r}; choose from {known}")
