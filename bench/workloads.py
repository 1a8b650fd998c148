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
PEX_IN, PEX_HIDDEN, PEX_OUT = 64, 64, 10  # V1: the digits MLP of per_example_gradients.py
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
    # Cross-check tolerance when systems compute different numbers with the same
    # statistics (random samples); None: the dtype's default in report.py.
    check_rtol: float | None = None
    # What each system computes: "value_and_grad" of the loss over `argnums`; "hvp": the
    # value and the Hessian-vector product loss''(x) v, forward over reverse, for inputs
    # (x, v); or "per_example": the loss of one example and its gradient in `argnums`,
    # mapped (vmap) over the leading axis of the other inputs (the value is the sum).
    transform: str = "value_and_grad"

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


def example_loss(ops, w1, b1, w2, b2, x, y):
    """V1: one example's softmax cross-entropy (y one-hot) under a two-layer tanh MLP."""
    logits = ops.tanh(x @ w1 + b1) @ w2 + b2
    return ops.logsumexp(logits, axis=-1) - ops.sum(logits * y)


# ---------------------------------------------------------------- inputs


def normal_sample_loss(ops, scale, key):
    """R1: sum(scale * z^2) for standard normal z drawn from `key`; the gradient is z^2.
    Both are statistics (about sum(scale) and N) that any correct sampler reproduces."""
    z = ops.normal(key, scale.shape, scale.dtype)
    return ops.sum(scale * z * z)


def per_example_inputs(batch, dtype, rng):
    params = _mlp_params(rng, dtype, PEX_IN, PEX_HIDDEN, PEX_OUT)
    x = _normal(rng, (batch, PEX_IN), dtype)
    y = np.eye(PEX_OUT, dtype=dtype)[rng.integers(0, PEX_OUT, batch)]
    return *params, x, y


PEX_PARAMS = PEX_IN * PEX_HIDDEN + PEX_HIDDEN + PEX_HIDDEN * PEX_OUT + PEX_OUT


def normal_sample_inputs(n, dtype, rng):
    return rng.random(n).astype(dtype) + 0.5, np.array([0, 42], np.uint32)


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


def _mlp_params(rng, dtype, n_in, hidden, n_out):
    """w1, b1, w2, b2 of a two-layer MLP, scaled by fan-in."""
    w1 = _normal(rng, (n_in, hidden), dtype, scale=n_in**-0.5)
    b1 = _normal(rng, hidden, dtype, scale=0.1)
    w2 = _normal(rng, (hidden, n_out), dtype, scale=hidden**-0.5)
    b2 = _normal(rng, n_out, dtype, scale=0.1)
    return w1, b1, w2, b2


