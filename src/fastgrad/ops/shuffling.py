"""Random orders and draws from a population (fg.random.permutation, choice): a stable
argsort of random sort keys, so a key gives the same order on every path. Keys are 53-bit
uniforms (a tie, probability below n^2 / 2^54, keeps the original order), and for draws
without replacement weighted by p, exponential races E_i / p_i.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, normalize_axis, reshape
from fastgrad.ops.cumulative import cumsum
from fastgrad.ops.sampling import exponential, randint, sample_shape, uniform
from fastgrad.ops.selection import take, take_along_axis
from fastgrad.ops.sorting import argsort, searchsorted

__all__: list[str] = []  # fastgrad.random lists the public names


def _population(x: Any, axis: int, what: str) -> tuple[Any, int, int]:
    """(array or None for an int, its length along axis, the normalized axis)."""
    if isinstance(x, int | np.integer):
        n = operator.index(x)
        if n < 0:
            raise ValueError(f"{what}: an integer population must be >= 0, got {n}")
        return None, n, 0
    if not isinstance(x, Tracer):
        x = np.asarray(x)
    shape = aval_of(x).shape
    if not shape:
        raise ValueError(f"{what}: x must be an int or an array with at least one axis")
    axis = normalize_axis(operator.index(axis), len(shape), f"{what} axis")[0]
    return x, shape[axis], axis


def _order(key: Any, n: int) -> Any:
    return argsort(uniform(key, (n,), np.float64), kind="stable")


def permutation(key: Any, x: Any, axis: int = 0, independent: bool = False) -> Any:
    """A random permutation of range(x) for an int `x`, or of the slices of array `x` along
    `axis` (with `independent`, each 1-D slice along `axis` shuffled on its own).
    Differentiable in `x`.

    >>> sorted(permutation(np.array([0, 1], np.uint32), 5).tolist())
    [0, 1, 2, 3, 4]
    """
    array, n, axis = _population(x, axis, "permutation")
    if array is None:
        return _order(key, n)
    if independent:
        keys = uniform(key, aval_of(array).shape, np.float64)
        return take_along_axis(array, argsort(keys, axis=axis, kind="stable"), axis)
    return take(array, _order(key, n), axis=axis)


def choice(
    key: Any, a: Any, shape: Any = (), replace: bool = True, p: Any = None, axis: int = 0
) -> Any:
    """Draws from range(a) for an int `a`, or from the slices of array `a` along `axis`, of
    `shape` (the drawn axis replaced by `shape`), with replacement or not, uniformly or
    with probabilities proportional to `p` (1-D, one weight per slice; without replacement
    a draw of more than p's nonzero entries includes zero-weight ones). Differentiable in
    `a`.

    >>> choice(np.array([0, 1], np.uint32), 3, (4,), p=np.array([0.0, 1.0, 0.0])).tolist()
    [1, 1, 1, 1]
    """
    array, n, axis = _population(a, axis, "choice")
    shape = sample_shape(shape)
    size = math.prod(shape)
    if p is not None:
        if aval_of(p).shape != (n,):
            raise ValueError(f"choice: p must have shape ({n},), got {aval_of(p).shape}")
        p = astype(p, np.float64)
    if replace:
        if size and n == 0:
            raise ValueError("choice: cannot draw from an empty population")
        if p is None:
            index = randint(key, shape, 0, n)
        else:
            # The inverse CDF: the normalized CDF ends at exactly 1 > u, so every draw lands
            # in [0, n), and never on a zero-weight entry (an empty step).
            cdf = cumsum(p)
            index = searchsorted(cdf / cdf[-1], uniform(key, shape, np.float64), side="right")
    else:
        if size > n:
            raise ValueError(f"choice: cannot draw {size} of {n} without replacement")
        order = _order(key, n) if p is None else argsort(exponential(key, (n,)) / p, kind="stable")
        index = reshape(order[:size], shape)
    return index if array is None else take(array, index, axis=axis)
