"""Hand-written NumPy forward and backward passes: what a user writes without a library.

Each function takes a workload's inputs and returns (value, gradients), with the
gradients in the order of the workload's argnums. Temporaries are used the natural way.
"""

from __future__ import annotations

import numpy as np


def elementwise(x, y):
    t = np.tanh(x * y + np.sin(x))
    e = np.exp(-y * y)
    r = 1 / (1 + x * x)
    value = np.sum(t * e * r)
    da = (1 - t * t) * e * r  # d value / d (x*y + sin x)
    gx = da * (y + np.cos(x)) - 2 * x * t * e * r * r
    gy = da * x - 2 * y * t * e * r
    return value, (gx, gy)


def softmax_xent(logits, labels):
    rows = np.arange(len(labels))
    z = logits - logits.max(axis=1, keepdims=True)
    ez = np.exp(z)
    s = ez.sum(axis=1, keepdims=True)
    value = np.mean(np.log(s[:, 0]) - z[rows, labels])
    g = ez / s
    g[rows, labels] -= 1
    g /= len(labels)
    return value, (g,)


def logsumexp(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    value = np.sum(np.log(s) + m)
    return value, (e / s,)


def mlp(w1, b1, w2, b2, x, labels):
    h = np.tanh(x @ w1 + b1)
    value, (dlogits,) = softmax_xent(h @ w2 + b2, labels)
    dw2 = h.T @ dlogits
    db2 = dlogits.sum(axis=0)
    dpre = (dlogits @ w2.T) * (1 - h * h)
    dw1 = x.T @ dpre
    db1 = dpre.sum(axis=0)
    return value, (dw1, db1, dw2, db2)


def logistic(w, x, y):
    z = x @ w
    value = np.mean(np.logaddexp(0, z) - y * z)
    r = (1 / (1 + np.exp(-z)) - y) / len(y)
    return value, (x.T @ r,)


IMPLEMENTATIONS = {
    "W1": elementwise,
    "W2": softmax_xent,
    "W3": logsumexp,
    "W4": mlp,
    "W5": elementwise,
    "D1": logistic,
}