def mlp_inputs(batch, dtype, rng):
    w1, b1, w2, b2 = _mlp_params(rng, dtype, MLP_IN, MLP_HIDDEN, MLP_OUT)
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
    Workload(
        key="R1",
        name="normal",
        title="standard normal samples z from a key: sum(scale * z^2), grad scale (= z^2)",
        size_name="N",
        default_size=10**7,
        quick_size=10**6,
        argnums=(0,),
        loss=normal_sample_loss,
        make_inputs=normal_sample_inputs,
        min_bytes=lambda n, isz: 2 * n * isz,
        shape=lambda n: f"scale: ({n:,}), z: ({n:,}) drawn in the loop",
        note="NumPy draws with Generator.standard_normal (ziggurat) into memory first",
        systems=("fastgrad", "numpy", "jax"),
        check_rtol=1e-2,  # the statistics' relative spread is ~1.5 / sqrt(N)
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


# ---------------------------------------------------------------- loops (run when named)
# S1-S5: an RNN over T steps, batch 32, hidden 128, input 64 (run with --dtype float32).
# S1 loops with scan, S2 unrolls the same loop in Python (one graph node per step), S3/S4
# a two-layer cell whose gradient stores three arrays per step, or one with checkpoint;
# S5 is S1 as a scan of scans.

RNN_BATCH, RNN_HIDDEN, RNN_IN = 32, 128, 64


def rnn_cell(ops, wx, wh, b):
    return lambda h, x: ops.tanh(x @ wx + h @ wh + b)


def rnn_scan_loss(ops, wx, wh, b, xs, h0):
    """S1: mean square of every hidden state, the loop a scan."""
    cell = rnn_cell(ops, wx, wh, b)

    def step(h, x):
        h = cell(h, x)
        return h, h

    _, hs = ops.scan(step, h0, xs)
    return ops.mean(hs * hs)


def rnn_unrolled_loss(ops, wx, wh, b, xs, h0):
    """S2: S1 unrolled in Python."""
    cell, h, total = rnn_cell(ops, wx, wh, b), h0, 0.0
    for t in range(xs.shape[0]):
        h = cell(h, xs[t])
        total = total + ops.sum(h * h)
    return total / (xs.shape[0] * RNN_BATCH * RNN_HIDDEN)


def _deep_rnn(ops, wx, wh, b, xs, h0, remat):
    def step(h, x):
        a = ops.tanh(x @ wx + h @ wh + b)
        return ops.tanh(a @ wh + h), None

    h, _ = ops.scan(ops.checkpoint(step) if remat else step, h0, xs)
    return ops.mean(h * h)


def deep_rnn_loss(ops, wx, wh, b, xs, h0):
    """S3: a two-layer cell; its gradient stacks h, the first layer and the new h."""
    return _deep_rnn(ops, wx, wh, b, xs, h0, remat=False)


def deep_rnn_checkpoint_loss(ops, wx, wh, b, xs, h0):
    """S4: S3 with the cell checkpointed: only h is stacked, the rest recomputed."""
    return _deep_rnn(ops, wx, wh, b, xs, h0, remat=True)


NESTED_CHUNK = 10  # S5's inner scan length


def nested_rnn_loss(ops, wx, wh, b, xs, h0):
    """S5: S1's loop as a scan over chunks of NESTED_CHUNK steps, each chunk a scan."""
    cell = rnn_cell(ops, wx, wh, b)

    def step(h, x):
        h = cell(h, x)
        return h, h

    def chunk(h, xs):
        h, hs = ops.scan(step, h, xs)
        return h, ops.sum(hs * hs)

    chunks = xs.reshape(xs.shape[0] // NESTED_CHUNK, NESTED_CHUNK, *xs.shape[1:])
    _, sums = ops.scan(chunk, h0, chunks)
    return ops.sum(sums) / (xs.shape[0] * RNN_BATCH * RNN_HIDDEN)


def rnn_inputs(steps, dtype, rng):
    return (
        _normal(rng, (RNN_IN, RNN_HIDDEN), dtype, scale=RNN_IN**-0.5),
        _normal(rng, (RNN_HIDDEN, RNN_HIDDEN), dtype, scale=RNN_HIDDEN**-0.5),
        np.zeros(RNN_HIDDEN, dtype),
        _normal(rng, (steps, RNN_BATCH, RNN_IN), dtype),
        np.zeros((RNN_BATCH, RNN_HIDDEN), dtype),
    )


def _rnn_workload(key, name, title, loss, default, quick, systems, note=""):
    return Workload(
        key=key,
        name=name,
        title=title,
        size_name="T",
        default_size=default,
        quick_size=quick,
        argnums=(0, 1, 2),
        loss=loss,
        make_inputs=rnn_inputs,
        min_bytes=lambda t, isz: (t * RNN_BATCH * RNN_IN + 2 * RNN_HIDDEN**2) * isz,
        shape=lambda t: f"xs: ({t:,}, {RNN_BATCH}, {RNN_IN}), hidden {RNN_HIDDEN}",
        note=note or "per-step work is small: time is the loop and its calls, not bandwidth",
        systems=systems,
    )


LOOPS: tuple[Workload, ...] = (
    _rnn_workload("S1", "rnn-scan", "RNN with scan, grads for all weights", rnn_scan_loss,
                  1000, 50, ("fastgrad", "jax")),
    _rnn_workload("S2", "rnn-unrolled", "S1 unrolled in Python", rnn_unrolled_loss,
                  50, 10, ("fastgrad",)),
    _rnn_workload("S3", "deep-rnn", "two-layer RNN cell with scan", deep_rnn_loss,
                  10_000, 100, ("fastgrad", "jax"), note="compare peak mem with S4"),
    _rnn_workload("S4", "deep-rnn-remat", "S3 with the cell checkpointed",
                  deep_rnn_checkpoint_loss, 10_000, 100, ("fastgrad", "jax"),
                  note="compare peak mem with S3"),
    _rnn_workload("S5", "rnn-nested", "S1 as a scan of scans of 10 steps", nested_rnn_loss,
                  1000, 50, ("fastgrad", "jax"), note="T a multiple of 10; compare with S1"),
)  # fmt: skip
# V1: per-example gradients (vmap), against a Python loop over the examples (run when named).
PER_EXAMPLE = Workload(
    key="V1",
    name="per-example",
    title="per-example gradients of a 64-64-10 tanh MLP: jit(vmap(value_and_grad))",
    size_name="batch",
    default_size=1024,
    quick_size=64,
    argnums=(0, 1, 2, 3),
    loss=example_loss,
    make_inputs=per_example_inputs,
    min_bytes=lambda b, isz: b * (PEX_IN + PEX_OUT + PEX_PARAMS) * isz,
    shape=lambda b: f"x: ({b:,}, {PEX_IN}), one gradient of {PEX_PARAMS:,} per example",
    note="fastgrad-loop calls the jitted gradient of one example once per example",
    systems=("fastgrad", "fastgrad-loop", "jax"),
    transform="per_example",
)
OPT_IN: tuple[Workload, ...] = (DASK, *LOOPS, PER_EXAMPLE)


def find(name: str) -> Workload:
    """Look a workload up by key ("W1", "w1") or name ("elementwise")."""
    from .models import MODELS  # defined there on top of this module's losses

    wanted = name.strip().lower()
    for w in WORKLOADS + OPT_IN + MODELS:
        if wanted in (w.key.lower(), w.name):
            return w
    known = ", ".join(f"{w.key} ({w.name})" for w in WORKLOADS + OPT_IN + MODELS)
    raise KeyError(f"unknown workload {name!r}; choose from {known} or the group 'models'")


def select(names: list[str]) -> list[Workload]:
    """The workloads named on the command line, the group "models" standing for all of its
    workloads; every default workload when none is named."""
    from .models import GROUP

    selected: list[Workload] = []
    for name in names:
        group = list(GROUP) if name.strip().lower() == "models" else [find(name)]
        selected += [w for w in group if w not in selected]
    return selected or list(WORKLOADS)
