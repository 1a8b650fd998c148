"""The `models` group: whole programs rather than single chains (run when named:
`fastgrad bench models`). Each loss is written once against `ops`, as in workloads.py;
there is no hand-written NumPy version, so results are checked against JAX's.
"""

from __future__ import annotations

import math

import numpy as np

from .workloads import (
    DASK_FEATURES,
    RNN_BATCH,
    RNN_HIDDEN,
    RNN_IN,
    WORKLOADS,
    Workload,
    _normal,
    logistic_inputs,
    logistic_loss,
    rnn_inputs,
    rnn_unrolled_loss,
)

# The systems a model runs on: fastgrad and the compilers it is measured against.
MODEL_SYSTEMS = ("fastgrad", "jax", "torch", "torch-compile")

# ---------------------------------------------------------------- transformer block

SEQ, MODEL_DIM, FF_DIM = 128, 128, 512
GELU_C = math.sqrt(2 / math.pi)


def layer_norm(ops, x, gain):
    mu = ops.mean(x, axis=-1, keepdims=True)
    d = x - mu
    return d / ops.sqrt(ops.mean(d * d, axis=-1, keepdims=True) + 1e-5) * gain


def gelu(ops, x):
    """GELU's tanh form, with its cube as a power."""
    return 0.5 * x * (1 + ops.tanh(GELU_C * (x + 0.044715 * x**3)))


def transformer_loss(ops, wq, wk, wv, wo, w1, w2, g1, g2, x):
    """M2: one pre-norm block (single-head softmax attention, then a GELU MLP), both with
    residuals; the loss is the mean square of the block's output."""
    h = layer_norm(ops, x, g1)
    q, k, v = h @ wq, h @ wk, h @ wv
    s = (q @ ops.swapaxes(k, -1, -2)) * MODEL_DIM**-0.5
    p = ops.exp(s - ops.stop_gradient(ops.max(s, axis=-1, keepdims=True)))
    p = p / ops.sum(p, axis=-1, keepdims=True)
    x = x + (p @ v) @ wo
    x = x + gelu(ops, layer_norm(ops, x, g2) @ w1) @ w2
    return ops.mean(x * x)


def transformer_inputs(batch, dtype, rng):
    d, f = MODEL_DIM, FF_DIM
    weights = [_normal(rng, (d, d), dtype, scale=d**-0.5) for _ in range(4)]
    return (
        *weights,
        _normal(rng, (d, f), dtype, scale=d**-0.5),
        _normal(rng, (f, d), dtype, scale=f**-0.5),
        np.ones(d, dtype),
        np.ones(d, dtype),
        _normal(rng, (batch, SEQ, d), dtype),
    )


def _transformer_flops(batch):
    d, f, rows = MODEL_DIM, FF_DIM, batch * SEQ
    forward = 2 * rows * (4 * d * d + 2 * d * f) + 2 * 2 * batch * SEQ * SEQ * d
    return 3 * forward  # backward: about twice the forward's matmuls


# ---------------------------------------------------------------- Hessian-vector product


def hvp_function(ops, x):
    """M3's function: elementwise, with transcendentals and a fourth power."""
    return ops.sum(ops.tanh(x) * ops.sin(x) + 0.1 * x**4 + ops.exp(-0.5 * x * x))


def hvp_inputs(n, dtype, rng):
    return _normal(rng, n, dtype), _normal(rng, n, dtype)


# ---------------------------------------------------------------- mixture model

COMPONENTS, MIX_DIM = 8, 2


def mixture_nll(ops, means, log_scales, logits, x):
    """M4: mean negative log-likelihood of a diagonal Gaussian mixture; the (N, K, D)
    intermediate is reduced over its leading axis in the backward pass."""
    z = (x[:, None, :] - means) * ops.exp(-log_scales)
    log_norm = ops.sum(log_scales, axis=-1) + 0.5 * MIX_DIM * math.log(2 * math.pi)
    components = -0.5 * ops.sum(z * z, axis=-1) - log_norm
    log_weights = logits - ops.logsumexp(logits, axis=0)
    return -ops.mean(ops.logsumexp(components + log_weights, axis=-1))


