"""Branch-free float64/float32 exp, log, tanh, sin, ... that Numba loops auto-vectorize.

Numba lowers math.exp, np.sin, ... to scalar libm calls, which LLVM cannot vectorize, so
fused elementwise kernels run far below memory bandwidth. These njit functions (range
reduction, polynomial, selects, exponent by bit cast) keep a calling loop SIMD, and match
NumPy to ~1 ulp with its special values. Look them up in FUNCTIONS[(np_name, dtype_name)].
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["FUNCTIONS", "BOUNDED_TRIG", "TRIG_BOUNDED_LIMIT"] + [
    f"{name}_{suffix}"
    for name in ("exp", "expm1", "log", "log1p", "tanh", "sin", "cos", "tan", "sinh", "cosh",
                 "arctan", "sigmoid")
    for suffix in ("f64", "f32")
] + [f"{name}_bounded_{suffix}" for name in ("sin", "cos", "tan") for suffix in ("f64", "f32")]

#: |x| below which the *_bounded trig functions are exact (both dtypes); NaN at and above.
TRIG_BOUNDED_LIMIT = 2.0**30

# Every function is compiled like the generated kernels: numpy error model (x/0 gives
# inf/nan instead of raising) and no fastmath (the algorithms rely on exact IEEE
# rounding, e.g. for the 2Sum error terms). Each one starts with _always_inline() so
# that LLVM inlines it into the calling loop whatever its size: a call left in a loop
# body blocks vectorization, and LLVM's size heuristics decline the trig reduction.
# Inlining at the LLVM level (rather than Numba's inline="always") also keeps these
# instructions free of a caller's fastmath flags and compiles each function only once.
_jit = numba.njit(error_model="numpy")


# --------------------------------------------------------------------------------------
# LLVM-level building blocks. Numba has no spelling for a float<->int bit cast, a select
# or a guaranteed fused multiply-add; these intrinsics emit the single LLVM instruction.
# --------------------------------------------------------------------------------------


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
            fn = builder.module.declare_intrinsic(llvm_name, [_llvm_float(sig.return_type)],
                                                  fnty)
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


# --------------------------------------------------------------------------------------
# Polynomial coefficients. Each tuple is a weighted minimax (Remez exchange) fit, run in
# 50-digit mpmath arithmetic, of the stated "tail" function with the leading Taylor terms
# held fixed; the fit minimises the tail's relative error, and the numbers quoted are the
# resulting relative error of the whole function on the reduced interval after rounding
# the coefficients to the working precision. Lowest degree first.
# --------------------------------------------------------------------------------------


def _coefs(dtype, hexes):
    return tuple(dtype(float.fromhex(h)) for h in hexes)


# exp(r) = 1 + r + r^2 Q(r), |r| <= ln2/2 * (1 + 2^-10).   f64: 2^-55.8, f32: 2^-26.5
_EXP_Q = {
    np.float64: ("0x1.0000000000001p-1", "0x1.555555555554dp-3", "0x1.5555555553d52p-5",
                 "0x1.11111111144eap-7", "0x1.6c16c178941fep-10", "0x1.a01a018c15246p-13",
                 "0x1.a019b8e84b959p-16", "0x1.71de5a5b8cd03p-19", "0x1.2891b56c2b8f1p-22",
                 "0x1.aeab19c80178dp-26"),
    np.float32: ("0x1.0000000000000p-1", "0x1.5554dc0000000p-3", "0x1.5555ba0000000p-5",
                 "0x1.120b980000000p-7", "0x1.6c6a1c0000000p-10"),
}
# expm1(r) = r + r^2/2 + r^3 P(r), same interval.          f64: 2^-58.7, f32: 2^-29.1
_EXPM1_P = {
    np.float64: ("0x1.5555555555556p-3", "0x1.5555555555554p-5", "0x1.11111111109aap-7",
                 "0x1.6c16c16c18145p-10", "0x1.a01a01a7cb8e5p-13", "0x1.a01a01989de42p-16",
                 "0x1.71de0d8fe42b5p-19", "0x1.27e502cd21130p-22", "0x1.af38f50b66005p-26",
                 "0x1.1f2a40df82f0dp-29"),
    np.float32: ("0x1.5555560000000p-3", "0x1.55551a0000000p-5", "0x1.11112c0000000p-7",
                 "0x1.6d11540000000p-10", "0x1.a0893e0000000p-13"),
}
# log(1+f) = 2 atanh(s) = 2s + s z P(z), s = f/(2+f), z = s^2 <= ((sqrt2-1)/(sqrt2+1))^2.
#                                                            f64: 2^-57.6, f32: 2^-28.5
_LOG_P = {
    np.float64: ("0x1.5555555555558p-1", "0x1.999999999523ap-2", "0x1.2492492e03053p-2",
                 "0x1.c71c62cfb659fp-3", "0x1.7462baae08002p-3", "0x1.39fd9dc398b11p-3",
                 "0x1.2b617aeaf3ecdp-3"),
    np.float32: ("0x1.55555c0000000p-1", "0x1.997c160000000p-2", "0x1.2eea320000000p-2"),
}
# sin(r) = r + r z S(z), z = r^2, |r| <= pi/4 + 2^-8.        f64: 2^-55.3, f32: 2^-28.1
_SIN_S = {
    np.float64: ("-0x1.5555555555555p-3", "0x1.1111111110b5ep-7", "-0x1.a01a019e7054ep-13",
                 "0x1.71de377e14545p-19", "-0x1.ae5ff20ac653ep-26", "0x1.5e0243b0bac5bp-33"),
    np.float32: ("-0x1.5555560000000p-3", "0x1.11110e0000000p-7", "-0x1.a013800000000p-13",
                 "0x1.6db1c20000000p-19"),
}
# cos(r) = 1 - z/2 + z^2 C(z), same interval.               f64: 2^-59.5, f32: 2^-30.1
_COS_C = {
    np.float64: ("0x1.5555555555555p-5", "-0x1.6c16c16c1693fp-10", "0x1.a01a019f45864p-16",
                 "-0x1.27e4fa0c2fbb4p-22", "0x1.1eeb5cf15465dp-29", "-0x1.9075219ae3203p-37"),
    np.float32: ("0x1.5555540000000p-5", "-0x1.6c12bc0000000p-10", "0x1.9bcc560000000p-16"),
}
# atan(t) = t + t z P(z), z = t^2, |t| <= tan(pi/8).         f64: 2^-56.9, f32: 2^-28.3
_ATAN_P = {
    np.float64: ("-0x1.5555555555555p-2", "0x1.999999999935ep-3", "-0x1.2492492436e82p-3",
                 "0x1.c71c7185a7e2ap-4", "-0x1.745d0b36ebd9dp-4", "0x1.3b12641d23603p-4",
                 "-0x1.10fa848304024p-4", "0x1.dfe7019768161p-5", "-0x1.a09cac9d15336p-5",
                 "0x1.4169cba1f22c6p-5", "-0x1.3a3efa43b71d0p-6"),
    np.float32: ("-0x1.5555540000000p-2", "0x1.9997360000000p-3", "-0x1.2420c80000000p-3",
                 "0x1.b819e60000000p-4", "-0x1.085eca0000000p-4"),
}

# --------------------------------------------------------------------------------------
# Trigonometric argument reduction tables (Payne-Hanek style, for every exponent).
#
# For |x| = X * 2^(e) with X the integer significand, x * 2/pi mod 4 equals X * T(e) mod 4
# with T(e) = (2^e * 2/pi) mod 4, since X times a multiple of 4 is a multiple of 4. T(e)
# is stored for every exponent as four non-overlapping chunks of m bits (m = significand
# width) covering the binary weights 2^1 .. 2^(2-4m): enough that the reduced argument is
# accurate even for the closest double/float to a multiple of pi/2. Indexing the tables
# by exponent is a gather, so the reduction stays branch-free and vectorizable, and there
# is no "huge argument" fallback: every finite input gets the same accurate path.
# --------------------------------------------------------------------------------------

# Binary expansion of 2/pi (1344 bits after the point), a mathematical constant.
_TWO_OVER_PI_HEX = (
    "a2f9836e4e441529fc2757d1f534ddc0db6295993c439041fe5163abdebbc561b7246e3a424dd2e00649"
    "2eea09d1921cfe1deb1cb129a73ee88235f52ebb4484e99c7026b45f7e413991d639835339f49c845f8b"
    "bdf9283b1ff897ffde05980fef2f118b5a0a6d1f6d367ecf27cb09b74f463f669e5fea2d7527bac7ebe5"
    "f17b3d0739f78a5292ea6bfb5fb11f8d5d0856033046fc7b6babf0cfbc209af4361da9e391615ee61b08"
)
_TWO_OVER_PI_BITS = 4 * len(_TWO_OVER_PI_HEX)
_TWO_OVER_PI_INT = int(_TWO_OVER_PI_HEX, 16)  # 2/pi ~= _TWO_OVER_PI_INT * 2^-1344


def _trig_tables(dtype, mant: int, bias: int, emin: int):
    """Chunks T0..T3 of (2^(E - bias - mant) * 2/pi) mod 4 for biased exponents E >= emin."""
    m = mant + 1  # significand width: 53 / 24
    emax = 2 * bias  # largest finite biased exponent
    tabs = np.zeros((4, emax - emin + 1), dtype=dtype)
    for e_biased in range(emin, emax + 1):
        k = e_biased - bias - mant  # |x| = X * 2^k
        # bits of 2^k * 2/pi with weights 2^1 .. 2^(2-4m), truncated; the integer part
        # above 2^1 is dropped, which is the "mod 4"
        shift = k + (4 * m - 2) - _TWO_OVER_PI_BITS
        v = _TWO_OVER_PI_INT << shift if shift >= 0 else _TWO_OVER_PI_INT >> -shift
        v &= (1 << (4 * m)) - 1
        for j in range(4):
            chunk = (v >> (m * (3 - j))) & ((1 << m) - 1)
            # weight of the chunk's lowest bit: 2^(2 - (j+1)*m)
            tabs[j, e_biased - emin] = dtype(np.ldexp(float(chunk), 2 - (j + 1) * m))
    return tabs


def _build(F):  # noqa: C901 - one closure scope per precision keeps constants typed
    """Create every function for float type F (np.float64 or np.float32).

    All constants are captured as F scalars so that float32 code never sees a float64
    literal (Numba would promote the whole expression to float64).
    """
    f64 = F is np.float64
    from_bits = _f64_from_bits if f64 else _f32_from_bits
    MANT = 52 if f64 else 23  # stored significand bits
    BIAS = 1023 if f64 else 127
    MANT_MASK = (1 << MANT) - 1

    ZERO, HALF, ONE, TWO, FOUR = F(0.0), F(0.5), F(1.0), F(2.0), F(4.0)
    QUARTER = F(0.25)
    INF, NAN = F(np.inf), F(np.nan)
    FMAX = F(np.finfo(F).max)
    TINY_NORMAL = F(np.finfo(F).tiny)
    # Adding then subtracting 1.5 * 2^MANT rounds to an integer (round-to-nearest-even)
    # and leaves that integer in the low bits of the sum's bit pattern.
    SHIFTER = F(1.5 * 2.0**MANT)
    SHIFTER_BITS = int(np.array(SHIFTER).view(np.int64 if f64 else np.int32))

    LOG2E = F(1.4426950408889634)
    # Cody-Waite split of ln2: LN2_HI has few enough bits that n * LN2_HI is exact for
    # every n the reductions produce (|n| < 2^11 / 2^8); LN2_LO is the rounded remainder.
    if f64:
        LN2_HI = F(float.fromhex("0x1.62e42ff000000p-1"))  # ln2 to 32 bits
        LN2_LO = F(float.fromhex("-0x1.718432a1b0e26p-35"))
    else:
        LN2_HI = F(float.fromhex("0x1.62e4000000000p-1"))  # ln2 to 16 bits
        LN2_LO = F(float.fromhex("0x1.7f7d1c0000000p-20"))
    # pi/2 and pi/4 as (rounded, rounded remainder) pairs
    if f64:
        PIO2_HI = F(float.fromhex("0x1.921fb54442d18p+0"))
        PIO2_LO = F(float.fromhex("0x1.1a62633145c07p-54"))
    else:
        PIO2_HI = F(float.fromhex("0x1.921fb60000000p+0"))
        PIO2_LO = F(float.fromhex("-0x1.777a5c0000000p-25"))
    PIO4_HI, PIO4_LO = PIO2_HI * HALF, PIO2_LO * HALF
    TAN_PI_8 = F(0.41421356237309503)  # sqrt(2) - 1
    TAN_3PI_8 = F(2.414213562373095)  # sqrt(2) + 1
    ATAN_BIG = F(2.0 ** (MANT + 8))

    # exp: below EXP_LO the result rounds to +0, above EXP_HI to inf (clamping there keeps
    # the integer exponent small, and the two-step scaling then rounds correctly).
    EXP_LO, EXP_HI = (F(-746.0), F(710.0)) if f64 else (F(-104.0), F(89.0))
    # expm1(x) rounds to -1 below EXPM1_LO.
    EXPM1_LO = F(-64.0) if f64 else F(-32.0)
    # tanh(|x|) rounds to 1 above TANH_SAT (19.1 / 9.01); clamping keeps expm1 in range.
    TANH_SAT = F(22.0) if f64 else F(10.0)
    # sinh/cosh: above HYP_BIG, e^-|x| is below half an ulp of e^|x|, so the result is
    # e^|x| / 2; HYP_HI is past the overflow point (710.48 / 89.4).
    HYP_BIG = F(22.0) if f64 else F(10.0)
    HYP_HI = F(711.0) if f64 else F(90.0)
    # log of subnormals: scale into the normal range first.
    SUBNORMAL_SCALE = F(2.0**MANT * 4.0)  # 2^54 / 2^25
    SUBNORMAL_K = -(MANT + 2)
    SQRT_HALF_BITS = 0x3FE6A09E667F3BCD if f64 else 0x3F3504F3  # bits of sqrt(0.5)
    # trig: below TRIG_TINY, sin x = tan x = x and cos x = 1 after rounding.
    TRIG_TINY = F(2.0**-27) if f64 else F(2.0**-12)
    TRIG_EMIN = BIAS - 27 if f64 else BIAS - 12  # smallest tabulated biased exponent
    TRIG_IMAX = 2 * BIAS - TRIG_EMIN  # table index of the largest finite exponent
    X_BITS = (BIAS + MANT) << MANT  # exponent field that makes the significand an integer

    EXP_Q = _coefs(F, _EXP_Q[F])
    EXPM1_P = _coefs(F, _EXPM1_P[F])
    LOG_P = _coefs(F, _LOG_P[F])
    SIN_S = _coefs(F, _SIN_S[F])
    COS_C = _coefs(F, _COS_C[F])
    ATAN_P = _coefs(F, _ATAN_P[F])

    # 2/pi as truncated (floor) chunks of MANT+1 bits, exact in F, for the bounded
    # reduction; f64 needs three (159 bits), f32 four (~96 bits)
    if f64:
        C2PI = _coefs(F, ("0x1.45f306dc9c882p-1", "0x1.4a7f09d5f47d4p-54",
                          "0x1.a6ee06db14accp-107"))
        C2PI_3 = ZERO  # unused
    else:
        C2PI = _coefs(F, ("0x1.45f3060000000p-1", "0x1.b939100000000p-26",
                          "0x1.529fc20000000p-52"))
        C2PI_3 = F(float.fromhex("0x1.d5f47c0000000p-78"))
    C2PI_0, C2PI_1, C2PI_2 = C2PI
    TRIG_LIMIT = F(TRIG_BOUNDED_LIMIT)
    TAB = _trig_tables(F, MANT, BIAS, TRIG_EMIN)
    TAB0, TAB1, TAB2, TAB3 = (np.ascontiguousarray(TAB[j]) for j in range(4))

    # ---------------------------------------------------------------- integer helpers

    @_jit
    def pow2(k):
        """2^k for k in the normal exponent range, built directly from its bits."""
        _always_inline()
        return from_bits((k + BIAS) << MANT)

    @_jit
    def round_int(v):
        """(float, int) nearest integer to v, for |v| < 2^(MANT-1)."""
        _always_inline()
        t = v + SHIFTER
        return t - SHIFTER, _bits(t) - SHIFTER_BITS

    @_jit
    def int_to_float(k):
        """float(k) for |k| < 2^(MANT-1) without an int->float conversion instruction
        (int64 -> double has no AVX2 instruction)."""
        _always_inline()
        return from_bits(k + SHIFTER_BITS) - SHIFTER

    @_jit
    def div2(nh, nl, dh, dl):
        """(nh + nl) / (dh + dl) as an unevaluated pair, |nl| << |nh|, |dl| << |dh|.

        One division (the reciprocal) plus an FMA residual correction, so the quotient is
        good to well below an ulp instead of accumulating three roundings.
        """
        _always_inline()
        inv = ONE / dh
        q0 = nh * inv
        rem = _fma(-q0, dh, nh) + (nl - q0 * dl)
        return _fast_two_sum(q0, rem * inv)

    # ---------------------------------------------------------------- exp family

    @_jit
    def exp_reduce(x):
        """exp(x) = (ph + pl) * 2^n, ph + pl = exp(r), |r| <= ln2/2; x finite or nan."""
        _always_inline()
        nf, n = round_int(x * LOG2E)
        hi = x - nf * LN2_HI  # exact: nf*LN2_HI is exact, then Sterbenz
        lo = nf * LN2_LO
        r = hi - lo
        c = (hi - r) - lo  # rounding error of r: exp(r + c) ~= exp(r) + c
        ph, pl = _fast_two_sum(ONE, r + _mad(r * r, _poly(r, EXP_Q), c))
        return ph, pl, n

    @_jit
    def scale2(p, n):
        """p * 2^n in two steps, so that n up to +-(2*BIAS+MANT) neither overflows the
        exponent field nor double-rounds: the first product is exact, the second rounds
        once (to inf, a subnormal, or 0 as appropriate)."""
        _always_inline()
        a = n >> 1
        return p * pow2(a) * pow2(n - a)

    @_jit
    def exp(x_in):
        """e**x; overflows to inf above ~709.78 (f32: 88.72), gradual underflow below."""
        _always_inline()
        x = F(x_in)
        xc = _select(x > EXP_HI, EXP_HI, x)
        xc = _select(xc < EXP_LO, EXP_LO, xc)  # nan passes through and propagates
        p, _, n = exp_reduce(xc)
        return scale2(p, n)

    @_jit
    def expm1_reduce(x):
        """expm1(x) = 2^n (r + tail + 1) - 1 with r + tail = expm1(r'), |r| <= ln2/2."""
        _always_inline()
        nf, n = round_int(x * LOG2E)
        hi = x - nf * LN2_HI  # exact
        lo = nf * LN2_LO
        r = hi - lo
        c = (hi - r) - lo  # rounding error of r: expm1(r + c) ~= expm1(r) + c (1 + r)
        z = r * r
        tail = _mad(z, _mad(r, _poly(r, EXPM1_P), HALF), _mad(c, r, c))
        return r, tail, n

    @_jit
    def expm1_combine(r, tail, n):
        """2^n (r + tail) + (2^n - 1) as an unevaluated pair, for n <= BIAS - 1.

        r*2^n is exact, and so is 2^n - 1 for n <= MANT+1; those two are summed exactly,
        leaving one final rounding. For larger n the -1 moves to the low part of that sum,
        which is then an integer and absorbs it exactly.
        """
        _always_inline()
        s = pow2(n)
        big_n = n > MANT + 1
        hi, lo = _two_sum(_select(big_n, s, s - ONE), r * s)
        lo = _select(big_n, lo - ONE, lo)
        return _fast_two_sum(hi, _mad(tail, s, lo))

    @_jit
    def expm1_pair(x):
        """expm1(x) as an unevaluated pair, for x in [EXPM1_LO, (BIAS-1)*ln2]."""
        _always_inline()
        r, tail, n = expm1_reduce(x)
        return expm1_combine(r, tail, n)

    @_jit
    def expm1(x_in):
        """e**x - 1, accurate near 0; -1 for very negative x; keeps the sign of -0.0."""
        _always_inline()
        x = F(x_in)
        xc = _select(x > EXP_HI, EXP_HI, x)
        xc = _select(xc < EXPM1_LO, EXPM1_LO, xc)
        r, tail, n = expm1_reduce(xc)
        hi, lo = expm1_combine(r, tail, n)
        small = hi + lo
        # near overflow 2^n itself is not finite: the -1 is irrelevant there, use scale2
        big = scale2(ONE + (r + tail), n)
        res = _select(n > BIAS - 1, big, small)
        return _select(x == ZERO, x, res)  # keeps the sign of -0.0

    @_jit
    def tanh(x_in):
        """Hyperbolic tangent, odd (tanh(-0.0) = -0.0), +-1 for large |x|."""
        _always_inline()
        x = F(x_in)
        a = _fabs(x)
        a = _select(a > TANH_SAT, TANH_SAT, a)
        # tanh(a) = t / (t + 2) with t = expm1(2a): no cancellation anywhere; t and the
        # quotient are carried with their rounding errors, leaving one final rounding
        th, tl = expm1_pair(a + a)
        dh, dl = _two_sum(TWO, th)
        qh, ql = div2(th, tl, dh, dl + tl)
        return _copysign(qh + ql, x)

    @_jit
    def sinh(x_in):
        """Hyperbolic sine; overflows to +-inf only where e**|x|/2 does."""
        _always_inline()
        x = F(x_in)
        a = _fabs(x)
        am = _select(a > HYP_BIG, HYP_BIG, a)
        th, tl = expm1_pair(am)
        # (e^a - e^-a)/2 = (t + t/(t+1))/2 with t = e^a - 1: all terms positive
        dh, dl = _two_sum(ONE, th)
        qh, ql = div2(th, tl, dh, dl + tl)
        small = HALF * (th + (qh + (tl + ql)))
        ab = _select(a > HYP_HI, HYP_HI, a)
        p, _, n = exp_reduce(ab)
        big = scale2(p, n - 1)  # e^a / 2 without overflowing early
        res = _select(a > HYP_BIG, big, small)
        return _copysign(res, x)

    @_jit
    def cosh(x_in):
        """Hyperbolic cosine; overflows to inf only where e**|x|/2 does."""
        _always_inline()
        x = F(x_in)
        a = _fabs(x)
        ab = _select(a > HYP_HI, HYP_HI, a)
        ph, pl, n = exp_reduce(ab)
        big = scale2(ph, n - 1)  # e^a / 2
        # (e + 1/e) / 2 with e = e^a carried as a pair; the clamp only avoids a garbage
        # exponent in lanes where a > HYP_BIG (their result is `big`)
        s = pow2(_select(n > BIAS - 1, BIAS - 1, n))
        eh = ph * s
        el = pl * s
        ih, il = div2(ONE, ZERO, eh, el)
        small = HALF * (eh + (ih + (el + il)))
        return _select(a > HYP_BIG, big, small)

    @_jit
    def sigmoid(x_in):
        """Logistic 1/(1 + e**-x) without overflow (e**x/(1 + e**x) for x < 0)."""
        _always_inline()
        x = F(x_in)
        # e = exp(-|x|) <= 1 never overflows; 1/(1+e) for x >= 0, e/(1+e) for x < 0.
        # e is carried as a pair and the quotient corrected, leaving one final rounding.
        na = -_fabs(x)
        na = _select(na < EXP_LO, EXP_LO, na)
        ph, pl, n = exp_reduce(na)
        eh = scale2(ph, n)
        el = scale2(pl, n)
        dh, dl = _two_sum(ONE, eh)
        neg = x < ZERO
        qh, ql = div2(_select(neg, eh, ONE), _select(neg, el, ZERO), dh, dl + el)
        return qh + ql

    # ---------------------------------------------------------------- log family

    @_jit
    def log_core(x, kadj, corr):
        """log(x) + kadj*ln2 + corr for positive normal finite x and small corr.

        corr (log1p's rounding correction) joins the small terms before the final two
        additions, so the result is rounded once even when corr cancels part of log(x).
        """
        _always_inline()
        ix = _bits(x)
        # k = floor(log2(x / sqrt(0.5))) exactly: the bit patterns of positive floats
        # are monotonic and adding k to the exponent field multiplies by 2^k
        k = (ix - SQRT_HALF_BITS) >> MANT
        m = from_bits(ix - (k << MANT))  # x / 2^k in [sqrt(0.5), sqrt(2))
        k = k + kadj
        f = m - ONE  # exact (Sterbenz)
        s = f / (TWO + f)
        z = s * s
        r = z * _poly(z, LOG_P)
        hfsq = HALF * f * f
        kf = int_to_float(k)
        # log(1+f) = f - hfsq + s*(hfsq + r): the big terms f and hfsq are exact-ish and
        # added last, k*LN2_HI is exact
        return kf * LN2_HI + (f - (hfsq - _mad(s, hfsq + r, _mad(kf, LN2_LO, corr))))

    @_jit
    def log(x_in):
        """Natural log; log(0) = -inf, log(<0) = nan, subnormals handled."""
        _always_inline()
        x = F(x_in)
        sub = x < TINY_NORMAL
        xs = _select(sub, x * SUBNORMAL_SCALE, x)
        res = log_core(xs, _select(sub, SUBNORMAL_K, 0), ZERO)
        res = _select(x < ZERO, NAN, res)
        res = _select(x == ZERO, -INF, res)
        res = _select(x == INF, INF, res)
        return _select(x != x, x, res)

    @_jit
    def log1p(x_in):
        """log(1 + x), accurate near 0; log1p(-1) = -inf, log1p(<-1) = nan."""
        _always_inline()
        x = F(x_in)
        u = ONE + x
        # exact rounding error of u (2Sum), carried as a first-order correction err/u
        bb = u - ONE
        err = (ONE - (u - bb)) + (x - bb)
        res = log_core(u, 0, err / u)
        res = _select(x < -ONE, NAN, res)
        res = _select(x == -ONE, -INF, res)
        res = _select(x == INF, INF, res)
        res = _select(x == ZERO, x, res)  # -0.0 stays -0.0
        return _select(x != x, x, res)

    # ---------------------------------------------------------------- trigonometric
    #
    # All three return f(|x|) from r = |x| - n*pi/2 (an unevaluated pair rh + rl with
    # |rh| <= ~pi/4) and n mod 4. Two reductions produce (rh, rl, n):
    #  * trig_reduce: tabulated 2/pi chunks per exponent (see _trig_tables), exact for
    #    every finite input. The four table reads become gathers in vector code, which
    #    cost about 3x the rest of the function on Skylake/Cascade Lake.
    #  * trig_reduce_bounded: 2/pi as three/four constant chunks, no table, valid for
    #    |x| < TRIG_LIMIT (2^30): the error terms then stay below 2^-120 (f64) /
    #    2^-68 (f32) absolute, far under the closest approach of any such input to a
    #    multiple of pi/2.

    @_jit
    def quadrant(nf):
        """Integer n with n == nf (mod 4), for an integral float nf of any size."""
        _always_inline()
        nf4 = nf - FOUR * _rint(nf * QUARTER)  # exact, in [-2, 2]
        return _bits(nf4 + SHIFTER) - SHIFTER_BITS

    @_jit
    def trig_reduce(ax):
        """ax = (n + f) * pi/2 with |f| <~ 1/2 for finite ax >= TRIG_TINY.

        Returns r = f * pi/2 as an unevaluated sum rh + rl, and n (only n mod 4 matters).
        """
        _always_inline()
        ix = _bits(ax)
        idx = (ix >> MANT) - TRIG_EMIN
        idx = _select(idx < 0, 0, idx)  # tiny inputs: result discarded by the caller
        idx = _select(idx > TRIG_IMAX, TRIG_IMAX, idx)  # inf/nan: likewise
        X = from_bits((ix & MANT_MASK) | X_BITS)  # integer significand, as a float
        t0 = TAB0[idx]
        t1 = TAB1[idx]
        t2 = TAB2[idx]
        t3 = TAB3[idx]
        # exact products p_i + e_i = X * t_i (FMA); they shrink by 2^-m each
        p0 = X * t0
        e0 = _fma(X, t0, -p0)
        p0 = p0 - FOUR * _rint(p0 * QUARTER)  # exact: drop multiples of 4
        p1 = X * t1
        e1 = _fma(X, t1, -p1)
        p2 = X * t2
        e2 = _fma(X, t2, -p2)
        p3 = X * t3
        s, ea = _two_sum(p0, p1)
        s, eb = _two_sum(s, e0)
        nf = _rint(s)
        s = s - nf  # exact
        # the remaining big terms are added with exact error capture, so a reduced
        # argument that cancels down to ~2^-61 still keeps full precision
        s, ec = _two_sum(s, ea)
        s, ed = _two_sum(s, eb)
        s, ee = _two_sum(s, e1)
        s, ef = _two_sum(s, p2)
        lo = ((ec + ed) + (ee + ef)) + (e2 + p3)
        fh, fl = _fast_two_sum(s, lo)
        rh = fh * PIO2_HI
        rl = _fma(fh, PIO2_HI, -rh) + _mad(fh, PIO2_LO, fl * PIO2_HI)
        return rh, rl, quadrant(nf)

    if f64:

        @_jit
        def bounded_tail(ax, s, p2):
            """Fold the last (tiny, < 2^-75) product into the reduced fraction."""
            _always_inline()
            return s, p2

    else:

        @_jit
        def bounded_tail(ax, s, p2):
            _always_inline()
            # float32 needs one more chunk; the p2 product is still large enough to be
            # added exactly
            e2 = _fma(ax, C2PI_2, -p2)
            s, ec = _two_sum(s, p2)
            return s, ec + (e2 + ax * C2PI_3)

    @_jit
    def trig_reduce_bounded(ax):
        """As trig_reduce, without table lookups, for ax < TRIG_LIMIT."""
        _always_inline()
        p0 = ax * C2PI_0
        e0 = _fma(ax, C2PI_0, -p0)
        n0 = _rint(p0)
        s = p0 - n0  # exact
        p1 = ax * C2PI_1
        e1 = _fma(ax, C2PI_1, -p1)
        p2 = ax * C2PI_2
        s, ea = _two_sum(s, p1)
        s, eb = _two_sum(s, e0)
        # near the limit e0 and p1 can exceed 1 (float32): take out their integer part
        n1 = _rint(s)
        s = s - n1  # exact
        s, ec = _two_sum(s, ea)
        s, ed = _two_sum(s, eb)
        s, ee = _two_sum(s, e1)
        s, lo = bounded_tail(ax, s, p2)
        fh, fl = _fast_two_sum(s, ((ec + ed) + ee) + lo)
        rh = fh * PIO2_HI
        rl = _fma(fh, PIO2_HI, -rh) + _mad(fh, PIO2_LO, fl * PIO2_HI)
        return rh, rl, quadrant(n0) + quadrant(n1)

    @_jit
    def sincos_kernel(rh, rl):
        """sin and cos of rh + rl as unevaluated pairs (sh, sl, ch, cl);
        |rh| <= pi/4 + 2^-8, |rl| <~ ulp(rh)."""
        _always_inline()
        z = rh * rh
        sh, sl = _fast_two_sum(rh, _mad(rh * z, _poly(z, SIN_S), _mad(-HALF * z, rl, rl)))
        hz = HALF * z
        w = ONE - hz
        # (1 - w) - hz recovers the rounding error of w exactly
        ch, cl = _fast_two_sum(w, ((ONE - w) - hz) + _mad(z * z, _poly(z, COS_C), -(rh * rl)))
        return sh, sl, ch, cl

    @_jit
    def sin_finish(x, ax, rh, rl, n):
        _always_inline()
        s, _, c, _ = sincos_kernel(rh, rl)
        v = _select((n & 1) == 1, c, s)
        neg = ((n & 2) == 2) != (x < ZERO)  # sin(-x) = -sin(x)
        v = _select(neg, -v, v)
        return _select(ax < TRIG_TINY, x, v)

    @_jit
    def cos_finish(x, ax, rh, rl, n):
        _always_inline()
        s, _, c, _ = sincos_kernel(rh, rl)
        v = _select((n & 1) == 1, s, c)
        v = _select(((n + 1) & 2) == 2, -v, v)
        return _select(ax < TRIG_TINY, ONE, v)

    @_jit
    def tan_finish(x, ax, rh, rl, n):
        _always_inline()
        sh, sl, ch, cl = sincos_kernel(rh, rl)
        odd = (n & 1) == 1
        # tan(r + n pi/2) = tan r (n even) or -cot r (n odd); the quotient of the two
        # pairs is corrected so only its final rounding remains
        qh, ql = div2(_select(odd, -ch, sh), _select(odd, -cl, sl),
                      _select(odd, sh, ch), _select(odd, sl, cl))
        v = qh + ql
        v = _select(x < ZERO, -v, v)
        return _select(ax < TRIG_TINY, x, v)

    @_jit
    def sin(x_in):
        """Sine with exact argument reduction for every finite x; inf/nan -> nan."""
        _always_inline()
        x = F(x_in)
        ax = _fabs(x)
        rh, rl, n = trig_reduce(ax)
        return _select(ax <= FMAX, sin_finish(x, ax, rh, rl, n), x - x)  # inf, nan: nan

    @_jit
    def cos(x_in):
        """Cosine with exact argument reduction for every finite x; inf/nan -> nan."""
        _always_inline()
        x = F(x_in)
        ax = _fabs(x)
        rh, rl, n = trig_reduce(ax)
        return _select(ax <= FMAX, cos_finish(x, ax, rh, rl, n), x - x)

    @_jit
    def tan(x_in):
        """Tangent with exact argument reduction for every finite x; inf/nan -> nan."""
        _always_inline()
        x = F(x_in)
        ax = _fabs(x)
        rh, rl, n = trig_reduce(ax)
        return _select(ax <= FMAX, tan_finish(x, ax, rh, rl, n), x - x)

    # Bounded variants: NaN for |x| >= TRIG_LIMIT (and inf/nan), so that a
    # caller that did not check the range gets a visible failure, not a wrong number.

    @_jit
    def sin_bounded(x_in):
        """sin for |x| < TRIG_BOUNDED_LIMIT (no table gathers); nan beyond."""
        _always_inline()
        x = F(x_in)
        ax = _fabs(x)
        rh, rl, n = trig_reduce_bounded(ax)
        return _select(ax < TRIG_LIMIT, sin_finish(x, ax, rh, rl, n), NAN)

    @_jit
    def cos_bounded(x_in):
        """cos for |x| < TRIG_BOUNDED_LIMIT (no table gathers); nan beyond."""
        _always_inline()
        x = F(x_in)
        ax = _fabs(x)
        rh, rl, n = trig_reduce_bounded(ax)
        return _select(ax < TRIG_LIMIT, cos_finish(x, ax, rh, rl, n), NAN)

    @_jit
    def tan_bounded(x_in):
        """tan for |x| < TRIG_BOUNDED_LIMIT (no table gathers); nan beyond."""
        _always_inline()
        x = F(x_in)
        ax = _fabs(x)
        rh, rl, n = trig_reduce_bounded(ax)
        return _select(ax < TRIG_LIMIT, tan_finish(x, ax, rh, rl, n), NAN)

    @_jit
    def arctan(x_in):
        """Inverse tangent, odd, +-pi/2 at +-inf."""
        _always_inline()
        x = F(x_in)
        # atan rounds to pi/2 long before ATAN_BIG; clamping keeps 1/a and the
        # division residual finite for a = inf (nan passes through)
        a = _fabs(x)
        a = _select(a > ATAN_BIG, ATAN_BIG, a)
        # reduce to |t| <= tan(pi/8): atan a = base + atan t with
        #   a <= tan(pi/8):            t = a,             base = 0
        #   a <= tan(3pi/8):           t = (a-1)/(a+1),   base = pi/4
        #   otherwise:                 t = -1/a,          base = pi/2
        big = a > TAN_3PI_8
        mid = a > TAN_PI_8
        am1h, am1l = _two_sum(a, -ONE)
        ap1h, ap1l = _two_sum(a, ONE)
        nh = _select(big, -ONE, _select(mid, am1h, a))
        nl = _select(mid & ~big, am1l, ZERO)
        dh = _select(big, a, _select(mid, ap1h, ONE))
        dl = _select(mid & ~big, ap1l, ZERO)
        th, tl = div2(nh, nl, dh, dl)
        base_hi = _select(big, PIO2_HI, _select(mid, PIO4_HI, ZERO))
        base_lo = _select(big, PIO2_LO, _select(mid, PIO4_LO, ZERO))
        z = th * th
        res = base_hi + (th + _mad(th * z, _poly(z, ATAN_P), base_lo + tl))
        return _copysign(res, x)

    return {
        "exp": exp, "expm1": expm1, "log": log, "log1p": log1p, "tanh": tanh,
        "sin": sin, "cos": cos, "tan": tan, "sinh": sinh, "cosh": cosh,
        "arctan": arctan, "sigmoid": sigmoid,
    }, {"sin": sin_bounded, "cos": cos_bounded, "tan": tan_bounded}


_F64, _F64_BOUNDED = _build(np.float64)
_F32, _F32_BOUNDED = _build(np.float32)

exp_f64 = _F64["exp"]
exp_f32 = _F32["exp"]
expm1_f64 = _F64["expm1"]
expm1_f32 = _F32["expm1"]
log_f64 = _F64["log"]
log_f32 = _F32["log"]
log1p_f64 = _F64["log1p"]
log1p_f32 = _F32["log1p"]
tanh_f64 = _F64["tanh"]
tanh_f32 = _F32["tanh"]
sin_f64 = _F64["sin"]
sin_f32 = _F32["sin"]
cos_f64 = _F64["cos"]
cos_f32 = _F32["cos"]
tan_f64 = _F64["tan"]
tan_f32 = _F32["tan"]
sinh_f64 = _F64["sinh"]
sinh_f32 = _F32["sinh"]
cosh_f64 = _F64["cosh"]
cosh_f32 = _F32["cosh"]
arctan_f64 = _F64["arctan"]
arctan_f32 = _F32["arctan"]
sigmoid_f64 = _F64["sigmoid"]
sigmoid_f32 = _F32["sigmoid"]
sin_bounded_f64 = _F64_BOUNDED["sin"]
sin_bounded_f32 = _F32_BOUNDED["sin"]
cos_bounded_f64 = _F64_BOUNDED["cos"]
cos_bounded_f32 = _F32_BOUNDED["cos"]
tan_bounded_f64 = _F64_BOUNDED["tan"]
tan_bounded_f32 = _F32_BOUNDED["tan"]

#: (numpy function name, dtype name) -> Numba dispatcher, e.g. ("exp", "float32").
#: Every entry is accurate over the whole domain of its dtype.
#: "sigmoid" is the logistic function 1 / (1 + exp(-x)) (scipy.special.expit).
FUNCTIONS: dict[tuple[str, str], numba.core.registry.CPUDispatcher] = {
    (name, dtype): table[name]
    for dtype, table in (("float64", _F64), ("float32", _F32))
    for name in table
}

#: Faster sin/cos/tan (no table gathers, ~3x on Cascade Lake) that are exact only for
#: |x| < TRIG_BOUNDED_LIMIT and return NaN beyond it. For kernels that can prove or
#: check (e.g. with an OR-reduced flag and a rerun) that their arguments stay in range.
BOUNDED_TRIG: dict[tuple[str, str], numba.core.registry.CPUDispatcher] = {
    (name, dtype): table[name]
    for dtype, table in (("float64", _F64_BOUNDED), ("float32", _F32_BOUNDED))
    for name in table
}
