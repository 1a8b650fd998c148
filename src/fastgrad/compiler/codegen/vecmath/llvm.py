"""LLVM-level building blocks and precision-independent helpers of the vector math.

Numba has no spelling for a float<->int bit cast, a select or a guaranteed fused
multiply-add; these intrinsics emit the single LLVM instruction.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from fastgrad.compiler.machine_code import cached_njit

# Every function is compiled like the generated kernels: numpy error model (x/0 gives
# inf/nan instead of raising) and no fastmath (the algorithms rely on exact IEEE
# rounding, e.g. for the 2Sum error terms). Each one starts with _always_inline() so
# that LLVM inlines it into the calling loop whatever its size: a call left in a loop
# body blocks vectorization, and LLVM's size heuristics decline the trig reduction.
# Inlining at the LLVM level (rather than Numba's inline="always") also keeps these
# instructions free of a caller's fastmath flags and compiles each function only once,
# and its machine code is cached on disk: a new process loads it instead of compiling it
# again for every kernel it builds. Functions built for one precision use `jit_for(F)`.
_jit = cached_njit("shared", error_model="numpy")


def jit_for(F: type) -> Any:
    """The decorator for functions built for float type F (cached apart per precision)."""
    return cached_njit(F.__name__, error_model="numpy")


@intrinsic
def _always_inline(typingctx):
    """Give the function being compiled LLVM's alwaysinline attribute (emits no code)."""

    def codegen(context, builder, sig, args):
        builder.function.attributes.add("alwaysinline")
        return context.get_dummy_value()

    return types.none(), codegen


def _llvm_float(ty: types.Type) -> ir.Type:
    return ir.DoubleType() if ty == types.float64 else ir.FloatType()


@intrinsic
def _bits(typingctx, x):
    """IEEE bit pattern of a float64/float32 as int64 (float32 is sign-extended)."""
    if x not in (types.float64, types.float32):
        return None

    def codegen(context, builder, sig, args):
        if sig.args[0] == types.float64:
            return builder.bitcast(args[0], ir.IntType(64))
        return builder.sext(builder.bitcast(args[0], ir.IntType(32)), ir.IntType(64))

    return types.int64(x), codegen


@intrinsic
def _f64_from_bits(typingctx, i):
    """float64 whose bit pattern is the integer ``i``."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width != 64:
            v = builder.sext(v, ir.IntType(64))
        return builder.bitcast(v, ir.DoubleType())

    return types.float64(i), codegen


@intrinsic
def _f32_from_bits(typingctx, i):
    """float32 whose bit pattern is the low 32 bits of the integer ``i``."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.sext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(i), codegen


@intrinsic
def _low_word(typingctx, x):
    """The low 32 bits of a float64's bit pattern, as an int32: where a shifter's sum
    leaves an integer (float32's trig quadrant), read without 64-bit integer lanes."""
    if x != types.float64:
        return None

    def codegen(context, builder, sig, args):
        return builder.trunc(builder.bitcast(args[0], ir.IntType(64)), ir.IntType(32))

    return types.int32(x), codegen


@intrinsic
def _select(typingctx, cond, a, b):
    """``a if cond else b`` as one LLVM select (no branch, so loops stay vectorizable)."""
    if not isinstance(cond, types.Boolean):
        return None
    # integers (e.g. a literal 0 against an int64) may unify; floats must already match,
    # so a stray float64 can never promote a float32 function
    if a != b and not (isinstance(a, types.Integer) and isinstance(b, types.Integer)):
        return None
    ty = typingctx.unify_types(a, b)
    if ty is None:
        return None

    def codegen(context, builder, sig, args):
        va = context.cast(builder, args[1], sig.args[1], ty)
        vb = context.cast(builder, args[2], sig.args[2], ty)
        return builder.select(args[0], va, vb)

    return ty(cond, a, b), codegen


def _float_intrinsic(llvm_name: str, nargs: int):
    """Typed wrapper for an elementwise LLVM float intrinsic (all args of one float type)."""

    def typer(typingctx, *args):
        if len(args) != nargs or args[0] not in (types.float64, types.float32):
            return None
        if any(a != args[0] for a in args):
            return None

        def codegen(context, builder, sig, llargs):
            fnty = ir.FunctionType(_llvm_float(sig.return_type), [a.type for a in llargs])
            fn = builder.module.declare_intrinsic(llvm_name, [_llvm_float(sig.return_type)], fnty)
            return builder.call(fn, llargs)

        return args[0](*args), codegen

    return typer


# Separate small typers so that Numba sees the right arity for each intrinsic.
@intrinsic
def _fma(typingctx, a, b, c):
    """Correctly rounded a*b+c (llvm.fma): used where exactness matters (error terms)."""
    return _float_intrinsic("llvm.fma", 3)(typingctx, a, b, c)


@intrinsic
def _mad(typingctx, a, b, c):
    """a*b+c, fused when the target has FMA (llvm.fmuladd): for polynomial evaluation."""
    return _float_intrinsic("llvm.fmuladd", 3)(typingctx, a, b, c)


@intrinsic
def _rint(typingctx, x):
    """Round to nearest integer, ties to even (llvm.rint; no int conversion)."""
    return _float_intrinsic("llvm.rint", 1)(typingctx, x)


@intrinsic
def _fabs(typingctx, x):
    return _float_intrinsic("llvm.fabs", 1)(typingctx, x)


@intrinsic
def _copysign(typingctx, x, y):
    return _float_intrinsic("llvm.copysign", 2)(typingctx, x, y)


# --------------------------------------------------------------------------------------
# Helpers shared by both precisions (they only use their arguments' types).
# --------------------------------------------------------------------------------------


@_jit
def _poly(x, c):
    """Horner evaluation of sum(c[i] * x**i); ``c`` is a homogeneous tuple (unrolled)."""
    _always_inline()
    acc = c[len(c) - 1]
    for i in range(len(c) - 2, -1, -1):
        acc = _mad(acc, x, c[i])
    return acc


@_jit
def _two_sum(a, b):
    """s + e == a + b exactly, s = fl(a + b) (Knuth's 2Sum, no magnitude precondition)."""
    _always_inline()
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


@_jit
def _fast_two_sum(a, b):
    """As _two_sum but requires |a| >= |b| or a == 0 (Dekker)."""
    _always_inline()
    s = a + b
    return s, b - (s - a)
