"""scipy.special's logsumexp, softmax and log_softmax: sums of exponentials computed
stably, by shifting the terms by their largest (a shift that carries no gradient). Public
under fastgrad.scipy.special."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, broadcast_shapes, broadcast_to, normalize_axis, sum
from fastgrad.ops.elementwise import abs, isfinite, logical_or, sign, stop_gradient, where
from fastgrad.ops.math import exp, log
from fastgrad.ops.reduction import max
from fastgrad.ops.shape import squeeze
from fastgrad.ops.special import quiet

__all__: list[str] = []  # public under fastgrad.scipy.special


def _shift(a: Any, axes: tuple[int, ...], b: Any = None) -> Any:
    """The largest term over `axes` (leaving out terms weighted by b == 0), kept as axes of
    size 1 and stop_gradient'ed: subtracting it changes no value, so no gradient needs to
    flow through it. 0 where it is not finite, or the axes are empty."""
    shape = aval_of(a).shape
    if not all(shape[i] for i in axes):
        return 0.0
    candidates = a if b is None else where(b != 0, a, -np.inf)
    shift = stop_gradient(max(candidates, axis=axes, keepdims=True))
    return where(isfinite(shift), shift, 0.0)


def _float_operand(x: Any) -> Any:
    x = x if isinstance(x, Tracer) else np.asarray(x)
    return x if aval_of(x).dtype.kind == "f" else astype(x, np.float64)


@quiet
def logsumexp(
    a: Any, axis: Any = None, b: Any = None, keepdims: bool = False, return_sign: bool = False
) -> Any:
    """log(sum(b * exp(a))) over `axis`, computed stably (SciPy's signature).

    `b` weights the terms (broadcast against `a`; terms with b == 0 are left out of the
    shift). With `return_sign=True` returns (log|sum|, sign of the sum); otherwise a
    negative sum gives NaN, as in SciPy. Empty axes give -inf.

    >>> float(logsumexp(np.array([1000.0, 1000.0])))
    1000.6931471805599
    >>> logsumexp(np.array([1.0, 2.0]), b=np.array([1.0, -1.0]), return_sign=True)[1]
    array(-1.)
    """
    a = _float_operand(a)
    if b is not None:
        b = _float_operand(b)
        shape = broadcast_shapes(aval_of(a).shape, aval_of(b).shape, what="logsumexp a and b")
        a = broadcast_to(a, shape)
    axes = normalize_axis(axis, aval_of(a).ndim)
    shift = _shift(a, axes, b)
    terms = exp(a - shift)
    if b is not None:
        # A term that overflows where b == 0 is left out (0 * inf would be NaN), as SciPy does.
        terms = where(logical_or(b != 0, isfinite(terms)), terms, 0.0) * b
    total = sum(terms, axis=axes, keepdims=True)
    if return_sign:
        out, sign_out = log(abs(total)) + shift, sign(total)
    else:
        out, sign_out = log(total) + shift, None
    if not keepdims:
        out = squeeze(out, axes)
        sign_out = None if sign_out is None else squeeze(sign_out, axes)
    return (out, sign_out) if return_sign else out


@quiet
def softmax(x: Any, axis: Any = None) -> Any:
    """exp(x) / sum(exp(x)) over `axis` (all axes by default, as in SciPy).

    >>> softmax(np.array([0.0, np.log(3.0)]))
    array([0.25, 0.75])
    """
    x = _float_operand(x)
    axes = normalize_axis(axis, aval_of(x).ndim)
    terms = exp(x - _shift(x, axes))
    return terms / sum(terms, axis=axes, keepdims=True)


@quiet
def log_softmax(x: Any, axis: Any = None) -> Any:
    """x - logsumexp(x) over `axis` (all axes by default, as in SciPy).

    >>> log_softmax(np.array([0.0, np.log(3.0)]))
    array([-1.38629436, -0.28768207])
    >>> fg.grad(lambda x: log_softmax(x)[0])(np.zeros(2))
    array([ 0.5, -0.5])
    """
    x = _float_operand(x)
    return x - logsumexp(x, axis, keepdims=True)
