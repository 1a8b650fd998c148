"""Threefry-2x32 and the maps from its bits to numbers, written once and built twice.

Fused kernels call the inline Numba build (`uniform_f64`, `normal_f32`, ...) once per
element, the counter being the element's flat index; the random primitives' reference
implementations run the NumPy build of the same source over whole arrays. Both use integer
operations, + - * /, sqrt, floor and selects only, each correctly rounded (no libm call, no
fused multiply-add), so a key gives bit-identical numbers on every path, and loops vectorize.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.core import jit_hook

_u = np.uint64
MASK = _u(0xFFFFFFFF)
PARITY = _u(0x1BD11BDA)  # Threefry's key-schedule constant
TWO_M53 = 2.0**-53
TWO_M24 = 2.0**-24
LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that k * LN2_HI is exact for small k
LN2_LO = 1.90821492927058770002e-10
HALF_PI = 1.5707963267948966
SQRT2 = 1.4142135623730951
# Series coefficients: 1/(2j+1) for ln's atanh series, 1/(k(k-1)) and 1/(k(k+1)) for cos, sin.
ATANH = tuple(1.0 / c for c in range(25, 2, -2))
COS = tuple(1.0 / (k * (k - 1)) for k in range(18, 0, -2))
SIN = tuple(1.0 / (k * (k + 1)) for k in range(18, 0, -2))
EXP = tuple(1.0 / math.factorial(n) for n in range(18, -1, -1))  # exp's Taylor series
INV_LN2 = 1.4426950408889634
# Exact scalings by 2^s, for s halving from 512: a float's exponent found (or applied) by
# comparisons, branch-free, with no bit casts. The down scaling repeats 512 (to 2^-1075).
SHIFTS = (512.0, 256.0, 128.0, 64.0, 32.0, 16.0, 8.0, 4.0, 2.0, 1.0)
POW2 = tuple(2.0**s for s in SHIFTS)
INV_POW2 = tuple(2.0**-s for s in SHIFTS)
HALF_POW2 = tuple(2.0 ** (1 - s) for s in SHIFTS)
DOWN = (512.0, *SHIFTS)
INV_POW2_DOWN = tuple(2.0**-s for s in DOWN)
# Gamma samples (Marsaglia-Tsang): the boost's uniform uses counter stream GAMMA_STREAM,
# trial t the streams GAMMA_STREAM + 1 + 3t (a normal: two blocks) and + 3 + 3t (a uniform).
GAMMA_STREAM = 4
GAMMA_TRIALS = 1000  # each trial accepts with probability > 0.95: never reached

# float32 normals compute in float32 (8 lanes to an AVX2 register): constants typed so that
# neither Numba nor NumPy widens them. LN2_HI_F32 has 17 significant bits: k LN2_HI_F32 is
# exact for |k| <= 64.
_f = np.float32
LN2_HI_F32 = _f(0.693145751953125)
LN2_LO_F32 = _f(0.693147180559945309 - 0.693145751953125)
ATANH_F32 = tuple(_f(1.0 / c) for c in range(9, 2, -2))
COS_F32 = tuple(_f(1.0 / (k * (k - 1))) for k in range(12, 0, -2))
SIN_F32 = tuple(_f(1.0 / (k * (k + 1))) for k in range(12, 0, -2))
HALF_PI_F32 = _f(HALF_PI)
SQRT2_M1_F32 = _f(SQRT2 - 1.0)
LOG_STEPS = (16, 8, 4, 2, 1)
INV_POW2_F32 = tuple(_f(2.0**-s) for s in LOG_STEPS)

# Words are held in uint64 or uint32 and wrapped to 32 bits after every operation: Numba
# widens uint32 arithmetic to 64 bits, and the wrap lets LLVM keep Threefry in 32-bit vector
# lanes (8 to an AVX2 register where the rest of the loop allows); NumPy's arrays compute
# exactly what the kernels do.


def build(
    select: Callable[..., Any], every: Callable[[Any], Any], jit: Callable[[Any], Any]
) -> dict[str, Any]:
    """The functions, by name, with `select(c, a, b)` for "a where c else b", `every(c)` for
    "c holds everywhere", and each one passed through `jit` (Numba's inline njit, or the
    identity for NumPy arrays)."""

    @jit
    def rotl(x, r):  # type: ignore[no-untyped-def]
        return np.uint32((x << _u(r)) | (x >> _u(32 - r)))

    @jit
    def four_rounds(x0, x1, a, b, c, d):  # type: ignore[no-untyped-def]
        x0 = np.uint32(x0 + x1)
        x1 = np.uint32(rotl(x1, a) ^ x0)
        x0 = np.uint32(x0 + x1)
        x1 = np.uint32(rotl(x1, b) ^ x0)
        x0 = np.uint32(x0 + x1)
        x1 = np.uint32(rotl(x1, c) ^ x0)
        x0 = np.uint32(x0 + x1)
        x1 = np.uint32(rotl(x1, d) ^ x0)
        return x0, x1

    @jit
    def threefry2x32(k0, k1, c0, c1):  # type: ignore[no-untyped-def]
        """Threefry-2x32 with 20 rounds (Salmon et al., SC'11): key (k0, k1), counter
        (c0, c1), 32-bit values held in uint64; gives the two 32-bit output words."""
        k2 = k0 ^ k1 ^ PARITY
        x0 = np.uint32(c0 + k0)
        x1 = np.uint32(c1 + k1)
        # Rotations (13, 15, 26, 6) and (17, 29, 16, 24) alternate; the key is injected,
        # with the injection count added, after every four rounds.
        x0, x1 = four_rounds(x0, x1, 13, 15, 26, 6)
        x0, x1 = np.uint32(x0 + k1), np.uint32(x1 + k2 + _u(1))
        x0, x1 = four_rounds(x0, x1, 17, 29, 16, 24)
        x0, x1 = np.uint32(x0 + k2), np.uint32(x1 + k0 + _u(2))
        x0, x1 = four_rounds(x0, x1, 13, 15, 26, 6)
        x0, x1 = np.uint32(x0 + k0), np.uint32(x1 + k1 + _u(3))
        x0, x1 = four_rounds(x0, x1, 17, 29, 16, 24)
        x0, x1 = np.uint32(x0 + k1), np.uint32(x1 + k2 + _u(4))
        x0, x1 = four_rounds(x0, x1, 13, 15, 26, 6)
        x0, x1 = np.uint32(x0 + k2), np.uint32(x1 + k0 + _u(5))
        return _u(x0), _u(x1)

    @jit
    def bits32(k0, k1, stream, base, i):  # type: ignore[no-untyped-def]
        """Element i of a stream of 32-bit words: word i % 2 of block (stream, base + i // 2)."""
        x0, x1 = threefry2x32(k0, k1, stream, (base + (i >> _u(1))) & MASK)
        return np.uint32(select((i & _u(1)) != _u(0), x1, x0))

    @jit
    def unit53(x0, x1):  # type: ignore[no-untyped-def]
        """53 of the 64 bits, as an integer in [0, 2^53)."""
        return (x0 << _u(21)) | (x1 >> _u(11))

    @jit
    def uniform_f64(k0, k1, i):  # type: ignore[no-untyped-def]
        """A float64 in [0, 1), a multiple of 2^-53, from block (0, i)."""
        x0, x1 = threefry2x32(k0, k1, _u(0), i)
        return np.float64(unit53(x0, x1)) * TWO_M53

    @jit
    def uniform_f32(k0, k1, i):  # type: ignore[no-untyped-def]
        """A float32 in [0, 1), a multiple of 2^-24, from block (0, i)."""
        x0, x1 = threefry2x32(k0, k1, _u(0), i)
        return np.float32(np.float64(x0 >> _u(8)) * TWO_M24)

    @jit
    def log_mantissa(e, f):  # type: ignore[no-untyped-def]
        """(k, ln g) with e ln 2 + ln f = k ln 2 + ln g, for f in [1, 2)."""
        big = f > SQRT2
        f = select(big, f * 0.5, f)
        k = e + select(big, 1.0, 0.0)
        s = (f - 1.0) / (f + 1.0)  # |s| < 0.172: ln f = 2 atanh(s), a fast series
        z = s * s
        p = 0.0 * z
        for c in ATANH:
            p = p * z + c
        return k, 2.0 * s * (1.0 + z * p)

    @jit
    def log_int(n):  # type: ignore[no-untyped-def]
        """(k, ln f) with ln n = k ln 2 + ln f, for integers 1 <= n <= 2^53 (uint64)."""
        e = n - n  # zero, of n's type
        t = n
        for s in (32, 16, 8, 4, 2, 1):  # e = floor(log2 n), branch-free
            shift = select((t >> _u(s)) != _u(0), _u(s), _u(0))
            t = t >> shift
            e = e + shift
        f = np.float64(n) / np.float64(_u(1) << e)  # exact: in [1, 2)
        return log_mantissa(np.float64(e), f)

    @jit
    def log_unit(n, bits):  # type: ignore[no-untyped-def]
        """ln(n 2^-bits) for integers 1 <= n <= 2^53, with no cancellation near n = 2^bits."""
        k, log_f = log_int(n)
        k = k - bits  # exact
        return k * LN2_HI + (k * LN2_LO + log_f)

    @jit
    def log_float(x):  # type: ignore[no-untyped-def]
        """ln x for a float64 x >= 0 (-inf at 0)."""
        small = x < 2.0**-1000  # subnormals: into the normal range first
        y = select(small, x * 2.0**100, x)
        e = select(small, -100.0, 0.0)
        for j in range(len(SHIFTS)):  # y into [1, 2), e its binary exponent
            big = y >= POW2[j]
            y = select(big, y * INV_POW2[j], y)
            e = select(big, e + SHIFTS[j], e)
            low = y < HALF_POW2[j]
            y = select(low, y * POW2[j], y)
            e = select(low, e - SHIFTS[j], e)
        k, log_f = log_mantissa(e, y)
        return select(x > 0.0, k * LN2_HI + (k * LN2_LO + log_f), -np.inf)

    @jit
    def exp_float(x):  # type: ignore[no-untyped-def]
        """exp x for a float64 x <= 709 (0 below -746)."""
        x = select(x < -746.0, -746.0, x)
        k = np.floor(x * INV_LN2 + 0.5)
        r = (x - k * LN2_HI) - k * LN2_LO  # |r| <= 0.35; k LN2_HI is exact
        y = 0.0 * r
        for c in EXP:
            y = y * r + c
        for j in range(len(SHIFTS)):  # times 2^k, by exact steps
            up = k >= SHIFTS[j]
            y = select(up, y * POW2[j], y)
            k = select(up, k - SHIFTS[j], k)
        for j in range(len(DOWN)):
            down = k <= -DOWN[j]
            y = select(down, y * INV_POW2_DOWN[j], y)
            k = select(down, k + DOWN[j], k)
        return select(x > -746.0, y, 0.0)

    @jit
    def sincos_turns(u):  # type: ignore[no-untyped-def]
        """(cos(2 pi u), sin(2 pi u)) for u in [0, 1), reduced exactly by quarter turns."""
        t = 4.0 * u
        q = np.floor(t)
        r = t - q
        near = r <= 0.5
        x = HALF_PI * select(near, r, 1.0 - r)  # in [0, pi/4]
        z = x * x
        c = 1.0 + 0.0 * z
        s = c
        for j in range(len(COS)):  # Taylor series, to ~1e-18 on [0, pi/4]
            c = 1.0 - c * z * COS[j]
            s = 1.0 - s * z * SIN[j]
        s = s * x
        cos_r = select(near, c, s)  # cos(pi/2 r)
        sin_r = select(near, s, c)  # sin(pi/2 r)
        # Quarter turn q: (cos, sin) is (c, s), (-s, c), (-c, -s), (s, -c) of (cos_r, sin_r).
        upper = select(q == 1.0, -sin_r, select(q == 2.0, -cos_r, sin_r))
        cos_u = select(q == 0.0, cos_r, upper)
        upper = select(q == 1.0, cos_r, select(q == 2.0, -sin_r, -cos_r))
        return cos_u, select(q == 0.0, sin_r, upper)

    @jit
    def cos_turns(u):  # type: ignore[no-untyped-def]
        """cos(2 pi u) for u in [0, 1)."""
        return sincos_turns(u)[0]

    @jit
    def box_muller(n, bits, u):  # type: ignore[no-untyped-def]
        """sqrt(-2 ln(n 2^-bits)) cos(2 pi u): a standard normal from n in [1, 2^bits] and
        u in [0, 1)."""
        return np.sqrt(-2.0 * log_unit(n, bits)) * cos_turns(u)

    @jit
    def normal_at(k0, k1, stream, i):  # type: ignore[no-untyped-def]
        """A standard normal float64 from blocks (stream, i) and (stream + 1, i)."""
        x0, x1 = threefry2x32(k0, k1, stream, i)
        y0, y1 = threefry2x32(k0, k1, stream + _u(1), i)
        n = (_u(1) << _u(53)) - unit53(x0, x1)
        return box_muller(n, 53.0, np.float64(unit53(y0, y1)) * TWO_M53)

    @jit
    def normal_pair_f64(k0, k1, j):  # type: ignore[no-untyped-def]
        """Standard normals 2j and 2j + 1 (float64): one Box-Muller pair, r cos and r sin
        of the angle, from blocks (0, j) (the radius, 53 bits) and (1, j) (the angle)."""
        x0, x1 = threefry2x32(k0, k1, _u(0), j)
        y0, y1 = threefry2x32(k0, k1, _u(1), j)
        r = np.sqrt(-2.0 * log_unit((_u(1) << _u(53)) - unit53(x0, x1), 53.0))
        c, s = sincos_turns(np.float64(unit53(y0, y1)) * TWO_M53)
        return r * c, r * s

    @jit
    def normal_f64(k0, k1, i):  # type: ignore[no-untyped-def]
        """Standard normal i (float64): a half of pair i // 2. Loops over consecutive
        elements call normal_pair_f64 once per two elements instead (codegen.pairs)."""
        z0, z1 = normal_pair_f64(k0, k1, i >> _u(1))
        return select((i & _u(1)) != _u(0), z1, z0)

    @jit
    def log_odd_f32(m):  # type: ignore[no-untyped-def]
        """ln(m 2^-32) in float32 for an odd integer m < 2^32, with no cancellation near
        m = 2^32: m = 2^k (1 + t), t from an exact integer difference, ln(1 + t) =
        2 atanh(t / (2 + t)) for t in [sqrt(1/2) - 1, sqrt(2) - 1]. Words in uint32."""
        m = np.uint32(m)
        e = np.uint32(0)
        scale = _f(1.0)  # 2^-e
        t = m
        for j in range(len(LOG_STEPS)):  # e = floor(log2 m), branch-free
            up = np.uint32(t >> np.uint32(LOG_STEPS[j])) != np.uint32(0)
            t = select(up, np.uint32(t >> np.uint32(LOG_STEPS[j])), t)
            e = select(up, np.uint32(e + np.uint32(LOG_STEPS[j])), e)
            scale = select(up, scale * INV_POW2_F32[j], scale)
        top = np.uint32(np.uint32(1) << e)  # 2^e
        d = np.uint32(m - top)  # m - 2^e, below 2^31
        low = _f(np.int32(d)) * scale  # in [0, 1)
        big = low > SQRT2_M1_F32
        high = _f(np.int32(np.uint32(d - top))) * (scale * _f(0.5))  # m - 2^(e+1) < 0
        t = select(big, high, low)
        k = _f(np.int32(e)) + select(big, _f(1.0), _f(0.0)) - _f(32.0)
        s = t / (_f(2.0) + t)
        z = s * s
        p = _f(0.0) * z
        for c in ATANH_F32:
            p = p * z + c
        return k * LN2_HI_F32 + (k * LN2_LO_F32 + _f(2.0) * s * (_f(1.0) + z * p))

    @jit
    def cos_turns_f32(u):  # type: ignore[no-untyped-def]
        """cos(2 pi u) in float32 for u in [0, 1), reduced exactly by quarter turns."""
        t = _f(4.0) * u
        q = np.floor(t)
        r = t - q
        near = r <= _f(0.5)
        x = HALF_PI_F32 * select(near, r, _f(1.0) - r)
        z = x * x
        c = _f(1.0) + _f(0.0) * z
        s = c
        for j in range(len(COS_F32)):
            c = _f(1.0) - c * z * COS_F32[j]
            s = _f(1.0) - s * z * SIN_F32[j]
        s = s * x
        cos_r = select(near, c, s)
        sin_r = select(near, s, c)
        upper = select(q == _f(1.0), _f(0.0) - sin_r, select(q == _f(2.0), _f(0.0) - cos_r, sin_r))
        return select(q == _f(0.0), cos_r, upper)

    @jit
    def normal_f32(k0, k1, i):  # type: ignore[no-untyped-def]
        """A standard normal float32 from block (0, i), Box-Muller in float32: the radius
        from 31 bits of the first word (u = (2n + 1) 2^-32), the angle from 24 of the
        second."""
        x0, x1 = threefry2x32(k0, k1, _u(0), i)
        log_u = log_odd_f32(((x0 >> _u(1)) << _u(1)) | _u(1))
        u = _f(np.int32(x1 >> _u(8))) * _f(TWO_M24)
        return np.sqrt(_f(-2.0) * log_u) * cos_turns_f32(u)

    @jit
    def log_uniform(k0, k1, stream, i):  # type: ignore[no-untyped-def]
        """ln u for a uniform u in (0, 1], a multiple of 2^-53, from block (stream, i)."""
        x0, x1 = threefry2x32(k0, k1, stream, i)
        return log_unit((_u(1) << _u(53)) - unit53(x0, x1), 53.0)

    @jit
    def exponential_f64(k0, k1, i):  # type: ignore[no-untyped-def]
        """A standard exponential float64, -ln u, from block (0, i)."""
        return 0.0 - log_uniform(k0, k1, _u(0), i)

    @jit
    def exponential_f32(k0, k1, i):  # type: ignore[no-untyped-def]
        return np.float32(exponential_f64(k0, k1, i))

    @jit
    def gamma_f64(k0, k1, i, a):  # type: ignore[no-untyped-def]
        """A Gamma(a, 1) float64 (Marsaglia and Tsang, 2000): d v for the first trial whose
        normal x gives v = (1 + x / sqrt(9 d))^3 > 0 and whose uniform u has
        ln u < x^2 / 2 + d - d v + d ln v, with d = a - 1/3; for a < 1, a Gamma(a + 1)
        sample times u^(1/a). NaN where a is not positive and finite."""
        boost = a < 1.0
        d = select(boost, a + 1.0, a) - 1.0 / 3.0
        c = 1.0 / np.sqrt(9.0 * select(d > 0.0, d, 1.0))
        done = np.logical_not((a > 0.0) & (a < np.inf))
        z = np.nan + 0.0 * a
        t = 0
        while not every(done) and t < GAMMA_TRIALS:
            stream = _u(GAMMA_STREAM + 1 + 3 * t)
            x = normal_at(k0, k1, stream, i)
            v = 1.0 + c * x
            v = v * v * v
            v_ok = select(v > 0.0, v, 1.0)
            log_u = log_uniform(k0, k1, stream + _u(2), i)
            accept = (v > 0.0) & (log_u < 0.5 * x * x + d - d * v_ok + d * log_float(v_ok))
            z = select(accept & np.logical_not(done), d * v_ok, z)
            done = done | accept
            t += 1
        if every(np.logical_not(boost)):  # no a below 1 (a kernel's one element): no boost
            return z
        scale = exp_float(log_uniform(k0, k1, _u(GAMMA_STREAM), i) / select(boost, a, 1.0))
        return select(boost, z * scale, z)

    @jit
    def gamma_f32(k0, k1, i, a):  # type: ignore[no-untyped-def]
        return np.float32(gamma_f64(k0, k1, i, np.float64(a)))

    return {
        "exponential_f64": exponential_f64,
        "exponential_f32": exponential_f32,
        "gamma_f64": gamma_f64,
        "gamma_f32": gamma_f32,
        "log_float": log_float,
        "exp_float": exp_float,
        "threefry2x32": threefry2x32,
        "bits32": bits32,
        "uniform_f64": uniform_f64,
        "uniform_f32": uniform_f32,
        "normal_f64": normal_f64,
        "normal_pair_f64": normal_pair_f64,
        "normal_f32": normal_f32,
        "log_int": log_int,
        "cos_turns": cos_turns,
        "sincos_turns": sincos_turns,
        "log_odd_f32": log_odd_f32,
        "cos_turns_f32": cos_turns_f32,
    }


def _select(c, a, b):  # type: ignore[no-untyped-def]
    return a if c else b


def _where(c: Any, a: Any, b: Any) -> Any:
    # np.where would promote a uint64 and a Python float differently from Numba: keep a's.
    return np.where(c, a, b).astype(np.result_type(a, b))


def _holds(c):  # type: ignore[no-untyped-def]
    return c


def _everywhere(c: Any) -> bool:
    return bool(np.all(c))


ARRAY = build(_where, _everywhere, lambda f: f)

# The names kernels import (codegen imports them from this module). Gamma's rejection loop
# does not vectorize, and inlined into every kernel it took minutes to compile: kernels call
# a separately compiled function for it instead.
INLINE_NAMES = (
    "bits32", "uniform_f64", "uniform_f32", "normal_f64", "normal_pair_f64", "normal_f32",
    "exponential_f64", "exponential_f32",
)  # fmt: skip
CALLED_NAMES = ("gamma_f64", "gamma_f32")
# An element function called rather than inlined, as name + "_call": a pair loop's odd last
# element (codegen.pairs) would otherwise inline a second copy of the whole sampler, which
# doubled the kernel's compile time. Same operations: the same bits.
CALLED_ALIASES = ("normal_f64_call",)
KERNEL_NAMES = INLINE_NAMES + CALLED_NAMES + CALLED_ALIASES


@functools.cache
def kernel_build() -> dict[str, Any]:
    """The inline Numba build, made when a kernel first imports one of its functions (on
    the compile thread: importing Numba costs more than all of fastgrad)."""
    import numba

    inline = numba.njit(inline="always")
    return build(inline(_select), inline(_holds), numba.njit(inline="always", error_model="numpy"))


@functools.cache
def called_build() -> dict[str, Any]:
    """The build whose functions kernels call rather than inline (gamma's), its machine
    code kept on disk like a kernel's (fastgrad.core.jit_hook): compiling it takes ~3 s
    of CPU, which a new process then saves."""
    jit = jit_hook.njit
    return build(jit("called")(_select), jit("called")(_holds), jit("called", error_model="numpy"))


def __getattr__(name: str) -> Any:
    if name in INLINE_NAMES:
        return kernel_build()[name]
    if name in CALLED_NAMES:
        return called_build()[name]
    if name in CALLED_ALIASES:
        return called_build()[name.removesuffix("_call")]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sample_array(
    name: str, key: np.ndarray, shape: tuple[int, ...], dtype: Any, *operands: np.ndarray
) -> np.ndarray:
    """Whole-array NumPy evaluation of the function `name` (e.g. "normal_f64"), with its
    elementwise `operands` (of `shape`) after the key and index."""
    index = np.arange(int(np.prod(shape)), dtype=np.uint64)
    flat = [np.ravel(x) for x in operands]
    with np.errstate(all="ignore"):
        out = ARRAY[name](_u(key[0]), _u(key[1]), index, *flat)
    return np.asarray(out, dtype).reshape(shape)


def bits_array(key: np.ndarray, base: Any, shape: tuple[int, ...], stream: int) -> np.ndarray:
    """Whole-array NumPy evaluation of `bits32`."""
    index = np.arange(int(np.prod(shape)), dtype=np.uint64)
    base = _u(np.asarray(base).item())
    out = ARRAY["bits32"](_u(key[0]), _u(key[1]), _u(stream), base, index)
    return np.asarray(out, np.uint32).reshape(shape)
