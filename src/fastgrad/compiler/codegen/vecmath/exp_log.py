"""exp, expm1, tanh, sinh, cosh, sigmoid, log and log1p for one precision: range
reduction, a minimax polynomial, and the exponent set by bit manipulation."""

from __future__ import annotations

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
    _select,
    _two_sum,
    jit_for,
)
from fastgrad.compiler.codegen.vecmath.tables import constants


def build(F: Any) -> dict[str, Any]:  # noqa: C901 - one closure scope keeps constants typed
    """The functions for float type F, by name (helpers the trig functions share too)."""
    k = constants(F)
    _jit = jit_for(F)
    (
        BIAS,
        EXPM1_LO,
        EXPM1_P,
        EXP_HI,
        EXP_LO,
        EXP_Q,
        HALF,
        HYP_BIG,
        HYP_HI,
        INF,
        LN2_HI,
        LN2_LO,
        LOG2E,
        LOG_P,
        MANT,
        NAN,
        ONE,
        SHIFTER,
        SHIFTER_BITS,
        SQRT_HALF_BITS,
        SUBNORMAL_K,
        SUBNORMAL_SCALE,
        TANH_SAT,
        TINY_NORMAL,
        TWO,
        ZERO,
        from_bits,
    ) = (
        k["BIAS"],
        k["EXPM1_LO"],
        k["EXPM1_P"],
        k["EXP_HI"],
        k["EXP_LO"],
        k["EXP_Q"],
        k["HALF"],
        k["HYP_BIG"],
        k["HYP_HI"],
        k["INF"],
        k["LN2_HI"],
        k["LN2_LO"],
        k["LOG2E"],
        k["LOG_P"],
        k["MANT"],
        k["NAN"],
        k["ONE"],
        k["SHIFTER"],
        k["SHIFTER_BITS"],
        k["SQRT_HALF_BITS"],
        k["SUBNORMAL_K"],
        k["SUBNORMAL_SCALE"],
        k["TANH_SAT"],
        k["TINY_NORMAL"],
        k["TWO"],
        k["ZERO"],
        k["from_bits"],
    )

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

    if F is np.float32:
        SCALE_UP, SCALE_DOWN = F(2.0**64), F(2.0**-75)

        @_jit
        def scale2_f32(p, n):  # noqa: F811
            """scale2 for float32's n in [-151, 129] (every caller's range): p 2^(n - 64)
            2^64 above 0, p 2^(n + 75) 2^-75 below, the first product exact and the
            second rounding once, as scale2's halves do. No shift: the arithmetic shift
            of n kept its integer lanes 64 bits wide (9 of exp's 39 instructions)."""
            _always_inline()
            up = n > 0
            return p * pow2(n - _select(up, 64, -75)) * _select(up, SCALE_UP, SCALE_DOWN)

        scale2 = scale2_f32  # noqa: F811

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

    if F is np.float32:
        TANH_P, TANH_SMALL = k["TANH_P"], k["TANH_SMALL"]

        @_jit
        def tanh_f32(x_in):
            """float32 tanh in float32 lanes, no pairs: below TANH_SMALL an odd polynomial
            a + a^3 P(a^2), above it 1 - 2 / (e^2a + 1), whose error (e^2a's rounding, the
            sum's and the quotient's) shrinks with 2 / (e^2a + 1) itself. Max error 0.94 ulp
            over every 5th float32 in [2^-20, 10.5] (float64 tanh as reference; the pairs
            computed in float64 gave 0.68), at twice the lanes of float64 code."""
            _always_inline()
            x = F(x_in)
            a = _fabs(x)
            z = a * a
            # rounded once (llvm.fma): as a*z*P + a in two roundings, on a CPU without
            # FMA, the error reached 1.09 ulp near 0.9 (0.98 so)
            small = _fma(a * z, _poly(z, TANH_P), a)
            ac = _select(a > TANH_SAT, TANH_SAT, a)  # nan passes through
            p, _, n = exp_reduce(ac + ac)  # e^2a = p 2^n, n <= 29: one scaling suffices
            big = ONE - TWO / _mad(p, pow2(n), ONE)
            return _copysign(_select(a < TANH_SMALL, small, big), x)

        tanh = tanh_f32  # noqa: F811

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

    @_jit
    def logaddexp(x_in, y_in):
        """log(e**x + e**y) as the larger plus log1p(e**-|x - y|), branch-free (softplus is
        logaddexp(x, 0)); equal arguments, infinities among them, give x + ln 2."""
        _always_inline()
        x = F(x_in)
        y = F(y_in)
        d = x - y
        res = _select(d > ZERO, x, y) + log1p(exp(-_fabs(d)))  # a nan in d stays nan
        return _select(x == y, x + (LN2_HI + LN2_LO), res)

    return {
        "exp": exp, "expm1": expm1, "log": log, "log1p": log1p, "tanh": tanh,
        "sinh": sinh, "cosh": cosh, "sigmoid": sigmoid, "logaddexp": logaddexp,
        # helpers (vecmath removes them from its tables)
        "div2": div2, "int_to_float": int_to_float, "exp_reduce": exp_reduce, "scale2": scale2,
    }  # fmt: skip
