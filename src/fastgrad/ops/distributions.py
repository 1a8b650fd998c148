"""Distributions built from fastgrad.ops.sampling's uniform and normal samples by ops that
fuse and differentiate: gumbel, categorical, truncated_normal, multivariate_normal.

They agree between eager, fused and reference runs to the last few ulps (their logs and
special functions are the vector-math versions in kernels, NumPy's and SciPy's outside).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastgrad.core.tracing import aval_of
from fastgrad.ops.base import astype, broadcast_shapes, shape_tuple
from fastgrad.ops.elementwise import maximum, minimum
from fastgrad.ops.linalg import cholesky
from fastgrad.ops.math import log
from fastgrad.ops.reduction import argmax, sum
from fastgrad.ops.sampling import normal, uniform
from fastgrad.ops.shape import expand_dims, swapaxes
from fastgrad.ops.special import ndtr, ndtri

__all__: list[str] = []  # fastgrad.random lists the public names


def _result_dtype(*xs: Any, dtype: Any = None) -> np.dtype:
    if dtype is not None:
        return np.dtype(dtype)
    floats = [aval_of(x).dtype for x in xs if aval_of(x).dtype.kind == "f" and not aval_of(x).weak]
    return np.dtype(np.result_type(*floats)) if floats else np.dtype(np.float64)


def gumbel(key: Any, shape: Any = (), dtype: Any = np.float64) -> Any:
    """Standard Gumbel floats, -log(-log(u)) for uniform u in (0, 1).

    >>> gumbel(np.array([0, 1], np.uint32), (3,)).shape
    (3,)
    """
    tiny = np.finfo(np.dtype(dtype)).tiny
    return -log(-log(uniform(key, shape, dtype, minval=tiny, maxval=1.0)))


def categorical(key: Any, logits: Any, axis: int = -1, shape: Any = None) -> Any:
    """Indices drawn with probabilities softmax(logits) along `axis` (the Gumbel-max trick);
    `shape` (by default the batch shape, logits' without `axis`) must end with it.

    >>> categorical(np.array([0, 1], np.uint32), np.array([-50.0, 50.0, -50.0]))
    array(1)
    """
    logits_aval = aval_of(logits)
    axis = axis % logits_aval.ndim
    if axis != logits_aval.ndim - 1:
        logits = swapaxes(logits, axis, -1)
    batch = aval_of(logits).shape[:-1]
    shape = batch if shape is None else shape_tuple(shape, "categorical shape")
    if broadcast_shapes(shape, batch, what="categorical shape and logits' batch") != shape:
        raise ValueError(f"categorical: shape {shape} must end with the batch shape {batch}")
    dtype = _result_dtype(logits)
    noise = gumbel(key, (*shape, aval_of(logits).shape[-1]), dtype)
    return argmax(astype(logits, dtype) + noise, axis=-1)


def truncated_normal(key: Any, lower: Any, upper: Any, shape: Any = None, dtype: Any = None) -> Any:
    """Standard normal floats conditioned on [lower, upper], by the inverse CDF of a uniform
    between the bounds' CDFs; differentiable in both bounds.

    >>> x = truncated_normal(np.array([0, 1], np.uint32), -1.0, 0.5, (100,))
    >>> bool((x >= -1).all() and (x <= 0.5).all())
    True
    """
    dtype = _result_dtype(lower, upper, dtype=dtype)
    lower, upper = astype(lower, dtype), astype(upper, dtype)
    if shape is None:
        shape = broadcast_shapes(aval_of(lower).shape, aval_of(upper).shape, what="bounds")
    u = uniform(key, shape, dtype, minval=ndtr(lower), maxval=ndtr(upper))
    # Rounding in the CDF and its inverse may step just outside the bounds: clip.
    return minimum(maximum(ndtri(u), lower), upper)


def multivariate_normal(key: Any, mean: Any, cov: Any, shape: Any = None, dtype: Any = None) -> Any:
    """Normal vectors with mean `mean` (..., n) and covariance `cov` (..., n, n), as
    mean + L z with L the Cholesky factor; `shape` is the batch shape (by default the
    broadcast of mean's and cov's). Differentiable in mean and cov.

    >>> multivariate_normal(np.array([0, 1], np.uint32), np.zeros(2), np.eye(2), (5,)).shape
    (5, 2)
    """
    dtype = _result_dtype(mean, cov, dtype=dtype)
    mean, cov = astype(mean, dtype), astype(cov, dtype)
    n = aval_of(mean).shape[-1:]
    if aval_of(cov).shape[-2:] != n * 2:
        raise ValueError(
            f"multivariate_normal: cov must have shape (..., {n[0]}, {n[0]}) for a mean of "
            f"shape {aval_of(mean).shape}, got {aval_of(cov).shape}"
        )
    if shape is None:
        shape = broadcast_shapes(aval_of(mean).shape[:-1], aval_of(cov).shape[:-2], what="batch")
    z = normal(key, (*shape_tuple(shape, "multivariate_normal shape"), n[0]), dtype)
    return mean + sum(cholesky(cov) * expand_dims(z, -2), axis=-1)
