"""Gamma samples (fg.random.gamma, and beta and dirichlet built on them): Marsaglia and
Tsang's rejection sampler run per element inside fused loops (fastgrad.ops.threefry), with
the implicit reparameterization gradient in the shape parameter: a sample z of Gamma(a)
moves with a as the quantile of its CDF level does, dz/da = -(dF/da) / (dF/dz).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, register
from fastgrad.core.tracing import aval_of, bind
from fastgrad.ops import threefry
from fastgrad.ops.base import astype, batch_stacked, broadcast_shapes, broadcast_to, sum
from fastgrad.ops.elementwise import floor, where
from fastgrad.ops.math import log, sigmoid
from fastgrad.ops.reduction import softmax
from fastgrad.ops.sampling import check_key, key_arg, positional, random_bits, sample_shape, split
from fastgrad.ops.special import digamma

__all__: list[str] = []  # fastgrad.random lists the public names

# dF/da by a central difference with one Richardson step, at steps that follow F's scale in
# a (a for small a, sqrt(a) for large): about 1e-9 relative error against mpmath over
# a in [0.01, 1e6], in both tails (tests/test_random.py checks it).
_STEP = 2.0**-10
_STEP2 = 2.0**-6  # second differences: rounding grows as the step's square shrinks


def _gamma_eval(key: Aval, a: Aval, *, shape: tuple[int, ...], dtype: np.dtype) -> Aval:
    check_key(key)
    if a.shape != shape or a.dtype != dtype:
        raise TypeError(f"gamma: a must be {dtype.name}{list(shape)}, got {a}")
    return Aval(shape, dtype)


def _gamma_impl(key: np.ndarray, a: np.ndarray, *, shape: tuple[int, ...], dtype: Any) -> Any:
    name = "gamma_f64" if dtype == np.float64 else "gamma_f32"
    return threefry.sample_array(name, key, shape, dtype, np.asarray(a, dtype))


def _gamma_vjp(g: Any, out: Any, key: Any, a: Any, **_: Any) -> tuple[Any, Any]:
    return None, g * bind(RANDOM_GAMMA_GRAD, a, out)


def _gamma_jvp(tangents: Any, out: Any, key: Any, a: Any, **_: Any) -> Any:
    ta = tangents[1]
    return None if ta is None else ta * bind(RANDOM_GAMMA_GRAD, a, out)


RANDOM_GAMMA = positional(
    "random_gamma",
    _gamma_impl,
    "gamma_{T}({K0}, {K1}, {I}, {1})",
    ("gamma_f64", "gamma_f32"),
    abstract_eval=_gamma_eval,
    vjp=_gamma_vjp,
    jvp=_gamma_jvp,
    domain=("key", "positive"),
)


def _differences_in_a(
    a: np.ndarray, z: np.ndarray, step: float, weights: tuple[float, float, float], order: int
) -> np.ndarray:
    """The `order`-th derivative in a of F(a, z) (the regularized lower incomplete gamma
    function), divided by dF/dz: a central difference sum_k weights[k] F(a + (k - 1) h) /
    h^order with one Richardson step, h = step * min(a, sqrt(a)) (F's scale in a), F as
    SciPy's P or, in the upper tail, -Q (for accuracy there). 0 where z = 0 (a sample that
    underflowed)."""
    import scipy.special as sp  # here: importing SciPy costs more than importing fastgrad

    a64, z64 = np.asarray(a, np.float64), np.asarray(z, np.float64)
    with np.errstate(all="ignore"):
        lower = sp.gammainc(a64, z64) < 0.5

        def difference(h: np.ndarray) -> np.ndarray:
            total = 0.0 * a64
            for k, w in enumerate(weights):
                if w:
                    b = a64 + (k - 1) * h
                    total = total + w * np.where(lower, sp.gammainc(b, z64), -sp.gammaincc(b, z64))
            return total / h**order

        h = np.minimum(a64, np.sqrt(a64)) * step
        derivative = (4.0 * difference(h / 2.0) - difference(h)) / 3.0
        log_df_dz = (a64 - 1.0) * np.log(z64) - z64 - sp.gammaln(a64)
        out = np.where(z64 > 0.0, derivative * np.exp(-log_df_dz), 0.0)
    return out.astype(np.result_type(a, z))


def _sample_grad(a: np.ndarray, z: np.ndarray) -> np.ndarray:
    """dz/da for samples z of Gamma(a): -(dF/da) / (dF/dz)."""
    return -_differences_in_a(a, z, _STEP, (-0.5, 0.0, 0.5), 1)


def _second_partial(a: np.ndarray, z: np.ndarray) -> np.ndarray:
    """(d^2F/da^2) / (dF/dz), the one second partial of F(a, z) with no closed form (about
    1e-6 relative error against mpmath)."""
    return _differences_in_a(a, z, _STEP2, (1.0, -2.0, 1.0), 2)


def _no_third_order(*_: Any, **__: Any) -> Any:
    raise NotImplementedError(
        "fg.random.gamma (and beta, dirichlet) has first and second derivatives in its "
        "shape parameter; a third derivative in it is not implemented"
    )


def _of_a_and_z(name: str, impl: Any, vjp: Any, jvp: Any) -> Primitive:
    """A record of (a, z), a gamma sample's shape parameter and the sample: elementwise
    NumPy over SciPy, so it runs outside fused loops."""
    return register(
        Primitive(
            name,
            lambda a, z: Aval(z.shape, z.dtype),
            impl,
            vjp=vjp,
            jvp=jvp,
            batch=batch_stacked(name),
            kind="other",
            domain=("positive", "positive"),
        )
    )


RANDOM_GAMMA_GRAD2 = _of_a_and_z(
    "random_gamma_grad2", _second_partial, _no_third_order, _no_third_order
)


def _grad_partials(g: Any, a: Any, z: Any) -> tuple[Any, Any]:
    """The partials of g(a, z) = -(dF/da) / (dF/dz) (g: the sample's dz/da): with
    dF/dz = z^(a-1) e^-z / Gamma(a), d(dF/dz)/da = (ln z - digamma(a)) dF/dz and
    d(dF/dz)/dz = ((a - 1) / z - 1) dF/dz, the quotient rule gives
    dg/dz = -(ln z - digamma(a)) - g ((a - 1) / z - 1) and
    dg/da = -(d^2F/da^2) / (dF/dz) - g (ln z - digamma(a)). Both 0 where z underflowed."""
    live = z > 0.0
    safe = where(live, z, 1.0)
    level = log(safe) - digamma(a)
    dg_dz = 0.0 - level - g * ((a - 1.0) / safe - 1.0)
    dg_da = 0.0 - bind(RANDOM_GAMMA_GRAD2, a, z) - g * level
    return where(live, dg_da, 0.0), where(live, dg_dz, 0.0)


def _grad_vjp(ct: Any, out: Any, a: Any, z: Any) -> tuple[Any, Any]:
    dg_da, dg_dz = _grad_partials(out, a, z)
    return ct * dg_da, ct * dg_dz


def _grad_jvp(tangents: Any, out: Any, a: Any, z: Any) -> Any:
    dg_da, dg_dz = _grad_partials(out, a, z)
    ta, tz = tangents
    terms = [t * d for t, d in ((ta, dg_da), (tz, dg_dz)) if t is not None]
    return None if not terms else terms[0] if len(terms) == 1 else terms[0] + terms[1]


RANDOM_GAMMA_GRAD = _of_a_and_z("random_gamma_grad", _sample_grad, _grad_vjp, _grad_jvp)

# ---------------------------------------------------------------- distributions


def _dtype_of(*xs: Any, dtype: Any = None) -> np.dtype:
    if dtype is not None:
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {dtype.name}")
        return dtype
    kinds = [aval_of(x) for x in xs]
    floats = [k.dtype for k in kinds if k.dtype.kind == "f" and not k.weak]
    return np.dtype(np.result_type(*floats)) if floats else np.dtype(np.float64)


def gamma(key: Any, a: Any, shape: Any = None, dtype: Any = None) -> Any:
    """Gamma(a, 1) floats (scale them for other scales), broadcast with `shape` (by default
    a's shape); NaN where a is not positive. Differentiable in a (to second order) by
    implicit reparameterization. Below a = 1 samples are Gamma(a + 1) times u^(1/a), which
    underflows to 0 with probability about exp(-745 a) (small a).

    >>> z = gamma(np.array([0, 1], np.uint32), 2.0, (10000,))
    >>> bool(abs(z.mean() - 2.0) < 0.1)
    True
    """
    dtype = _dtype_of(a, dtype=dtype)
    a = astype(a, dtype)
    shape = aval_of(a).shape if shape is None else sample_shape(shape)
    if broadcast_shapes(shape, aval_of(a).shape, what="gamma's shape and a") != shape:
        raise ValueError(f"gamma: shape {shape} must be a broadcast of a's {aval_of(a).shape}")
    return bind(RANDOM_GAMMA, key_arg(key), broadcast_to(a, shape), shape=shape, dtype=dtype)


def _log_boosted(key: Any, a: Any) -> Any:
    """ln (float64) of gamma(key, a)'s samples where a < 1, with no underflow: such a
    sample is G u^(1/a), G the sample of gamma(key, a + 1) (the same trials: the kernel
    adds 1 to a in float64 too) and u the uniform of block (GAMMA_STREAM, i), so its ln is
    ln G + ln(u) / a, finite however small a is."""
    shape = aval_of(a).shape
    a = astype(a, np.float64)
    words = astype(random_bits(key, (*shape, 2), stream=threefry.GAMMA_STREAM), np.float64)
    top = words[..., 0] * 2.0**21 + floor(words[..., 1] * 2.0**-11)  # 53 bits, as the kernel's
    log_u = log(2.0**53 - top) - 53.0 * math.log(2.0)
    return log(gamma(key, a + 1.0)) + log_u / a


def _log_sample(key: Any, a: Any, x: Any, tiny: Any) -> Any:
    """ln x for x = gamma(key, a) where `tiny` (else a placeholder): in log space where
    a < 1 (only there can x underflow)."""
    boosted = tiny & (a < 1.0)
    plain = tiny & (a >= 1.0)
    log_x = log(astype(where(plain, x, 1.0), np.float64))
    return where(boosted, _log_boosted(key, where(boosted, a, 0.5)), log_x)


def beta(key: Any, a: Any, b: Any, shape: Any = None, dtype: Any = None) -> Any:
    """Beta(a, b) floats, x / (x + y) for x, y of Gamma(a) and Gamma(b), broadcast with
    `shape` (by default the broadcast of a's and b's); differentiable in a and b. Where both
    gamma underflows (a or b below about 0.1) the same samples are taken in log space (the
    ratio then rounds as it should; eager and jitted may differ in its last bit there).

    >>> x = beta(np.array([0, 1], np.uint32), 2.0, 3.0, (10000,))
    >>> bool(abs(x.mean() - 0.4) < 0.02)
    True
    """
    dtype = _dtype_of(a, b, dtype=dtype)
    if shape is None:
        shape = broadcast_shapes(aval_of(a).shape, aval_of(b).shape, what="a and b")
    shape = sample_shape(shape)
    a, b = broadcast_to(astype(a, dtype), shape), broadcast_to(astype(b, dtype), shape)
    ka, kb = split(key)
    x, y = gamma(ka, a, shape, dtype), gamma(kb, b, shape, dtype)
    smallest = np.finfo(dtype).tiny  # below it a sample has lost precision, or is 0
    tiny = (x < smallest) | (y < smallest)
    ratio = where(tiny, 1.0, x) / where(tiny, 2.0, x + y)  # 1 / 2 where unused: no 0 / 0
    logit = _log_sample(ka, a, x, tiny) - _log_sample(kb, b, y, tiny)
    return where(tiny, astype(sigmoid(logit), dtype), ratio)


def dirichlet(key: Any, alpha: Any, shape: Any = None, dtype: Any = None) -> Any:
    """Dirichlet(alpha) vectors (alpha of shape (..., k)): gammas normalized along the last
    axis. `shape` is the batch shape (by default alpha's without its last axis); the result
    has shape shape + (k,). Differentiable in alpha. A row where a gamma underflows (alpha
    below about 0.1) is normalized in log space, from the same samples (as beta does): no
    NaN however small alpha is (eager and jitted may differ in the last bit there).

    >>> x = dirichlet(np.array([0, 1], np.uint32), np.array([1.0, 2.0, 3.0]), (5,))
    >>> x.shape, bool(np.allclose(x.sum(axis=-1), 1.0))
    ((5, 3), True)
    """
    dtype = _dtype_of(alpha, dtype=dtype)
    alpha_shape = aval_of(alpha).shape
    if len(alpha_shape) == 0:
        raise ValueError("dirichlet: alpha must have at least one axis (the categories)")
    batch = alpha_shape[:-1] if shape is None else sample_shape(shape)
    full = (*batch, alpha_shape[-1])
    alpha = broadcast_to(astype(alpha, dtype), full)
    g = gamma(key, alpha, full, dtype)
    # A row with a gamma below the smallest normal float lost precision there (all alpha
    # below ~0.01: every gamma 0, and 0 / 0): such rows take softmax(ln g), ln g from the
    # same trials without underflow. Each branch is safe where it is not selected.
    below = astype(g < np.finfo(dtype).tiny, dtype)
    tiny = broadcast_to(sum(below, axis=-1, keepdims=True) > 0.0, full)
    total = sum(g, axis=-1, keepdims=True)
    ratio = g / where(total > 0.0, total, 1.0)
    normalized = softmax(_log_sample(key, alpha, g, tiny), axis=-1)
    return where(tiny, astype(normalized, dtype), ratio)
