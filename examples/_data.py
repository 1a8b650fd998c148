"""Small data helpers shared by the examples: the digits and iris data sets bundled with
scikit-learn (read from disk, no network), a seeded train/test split, minibatches and
accuracy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np


class Split(NamedTuple):
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def digits(
    n: int | None = None, test_fraction: float = 0.25, seed: int = 0, dtype=np.float32
) -> Split:
    """The 8x8 handwritten digits, pixels scaled to [0, 1], shuffled and split.

    `n` keeps a random subset of that many images (all 1797 when None).
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(dtype)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    if n is not None:
        order = order[:n]
    n_test = int(round(len(order) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Split(x[train], y[train], x[test], y[test])


def iris() -> tuple[np.ndarray, np.ndarray]:
    """The 150 iris flowers: (features in cm, float64, shape (150, 4); species 0..2)."""
    from sklearn.datasets import load_iris

    data = load_iris()
    return data.data.astype(np.float64), data.target.astype(np.int64)


def minibatches(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Index arrays of one shuffled pass over n items, all of exactly `batch_size` items.

    The last partial batch is dropped so every batch has the same shape and a jitted step
    is traced only once.
    """
    order = rng.permutation(n)
    for start in range(0, n - batch_size + 1, batch_size):
        yield order[start : start + batch_size]


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=1) == labels))