def mixture_inputs(n, dtype, rng):
    centres = _normal(rng, (COMPONENTS, MIX_DIM), dtype, scale=3.0)
    x = centres[rng.integers(0, COMPONENTS, n)] + _normal(rng, (n, MIX_DIM), dtype)
    return (
        _normal(rng, (COMPONENTS, MIX_DIM), dtype, scale=2.0),
        _normal(rng, (COMPONENTS, MIX_DIM), dtype, scale=0.1),
        _normal(rng, COMPONENTS, dtype, scale=0.1),
        x.astype(dtype),
    )


# ---------------------------------------------------------------- the group

_MODEL_NOTE = "checked against JAX (no hand-written NumPy version)"

MODELS: tuple[Workload, ...] = (
    Workload(
        key="M1",
        name="rnn",
        title=f"tanh RNN, Python loop of T steps (batch {RNN_BATCH}, hidden {RNN_HIDDEN}, "
        f"input {RNN_IN}), grads for the weights",
        size_name="T",
        default_size=50,
        quick_size=5,
        argnums=(0, 1, 2),
        loss=rnn_unrolled_loss,
        make_inputs=rnn_inputs,
        min_bytes=lambda t, isz: (t * RNN_BATCH * RNN_IN + 2 * RNN_HIDDEN**2) * isz,
        shape=lambda t: f"xs: ({t:,}, {RNN_BATCH}, {RNN_IN}), hidden {RNN_HIDDEN}",
        flops=lambda t: 3 * 2 * t * RNN_BATCH * RNN_HIDDEN * (RNN_IN + RNN_HIDDEN),
        note="small steps: time is dispatch and matmuls; " + _MODEL_NOTE,
        systems=MODEL_SYSTEMS,
    ),
    Workload(
        key="M2",
        name="transformer",
        title=f"transformer block: layer norm, attention, layer norm, GELU MLP "
        f"(seq {SEQ}, dim {MODEL_DIM}, ff {FF_DIM}), grads for all parameters",
        size_name="batch",
        default_size=8,
        quick_size=1,
        argnums=tuple(range(8)),
        loss=transformer_loss,
        make_inputs=transformer_inputs,
        min_bytes=lambda b, isz: (
            (2 * b * SEQ * MODEL_DIM + 2 * (4 * MODEL_DIM**2 + 2 * MODEL_DIM * FF_DIM)) * isz
        ),
        shape=lambda b: f"x: ({b:,}, {SEQ}, {MODEL_DIM})",
        flops=_transformer_flops,
        note=_MODEL_NOTE,
        systems=MODEL_SYSTEMS,
    ),
    Workload(
        key="M3",
        name="hvp",
        title="Hessian-vector product (forward over reverse) of "
        "sum(tanh x sin x + 0.1 x^4 + exp(-x^2/2))",
        size_name="N",
        default_size=10**6,
        quick_size=10**4,
        argnums=(0,),
        loss=hvp_function,
        make_inputs=hvp_inputs,
        min_bytes=lambda n, isz: 3 * n * isz,
        shape=lambda n: f"x, v: ({n:,})",
        note="the value and the HVP are checked; " + _MODEL_NOTE,
        systems=MODEL_SYSTEMS,
        transform="hvp",
    ),
    Workload(
        key="M4",
        name="mixture",
        title=f"Gaussian mixture negative log-likelihood, {COMPONENTS} components in "
        f"{MIX_DIM}-D, grads for means, scales and weights",
        size_name="N",
        default_size=10**6,
        quick_size=10**4,
        argnums=(0, 1, 2),
        loss=mixture_nll,
        make_inputs=mixture_inputs,
        min_bytes=lambda n, isz: n * MIX_DIM * isz,
        shape=lambda n: f"x: ({n:,}, {MIX_DIM}), {COMPONENTS} components",
        note=_MODEL_NOTE,
        systems=MODEL_SYSTEMS,
    ),
    Workload(
        key="M5",
        name="logistic",
        title="full-batch logistic-regression gradient",
        size_name="rows",
        default_size=10**6,
        quick_size=10**4,
        argnums=(0,),
        loss=logistic_loss,
        make_inputs=logistic_inputs,
        min_bytes=lambda r, isz: r * (DASK_FEATURES + 1) * isz + 2 * DASK_FEATURES * isz,
        shape=lambda r: f"x: ({r:,}, {DASK_FEATURES}), y: ({r:,},)",
        note=_MODEL_NOTE,
        systems=MODEL_SYSTEMS,
    ),
)

# `fastgrad bench models`: the MLP training step (W4) and the models above.
GROUP = (next(w for w in WORKLOADS if w.key == "W4"), *MODELS)
