"""Constants of the vector math: polynomial coefficients, the 2/pi tables for exact trig
argument reduction, and every per-precision constant the functions capture.

`constants(F)` returns them for float type F as F scalars, so that float32 code never
sees a float64 literal (Numba would promote the whole expression to float64).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.vecmath.llvm import _f32_from_bits, _f64_from_bits

#: |x| below which the *_bounded trig functions are exact (both dtypes); NaN at and above.
TRIG_BOUNDED_LIMIT = 2.0**30


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
    np.float64: (
        "0x1.0000000000001p-1",
        "0x1.555555555554dp-3",
        "0x1.5555555553d52p-5",
        "0x1.11111111144eap-7",
        "0x1.6c16c178941fep-10",
        "0x1.a01a018c15246p-13",
        "0x1.a019b8e84b959p-16",
        "0x1.71de5a5b8cd03p-19",
        "0x1.2891b56c2b8f1p-22",
        "0x1.aeab19c80178dp-26",
    ),
    np.float32: (
        "0x1.0000000000000p-1",
        "0x1.5554dc0000000p-3",
        "0x1.5555ba0000000p-5",
        "0x1.120b980000000p-7",
        "0x1.6c6a1c0000000p-10",
    ),
}
# expm1(r) = r + r^2/2 + r^3 P(r), same interval.          f64: 2^-58.7, f32: 2^-29.1
_EXPM1_P = {
    np.float64: (
        "0x1.5555555555556p-3",
        "0x1.5555555555554p-5",
        "0x1.11111111109aap-7",
        "0x1.6c16c16c18145p-10",
        "0x1.a01a01a7cb8e5p-13",
        "0x1.a01a01989de42p-16",
        "0x1.71de0d8fe42b5p-19",
        "0x1.27e502cd21130p-22",
        "0x1.af38f50b66005p-26",
        "0x1.1f2a40df82f0dp-29",
    ),
    np.float32: (
        "0x1.5555560000000p-3",
        "0x1.55551a0000000p-5",
        "0x1.11112c0000000p-7",
        "0x1.6d11540000000p-10",
        "0x1.a0893e0000000p-13",
    ),
}
# tanh(a) = a + a z P(z), z = a^2, 0 <= a <= 1, float32 only (exp_log.tanh_f32): 2^-27.7
# relative. A float64 least-squares fit of (tanh(a)/a - 1)/z (50-digit mpmath values)
# weighted by the error it makes in tanh and reweighted towards the largest (Lawson's
# iteration), each coefficient rounded to float32 before the next ones are refitted.
_TANH_P = (
    "-0x1.55553c0000000p-2",
    "0x1.110be60000000p-3",
    "-0x1.b962860000000p-5",
    "0x1.600bc00000000p-6",
    "-0x1.0466f80000000p-7",
    "0x1.2db66e0000000p-9",
    "-0x1.7803d80000000p-12",
)
# log(1+f) = 2 atanh(s) = 2s + s z P(z), s = f/(2+f), z = s^2 <= ((sqrt2-1)/(sqrt2+1))^2.
#                                                            f64: 2^-57.6, f32: 2^-28.5
_LOG_P = {
    np.float64: (
        "0x1.5555555555558p-1",
        "0x1.999999999523ap-2",
        "0x1.2492492e03053p-2",
        "0x1.c71c62cfb659fp-3",
        "0x1.7462baae08002p-3",
        "0x1.39fd9dc398b11p-3",
        "0x1.2b617aeaf3ecdp-3",
    ),
    np.float32: ("0x1.55555c0000000p-1", "0x1.997c160000000p-2", "0x1.2eea320000000p-2"),
}
# sin(r) = r + r z S(z), z = r^2, |r| <= pi/4 + 2^-8.        f64: 2^-55.3, f32: 2^-28.1
_SIN_S = {
    np.float64: (
        "-0x1.5555555555555p-3",
        "0x1.1111111110b5ep-7",
        "-0x1.a01a019e7054ep-13",
        "0x1.71de377e14545p-19",
        "-0x1.ae5ff20ac653ep-26",
        "0x1.5e0243b0bac5bp-33",
    ),
    np.float32: (
        "-0x1.5555560000000p-3",
        "0x1.11110e0000000p-7",
        "-0x1.a013800000000p-13",
        "0x1.6db1c20000000p-19",
    ),
}
# cos(r) = 1 - z/2 + z^2 C(z), same interval.               f64: 2^-59.5, f32: 2^-30.1
_COS_C = {
    np.float64: (
        "0x1.5555555555555p-5",
        "-0x1.6c16c16c1693fp-10",
        "0x1.a01a019f45864p-16",
        "-0x1.27e4fa0c2fbb4p-22",
        "0x1.1eeb5cf15465dp-29",
        "-0x1.9075219ae3203p-37",
    ),
    np.float32: ("0x1.5555540000000p-5", "-0x1.6c12bc0000000p-10", "0x1.9bcc560000000p-16"),
}
# atan(t) = t + t z P(z), z = t^2, |t| <= tan(pi/8).         f64: 2^-56.9, f32: 2^-28.3
_ATAN_P = {
    np.float64: (
        "-0x1.5555555555555p-2",
        "0x1.999999999935ep-3",
        "-0x1.2492492436e82p-3",
        "0x1.c71c7185a7e2ap-4",
        "-0x1.745d0b36ebd9dp-4",
        "0x1.3b12641d23603p-4",
        "-0x1.10fa848304024p-4",
        "0x1.dfe7019768161p-5",
        "-0x1.a09cac9d15336p-5",
        "0x1.4169cba1f22c6p-5",
        "-0x1.3a3efa43b71d0p-6",
    ),
    np.float32: (
        "-0x1.5555540000000p-2",
        "0x1.9997360000000p-3",
        "-0x1.2420c80000000p-3",
        "0x1.b819e60000000p-4",
        "-0x1.085eca0000000p-4",
    ),
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
    rows: list[list[float]] = [[], [], [], []]
    for e_biased in range(emin, emax + 1):
        k = e_biased - bias - mant  # |x| = X * 2^k
        # bits of 2^k * 2/pi with weights 2^1 .. 2^(2-4m), truncated; the integer part
        # above 2^1 is dropped, which is the "mod 4"
        shift = k + (4 * m - 2) - _TWO_OVER_PI_BITS
        v = _TWO_OVER_PI_INT << shift if shift >= 0 else _TWO_OVER_PI_INT >> -shift
        v &= (1 << (4 * m)) - 1
        for j in range(4):
            chunk = (v >> (m * (3 - j))) & ((1 << m) - 1)
            # weight of the chunk's lowest bit: 2^(2 - (j+1)*m); exact in float64 (a
            # chunk has at most 53 bits), rounded once to `dtype` below. Python floats, not
            # NumPy scalars: NumPy's per-element calls took ~10 ms a table.
            rows[j].append(math.ldexp(float(chunk), 2 - (j + 1) * m))
    return np.array(rows, dtype=dtype)


def constants(F: Any) -> dict[str, Any]:
    """Every constant of the precision F (np.float64 or np.float32), by name (a dict of
    the caller's own; the values are computed once per precision: exp/log, trig and power
    each ask, and the 2/pi tables took most of vecmath's import)."""
    return dict(_constants(F))


@functools.cache
def _constants(F: Any) -> dict[str, Any]:  # noqa: C901
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

    # 2/pi as truncated (floor) chunks of MANT+1 bits, exact in F, for the float64
    # bounded reduction (three chunks, 159 bits)
    C2PI = _coefs(F, ("0x1.45f306dc9c882p-1", "0x1.4a7f09d5f47d4p-54", "0x1.a6ee06db14accp-107"))
    # float32's bounded reduction runs in float64: 2/pi, and pi/2 as three rounded parts
    D2PI = np.float64(float.fromhex("0x1.45f306dc9c883p-1"))
    DPIO2_0 = np.float64(float.fromhex("0x1.921fb54442d18p+0"))
    DPIO2_1 = np.float64(float.fromhex("0x1.1a62633145c07p-54"))
    DPIO2_2 = np.float64(float.fromhex("-0x1.f1976b7ed8fbcp-110"))
    DSHIFTER = np.float64(1.5 * 2.0**52)
    # float32 tanh: its polynomial, and where it hands over to 1 - 2 / (e^2a + 1) (below 1,
    # that form's error grows past an ulp; the polynomial's stays under 0.93 up to 1)
    TANH_P = _coefs(F, _TANH_P)
    TANH_SMALL = F(1.0)
    C2PI_0, C2PI_1, C2PI_2 = C2PI
    TRIG_LIMIT = F(TRIG_BOUNDED_LIMIT)
    TAB = _trig_tables(F, MANT, BIAS, TRIG_EMIN)
    TAB0, TAB1, TAB2, TAB3 = (np.ascontiguousarray(TAB[j]) for j in range(4))
    return {name: value for name, value in locals().items() if name != "F"}
