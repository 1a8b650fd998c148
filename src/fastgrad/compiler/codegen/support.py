"""Scalar helpers that generated kernels call, compiled inline into their loops, and the
compiler kernels are compiled with (`NoAlias`).

`radd` is an addition that LLVM may reassociate: only reduction accumulators use it, so
their loops vectorize (with several partial sums), while every other operation keeps
strict IEEE semantics. rmax/rmin are the same for max/min reductions, whose callers track
NaNs on the side; nmax/nmin propagate NaN themselves, for accumulators kept in arrays.
maximum/minimum propagate NaN as NumPy's do, with selects rather than branches.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.compiler import Compiler
from numba.extending import intrinsic, overload

f32 = np.float32
f64 = np.float64
_inline = numba.njit(error_model="numpy", inline="always")


class NoAlias(Compiler):
    """Numba's compiler, with the kernel's pointer arguments (its arrays' data among them)
    marked noalias: a kernel never writes memory it reads through another argument (its
    outputs are fresh, or buffers whose spans miss its inputs', runtime.executable._spans).
    Without it LLVM guarded each vectorized loop storing an output with a run-time check
    that the output starts at least a vector body's bytes (VF x unroll: 256 on AVX-512)
    past each input, and ran the scalar loop where it did not: a float32 sum in that loop
    (its `radd` reassociates) then added in another order, and the bits depended on where
    the arrays sat. A loss over 20 float32 elements came out 2 ulp apart with its
    gradient written 0-168 bytes past its input or elsewhere: the step runner's first
    call against the LOOP's, once in CI (tests/test_determinism.py, short sizes)."""

    def __init__(self, typingctx, targetctx, library, args, return_type, flags, locals):  # type: ignore[no-untyped-def]
        flags = flags.copy()
        flags.noalias = True
        super().__init__(typingctx, targetctx, library, args, return_type, flags, locals)


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


def _intrinsic(llvm_name: str, fastmath: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """A float (a, b) -> float function calling the LLVM intrinsic `llvm_name`."""

    @intrinsic
    def call(typingctx, a, b):  # type: ignore[no-untyped-def]
        if a != b or a not in (types.float64, types.float32):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            ty = args[0].type
            suffix = "f64" if ty == ir.DoubleType() else "f32"
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ty, [ty, ty]), f"{llvm_name}.{suffix}"
            )
            return builder.call(fn, args, fastmath=fastmath)

        return a(a, b), codegen

    return call


# No-NaN and no-signed-zero flags let LLVM vectorize the reduction; callers track NaNs
# separately and discard the result when one was seen.
rmax = _intrinsic("llvm.maxnum", ("nnan", "nsz"))
rmin = _intrinsic("llvm.minnum", ("nnan", "nsz"))


# NaN if either is NaN (IEEE 754-2019 maximum/minimum; -0.0 below 0.0): for accumulators
# that carry nothing from one iteration to the next (one per column), where they vectorize
# as a few instructions, 1.5x faster than maximum's compare-and-select (measured on
# 3.2e6 float32 into 64 accumulators).
nmax = _intrinsic("llvm.maximum")
nmin = _intrinsic("llvm.minimum")


def flat(a):  # type: ignore[no-untyped-def]
    """`a` as a 1-D C-order array: a view when `a` is C-contiguous (outputs always are:
    writes through it land in `a`), else a copy (inputs only)."""
    return np.ascontiguousarray(a).reshape(-1)


@overload(flat, inline="always")
def _flat(a):  # type: ignore[no-untyped-def]
    if isinstance(a, types.Array) and a.layout == "C":
        return lambda a: a.reshape(-1)
    return lambda a: np.ascontiguousarray(a).reshape(-1)


@_inline
def maximum(a, b):  # type: ignore[no-untyped-def]
    return a if (a > b) | (a != a) else b


@_inline
def minimum(a, b):  # type: ignore[no-untyped-def]
    return a if (a < b) | (a != a) else b
