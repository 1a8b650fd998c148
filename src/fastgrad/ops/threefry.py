"""Threefry-2x32 and the maps from its bits to numbers, written once and built twice.

Fused kernels call the inline Numba build (`uniform_f64`, `normal_f32`, ...) once per
element, the counter being the element's flat index; the random primitives' reference
implementations run the NumPy build of the same source over whole arrays. Both use integer
operations, + - * /, sqrt, floor and selects only, each correctly rounded (no libm call, no
fused multiply-add), so a key gives bit-identical numbers on every path, and loops vectorize.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

_u = np.uint64
MASK = _u(0xFFFFFFFF)
PARITY = _u(0x1BD11BDA)  # Threefry's key-schedule constant
TWO_M53 = 2.0**-53
TWO_M32 = 2.0**-32
TWO_M24 = 2.0**-24
LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that k * LN2_HI is exact for small k
LN2_LO = 1.90821492927058770002e-10
HALF_PI = 1.5707963267948966
SQRT2 = 1.4142135623730951
# Series coefficients: 1/(2j+1) for ln's atanh series, 1/(k(k-1)) and 1/(k(k+1)) for cos, sin.
ATANH = tuple(1.0 / c for c in range(25, 2, -2))
COS = tuple(1.0 / (k * (k - 1)) for k in range(18, 0, -2))
SIN = tuple(1.0 / (k * (k + 1)) for k in range(18, 0, -2))

# Words are held in uint64 and masked to 32 bits: Numba widens uint32 arithmetic to 64 bits,
# and NumPy's uint64 arrays then compute exactly what the kernels do.


def build(select: Callable[..., Any], jit: Callable[[Any], Any]) -> dict[str, Any]:
    """The functions, by name, with `select(c, a, b)` for "a where c else b" and each one
    passed through `jit` (Numba's inline njit, or the identity for NumPy arrays)."""

    @jit
    def rotl(x, r):  # type: ignore[no-untyped-def]
        return ((x << _u(r)) | (x >> _u(32 - r))) & MASK

    @jit
    def four_rounds(x0, x1, a, b, c, d):  # type: ignore[no-untyped-def]
        x0 = (x0 + x1) & MASK
        x1 = rotl(x1, a) ^ x0
        x0 = (x0 + x1) & MASK
        x1 = rotl(x1, b) ^ x0
        x0 = (x0 + x1) & MASK
        x1 = rotl(x1, c) ^ x0
        x0 = (x0 + x1) & MASK
        x1 = rotl(x1, d) ^ x0
        return x0, x1

    @jit
    def threefry2x32(k0, k1, c0, c1):  # type: ignore[no-untyped-def]
        """Threefry-2x32 with 20 rounds (Salmon et al., SC'11): key (k0, k1), counter
        (c0, c1), 32-bit values held in uint64; gives the two 32-bit output words."""
        k2 = k0 ^ k1 ^ PARITY
        x0 = (c0 + k0) & MASK
        x1 = (c1 + k1) & MASK
        # Rotations (13, 15, 26, 6) and (17, 29, 16, 24) alternate; the key is injected,
        # with the injection count added, after every four rounds.
        x0, x1 = four_rounds(x0, x1, 13, 15, 26, 6)
        x0, x1 = (x0 + k1) & MASK, (x1 + k2 + _u(1)) & MASK
        x0, x1 = four_rounds(x0, x1, 17, 29, 16, 24)
        x0, x1 = (x0 + k2) & MASK, (x1 + k0 + _u(2)) & MASK
        x0, x1 = four_rounds(x0, x1, 13, 15, 26, 6)
        x0, x1 = (x0 + k0) & MASK, (x1 + k1 + _u(3)) & MASK
        x0, x1 = four_rounds(x0, x1, 17, 29, 16, 24)
        x0, x1 = (x0 + k1) & MASK, (x1 + k2 + _u(4)) & MASK
        x0, x1 = four_rounds(x0, x1, 13, 15, 26, 6)
        x0, x1 = (x0 + k2) & MASK, (x1 + k0 + _u(5)) & MASK
        return x0, x1

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
    def log_int(n):  # type: ignore[no-untyped-def]
        """(k, ln f) with ln n = k ln 2 + ln f, for integers 1 <= n <= 2^53 (uint64)."""
        e = n - n  # zero, of n's type
        t = n
        for s in (32, 16, 8, 4, 2, 1):  # e = floor(log2 n), branch-free
            shift = select((t >> _u(s)) != _u(0), _u(s), _u(0))
            t = t >> shift
            e = e + shift
        f = np.float64(n) / np.float64(_u(1) << e)  # exact: in [1, 2)
        big = f > SQRT2
        f = select(big, f * 0.5, f)
        k = np.float64(e) + select(big, 1.0, 0.0)
        s = (f - 1.0) / (f + 1.0)  # |s| < 0.172: ln f = 2 atanh(s), a fast series
        z = s * s
        p = 0.0 * z
        for c in ATANH:
            p = p * z + c
        return k, 2.0 * s * (1.0 + z * p)

    @jit
    def cos_turns(u):  # type: ignore[no-untyped-def]
        """cos(2 pi u) for u in [0, 1), reduced exactly by quarter turns."""
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
        upper = select(q == 1.0, -sin_r, select(q == 2.0, -cos_r, sin_r))
        return select(q == 0.0, cos_r, upper)

    @jit
    def box_muller(n, bits, u):  # type: ignore[no-untyped-def]
        """sqrt(-2 ln(n 2^-bits)) cos(2 pi u): a standard normal from n in [1, 2^bits] and
        u in [0, 1)."""
        k, log_f = log_int(n)
        k = k - bits  # exact, so no cancellation near n = 2^bits
        return np.sqrt(-2.0 * (k * LN2_HI + (k * LN2_LO + log_f))) * cos_turns(u)

    @jit
    def normal_f64(k0, k1, i):  # type: ignore[no-untyped-def]
        """A standard normal float64 from blocks (0, i) and (1, i): 53 bits per uniform."""
        x0, x1 = threefry2x32(k0, k1, _u(0), i)
        y0, y1 = threefry2x32(k0, k1, _u(1), i)
        n = (_u(1) << _u(53)) - unit53(x0, x1)
        return box_muller(n, 53.0, np.float64(unit53(y0, y1)) * TWO_M53)

    @jit
    def normal_f32(k0, k1, i):  # type: ignore[no-untyped-def]
        """A standard normal float32 from block (0, i): 32 bits per uniform."""
        x0, x1 = threefry2x32(k0, k1, _u(0), i)
        n = (_u(1) << _u(32)) - x0
        return np.float32(box_muller(n, 32.0, np.float64(x1) * TWO_M32))

    return {
        "threefry2x32": threefry2x32,
        "bits32": bits32,
        "uniform_f64": uniform_f64,
        "uniform_f32": uniform_f32,
        "normal_f64": normal_f64,
        "normal_f32": normal_f32,
        "log_int": log_int,
        "cos_turns": cos_turns,
    }


def _select(c, a, b):  # type: ignore[no-untyped-def]
    return a if c else b


def _where(c: Any, a: Any, b: Any) -> Any:
    # np.where would promote a uint64 and a Python float differently from Numba: keep a's.
    return np.where(c, a, b).astype(np.result_type(a, b))


ARRAY = build(_where, lambda f: f)

# The names kernels import (codegen imports them from this module).
KERNEL_NAMES = ("bits32", "uniform_f64", "uniform_f32", "normal_f64", "normal_f32")


@functools.cache
def kernel_build() -> dict[str, Any]:
    """The inline Numba build, made when a kernel first imports one of its functions (on
    the compile thread: importing Numba costs more than all of fastgrad)."""
    import numba

    inline = numba.njit(inline="always", error_model="numpy")
    return build(numba.njit(inline="always")(_select), inline)


def __getattr__(name: str) -> Any:
    if name in KERNEL_NAMES:
        return kernel_build()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sample_array(name: str, key: np.ndarray, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Whole-array NumPy evaluation of the function `name` (e.g. "normal_f64")."""
    index = np.arange(int(np.prod(shape)), dtype=np.uint64)
    with np.errstate(all="ignore"):
        out = ARRAY[name](_u(key[0]), _u(key[1]), index)
    return np.asarray(out, dtype).reshape(shape)


def bits_array(key: np.ndarray, base: Any, shape: tuple[int, ...], stream: int) -> np.ndarray:
    """Whole-array NumPy evaluation of `bits32`."""
    index = np.arange(int(np.prod(shape)), dtype=np.uint64)
    base = _u(np.asarray(base).item())
    out = ARRAY["bits32"](_u(key[0]), _u(key[1]), _u(stream), base, index)
    return np.asarray(out, np.uint32).reshape(shape)
