"""real, imag, conj and angle: NumPy's functions on plain arrays, complex ones included;
on traced values, which are always real (the IR and the loop generator have no complex
dtype), they are what NumPy gives for a real array, with its derivatives.

Differentiating with respect to complex numbers works through their parts: pass the real
and imaginary parts as two real arrays, and `g_re - 1j * g_im` is JAX's gradient.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer
from fastgrad.ops.elementwise import stop_gradient
from fastgrad.ops.math import arctan2
from fastgrad.ops.shape import zeros_like

__all__ = ["angle", "conj", "conjugate", "imag", "real"]


def real(x: Any) -> Any:
    """The real part (NumPy's ``real``); a real traced value is its own real part.

    >>> real(np.array([1 + 2j, 3 - 1j]))
    array([1., 3.])
    """
    return x if isinstance(x, Tracer) else np.real(x)


def imag(x: Any) -> Any:
    """The imaginary part (NumPy's ``imag``); of a real traced value, zeros (a constant).

    >>> imag(np.array([1 + 2j, 3 - 1j]))
    array([ 2., -1.])
    """
    return zeros_like(x) if isinstance(x, Tracer) else np.imag(x)


def conj(x: Any) -> Any:
    """The complex conjugate (NumPy's ``conj``); a real traced value is its own.

    >>> conj(np.array([1 + 2j]))
    array([1.-2.j])
    """
    return x if isinstance(x, Tracer) else np.conj(x)


conjugate = conj


def angle(z: Any, deg: bool = False) -> Any:
    """The argument of complex numbers (NumPy's ``angle``); of a real traced value, pi where
    it is negative (or -0.0) and 0 elsewhere, with no gradient (it is piecewise constant).

    >>> angle(np.array([1j, -1.0]))
    array([1.57079633, 3.14159265])
    """
    if not isinstance(z, Tracer):
        return np.angle(z, deg=deg)
    z = z if z.dtype.kind == "f" else z.astype(np.float64)
    out = stop_gradient(arctan2(zeros_like(z), z))
    return out * (180 / math.pi) if deg else out
