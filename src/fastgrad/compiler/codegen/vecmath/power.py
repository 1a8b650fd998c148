"""x**y for exponents that are not constant-reducible: exp(y * log|x|) with log|x| and the
product carried as double-length pairs, so the result stays within a few ulps even where
y*log|x| is large, and IEEE pow's special values (NumPy's) set by selects. float32 is
computed in float64 (plain exp and log suffice there) and rounded once.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.vecmath.llvm import (
    _always_inline,
    _bits,
    _copysign,
    _fabs,
    _fast_two_sum,
    _fma,
    _mad,
    _poly,
    _rint,
    _select,
    _two_sum,
    jit_for,
)
from fastgrad.compiler.codegen.vecmath.tables import constants

# log(1+f) = 2s + s R(z), s = f/(2+f), z = s^2, R(z) = sum 2 z^n / (2n+1) (the series of
# atanh): through n = 11 it is within 2^-64 of R for z <= (3 - 2 sqrt 2)^2, far inside what
# vecmath's log needs but what a large exponent multiplies. The first coefficient, 2/3, is a
# pair (its rounding alone would cost ~2^-62).
_C1_HI = float(Fraction(2, 3))
_C1_LO = float(Fraction(2, 3) - Fraction(_C1_HI))
_R_TAIL = tuple(2.0 / (2 * n + 1) for n in range(2, 12))


def build(shared: dict[str, Any]) -> tuple[Any, Any]:
    """(power for float64, power for float32), from the float64 exp, log and helpers."""
    F = np.float64
    k = constants(F)
    _jit = jit_for(F)
    EXP_HI, EXP_LO, INF, LN2_HI, LN2_LO = (
        k["EXP_HI"],
        k["EXP_LO"],
        k["INF"],
        k["LN2_HI"],
        k["LN2_LO"],
    )
    MANT, NAN, ONE, TWO, ZERO, HALF = k["MANT"], k["NAN"], k["ONE"], k["TWO"], k["ZERO"], k["HALF"]
    SQRT_HALF_BITS, TINY_NORMAL = k["SQRT_HALF_BITS"], k["TINY_NORMAL"]
    SUBNORMAL_SCALE, SUBNORMAL_K, from_bits = k["SUBNORMAL_SCALE"], k["SUBNORMAL_K"], k["from_bits"]
    C1_HI, C1_LO, R_TAIL = F(_C1_HI), F(_C1_LO), tuple(F(c) for c in _R_TAIL)
    div2, int_to_float = shared["div2"], shared["int_to_float"]
    exp_reduce, scale2 = shared["exp_reduce"], shared["scale2"]
    exp, log = shared["exp"], shared["log"]

    @_jit
    def log_pair(a):
        """log(a) as an unevaluated pair, for positive finite a (subnormals included).

        log(a) = k ln2 + log(1+f) with 1+f in [sqrt(1/2), sqrt(2)), and log(1+f) = 2s +
        s*R(z): s, z, R's leading term and s*R are pairs, so what is left is the series'
        tail (~2^-64 of the result) and its roundings."""
        _always_inline()
        sub = a < TINY_NORMAL
        xs = _select(sub, a * SUBNORMAL_SCALE, a)
        ix = _bits(xs)
        k = (ix - SQRT_HALF_BITS) >> MANT
        m = from_bits(ix - (k << MANT))
        kf = int_to_float(k + _select(sub, SUBNORMAL_K, 0))
        f = m - ONE  # exact
        dh, dl = _two_sum(TWO, f)
        sh, sl = div2(f, ZERO, dh, dl)
        zh = sh * sh
        zl = _fma(sh, sh, -zh) + TWO * sh * sl
        # R = z*(2/3 + z*tail(z)): its leading product as a pair, the rest rounded
        uh = C1_HI * zh
        ul = _fma(C1_HI, zh, -uh) + _mad(C1_HI, zl, C1_LO * zh)
        rh, rl = _fast_two_sum(uh, _mad(zh * zh, _poly(zh, R_TAIL), ul))
        th = sh * rh  # s*r as a pair
        tl = _fma(sh, rh, -th) + _mad(sh, rl, sl * rh)
        # k*LN2_HI is exact; 2s and s*r join it with their rounding errors kept
        hi, lo = _two_sum(kf * LN2_HI, sh + sh)
        hi, lo2 = _two_sum(hi, th)
        return _fast_two_sum(hi, lo + lo2 + (sl + sl + _mad(kf, LN2_LO, tl)))

    @_jit
    def exp_pair(xh, xl):
        """exp(xh + xl), |xl| <= ulp(xh): exp(xh) * (1 + xl); inf above EXP_HI, +0 below
        EXP_LO, nan for nan."""
        _always_inline()
        xc = _select(xh > EXP_HI, EXP_HI, xh)
        xc = _select(xc < EXP_LO, EXP_LO, xc)
        xl = _select(xc == xh, xl, ZERO)  # clamped (or nan): the low part means nothing
        ph, pl, n = exp_reduce(xc)
        return scale2(ph + _mad(ph, xl, pl), n)

    @_jit
    def special_values(x, y, r):
        """x**y from r = |x|**y (exp(y*log|x|), with the log's -inf at 0, inf at inf and
        nan at nan): the sign of an odd integer power of a negative base (-0.0 and -inf
        included), nan for a negative finite base with a fraction, x**0 = 1**y = 1 (nan
        included) and (-1)**(+-inf) = 1, as C99 and NumPy."""
        _always_inline()
        a = _fabs(x)
        odd = (_rint(y) == y) & (_rint(y * HALF) != y * HALF)
        r = _copysign(r, _select((_bits(x) < 0) & odd, -ONE, ONE))
        fraction = (_rint(y) != y) & (_fabs(y) < INF)  # finite, not an integer
        r = _select((x < ZERO) & (x > -INF) & fraction, NAN, r)
        r = _select((a == ONE) & (_fabs(y) == INF), ONE, r)
        return _select((y == ZERO) | (x == ONE), ONE, r)

    @_jit
    def power_f64(x_in, y_in):
        """x**y within ~1 ulp, with NumPy's special values."""
        _always_inline()
        x = F(x_in)
        y = F(y_in)
        a = _fabs(x)
        lh, ll = log_pair(a)
        lh = _select(a == ZERO, -INF, _select(a == INF, INF, lh))
        lh = _select(a != a, a, lh)
        ll = _select((a == ZERO) | (a == INF), ZERO, ll)  # y*log|x| is exact there
        ph = y * lh
        pl = _fma(y, lh, -ph) + y * ll
        return special_values(x, y, exp_pair(ph, pl))

    @jit_for(np.float32)
    def power_f32(x_in, y_in):
        """x**y for float32, computed in float64 and rounded once: a finite nonzero
        float32 result has |y*log|x|| < 104, so plain float64 exp and log are ~2^-46 from
        exact there, far inside float32's half ulp (overflow to inf and underflow to
        subnormals and 0 happen in the rounding). ~2.4x faster than the pair version."""
        _always_inline()
        x = np.float64(x_in)
        y = np.float64(y_in)
        return np.float32(special_values(x, y, exp(y * log(_fabs(x)))))

    return power_f64, power_f32
