"""sin, cos, tan (exact reduction for every input, and cheaper bounded variants) and
arctan for one precision."""

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
    _low_word,
    _mad,
    _poly,
    _rint,
    _select,
    _two_sum,
    jit_for,
)
from fastgrad.compiler.codegen.vecmath.tables import constants


def build(F: Any, shared: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:  # noqa: C901
    """(functions, bounded variants) for float type F; `shared` holds exp_log's helpers."""
    k = constants(F)
    _jit = jit_for(F)
    (
        ATAN_BIG,
        ATAN_P,
        C2PI_0,
        C2PI_1,
        C2PI_2,
        COS_C,
        D2PI,
        DPIO2_0,
        DPIO2_1,
        DPIO2_2,
        DSHIFTER,
        FMAX,
        FOUR,
        HALF,
        MANT,
        MANT_MASK,
        NAN,
        ONE,
        PIO2_HI,
        PIO2_LO,
        PIO4_HI,
        PIO4_LO,
        QUARTER,
        SHIFTER,
        SHIFTER_BITS,
        SIN_S,
        TAB0,
        TAB1,
        TAB2,
        TAB3,
        TAN_3PI_8,
        TAN_PI_8,
        TRIG_EMIN,
        TRIG_IMAX,
        TRIG_LIMIT,
        TRIG_TINY,
        X_BITS,
        ZERO,
        f64,
        from_bits,
    ) = (
        k["ATAN_BIG"],
        k["ATAN_P"],
        k["C2PI_0"],
        k["C2PI_1"],
        k["C2PI_2"],
        k["COS_C"],
        k["D2PI"],
        k["DPIO2_0"],
        k["DPIO2_1"],
        k["DPIO2_2"],
        k["DSHIFTER"],
        k["FMAX"],
        k["FOUR"],
        k["HALF"],
        k["MANT"],
        k["MANT_MASK"],
        k["NAN"],
        k["ONE"],
        k["PIO2_HI"],
        k["PIO2_LO"],
        k["PIO4_HI"],
        k["PIO4_LO"],
        k["QUARTER"],
        k["SHIFTER"],
        k["SHIFTER_BITS"],
        k["SIN_S"],
        k["TAB0"],
        k["TAB1"],
        k["TAB2"],
        k["TAB3"],
        k["TAN_3PI_8"],
        k["TAN_PI_8"],
        k["TRIG_EMIN"],
        k["TRIG_IMAX"],
        k["TRIG_LIMIT"],
        k["TRIG_TINY"],
        k["X_BITS"],
        k["ZERO"],
        k["f64"],
        k["from_bits"],
    )
    div2 = shared["div2"]

    # ---------------------------------------------------------------- trigonometric
    #
    # All three return f(|x|) from r = |x| - n*pi/2 (an unevaluated pair rh + rl with
    # |rh| <= ~pi/4) and n mod 4. Two reductions produce (rh, rl, n):
    #  * trig_reduce: tabulated 2/pi chunks per exponent (see _trig_tables), exact for
    #    every finite input. The four table reads become gathers in vector code, which
    #    cost about 3x the rest of the function on Skylake/Cascade Lake.
    #  * trig_reduce_bounded: no table, valid for |x| < TRIG_LIMIT (2^30). float64: 2/pi
    #    as three constant chunks, error terms below 2^-120 absolute; float32: the
    #    same reduction carried in float64 (trig_reduce_bounded_f32), within half an ulp
    #    of r in float64 (2^-53 relative). Both far under what the polynomials need, even
    #    at the closest approach of any such input to a multiple of pi/2.

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

    @_jit
    def trig_reduce_bounded_f32(ax):
        """float32 trig_reduce_bounded, carried in float64: ax is exact there, n < 2^30
        too, and three FMAs with a 159-bit pi/2 leave r = ax - n pi/2 within half an ulp
        of r in float64 (the last FMA's rounding: 2^-53 relative, 2^-54 absolute near pi/4;
        n * DPIO2_1 < 2^-23 bounds the first step's), far more than float32 results need,
        even at the closest approach of a float32 to a multiple of pi/2. ~20 instructions
        where the float32 pair arithmetic takes ~75; rh + rl is r rounded to 48 bits."""
        _always_inline()
        xd = np.float64(ax)
        nd = _rint(xd * D2PI)
        r = _fma(-nd, DPIO2_0, xd)
        r = _fma(-nd, DPIO2_1, r)
        r = _fma(-nd, DPIO2_2, r)
        rh = F(r)
        rl = F(r - np.float64(rh))  # the difference is exact
        return rh, rl, _low_word(nd + DSHIFTER)  # n: DSHIFTER's low word is 0

    @_jit
    def trig_reduce_bounded(ax):
        """As trig_reduce, without table lookups, for ax < TRIG_LIMIT (float64; float32
        uses trig_reduce_bounded_f32)."""
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
        # e0 and p1 may exceed 1 near the limit: take out their integer part
        n1 = _rint(s)
        s = s - n1  # exact
        s, ec = _two_sum(s, ea)
        s, ed = _two_sum(s, eb)
        s, ee = _two_sum(s, e1)
        fh, fl = _fast_two_sum(s, ((ec + ed) + ee) + p2)  # p2 < 2^-75: folded in
        rh = fh * PIO2_HI
        rl = _fma(fh, PIO2_HI, -rh) + _mad(fh, PIO2_LO, fl * PIO2_HI)
        return rh, rl, quadrant(n0) + quadrant(n1)

    if not f64:
        trig_reduce_bounded = trig_reduce_bounded_f32  # noqa: F811

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
        qh, ql = div2(
            _select(odd, -ch, sh), _select(odd, -cl, sl), _select(odd, sh, ch), _select(odd, sl, cl)
        )
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

    return {"sin": sin, "cos": cos, "tan": tan, "arctan": arctan}, {
        "sin": sin_bounded, "cos": cos_bounded, "tan": tan_bounded,
    }  # fmt: skip
