"""Scalar helpers that generated kernels call, compiled inline into their loops.

`radd` is an addition that LLVM may reassociate: only reduction accumulators use it, so
their loops vectorize (with several partial sums), while every other operation keeps
strict IEEE semantics. maximum/minimum propagate NaN as NumPy's do, with selects rather
than branches.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

f32 = np.float32
f64 = np.float64
_inline = numba.njit(error_model="numpy", inline="always")


@intrinsic
def radd(typingctx, a, b):  # type: ignore[no-untyped-def]
    """a + b, marked reassociable for floats (vectorizable reductions)."""
    if a != b:
        return None
    if a in (types.float64, types.float32):

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return builder.fadd(args[0], args[1], flags=("reassoc",))

        return a(a, b), codegen
    if isinstance(a, types.Integer):

        def codegen_int(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return builder.add(args[0], args[1])

        return a(a, b), codegen_int
    return None


@_inline
def maximum(a, b):  # type: ignore[no-untyped-def]
    return a if (a > b) | (a != a) else b


@_inline
def minimum(a, b):  # type: ignore[no-untyped-def]
    return a if (a < b) | (a != a) else b
