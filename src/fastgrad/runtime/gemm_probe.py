"""Where a single product may be cut into bands of C's rows or columns and keep its bits:
found on this machine's BLAS and CPU, not assumed (runtime.gemm_jobs.cut reads it, and
runtime.thread_budget.cut_pieces when a plan is built, by the same rule:
runtime.gemm_bands).

The cut (runtime.gemm_split) promises the bits of the uncut product on one BLAS thread
(the step runner's). Whether a band computes what the whole product computes in its rows
depends on the BLAS's kernels: OpenBLAS's micro-kernels sum an element over k in an
order that may differ between a tile of full width and a narrower tail, so a band edge
that falls inside one of the whole product's tiles changes bits there. The widths differ
per CPU: OpenBLAS's SkylakeX kernels (AVX-512) kept the bits of bands of rows or columns
at multiples of 16 where C's other dimension was a multiple of 16 (float64 products of
700 columns differed in their last 4 columns cut elsewhere); its Haswell kernels (AVX2,
OpenBLAS 0.3.31) change float32 row bands at multiples of 16 (a[:16] @ b differs from
(a @ b)[:16] in rows 12-15) but keep them at multiples of 12 whatever C's width, and
change float32 column bands at every multiple tried, while float64 keeps them at 16 on
both axes at any width: the probe answers (12, any width), never, (16, any), (16, any).

So for each dtype and axis the probe tries, for each candidate alignment in order of
preference, bands (2 and 3) at multiples of it over shapes whose other dimension of C is
a multiple of it, varying k (short, past OpenBLAS's k blocks), the cut axis (odd lengths,
past its row and column blocks) and the operands' transposes; it keeps the first
candidate under which every band keeps the whole product's bits, 0 where none does (that
axis is then never cut for that dtype). Then it asks the same of that alignment over the
shapes with C's other dimension not a multiple of it (ODD): where that holds too, the
cut takes products of any width along that axis, else only those whose other dimension
is a multiple of the alignment. It runs on one BLAS thread, once per machine (~100 ms of
CPU on the loaded AVX2 machine, ~60 ms of it for the alignments alone), and its answer
is stored in fastgrad's cache keyed by what decides it (the BLAS library's file, version
and kernels, the CPU, this module's source, the answer's layout): one damaged, stored
under another key or of another layout is probed again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.compiler import machine_code
from fastgrad.core.config import cache_dir

# Alignments in order of preference: 16 first (C's rows are most often a multiple of 16
# long), then what another kernel's tile may need (12: OpenBLAS's Haswell sgemm).
CANDIDATES = (16, 12, 24, 32, 48, 64)
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
ROWS, COLUMNS = 0, 1
# The probe's products: (length along the cut axis, the other dimension of C rounded up
# to a multiple of the alignment, k). The cut makes bands of at least 2^20 multiply-adds,
# above OpenBLAS's small-matrix path (100^3): so are the probe's bands.
SHAPES = (
    (1000, 96, 100),  # many tiles along the cut axis, past OpenBLAS's row blocks
    (333, 192, 300),  # odd length: the last band's tail is the whole product's
    (160, 96, 520),  # k past OpenBLAS's k blocks (several partial sums per element)
    (999, 96, 40),  # short k, a narrow other dimension
)
# The operands' layouts, one per shape in turn: (A transposed, B transposed).
FLIPS = ((False, False), (True, False), (False, True), (True, True))

# C's other dimension past a multiple of the alignment, per shape, where the probe asks
# whether it may be any length: never a multiple of 4, so of no candidate, and a
# kernel's narrower tail of several widths (odd ones, and 2 past a multiple of 4).
ODD = (5, 10, 7, 3)
# The stored answer's layout (`probe`): another is probed again.
FORMAT = "alignment and any other dimension, per dtype and axis"

Product = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _operand(rng: np.random.Generator, shape: tuple[int, int], dtype: Any, flip: bool) -> Any:
    """A random matrix of `shape` (uniform in [-1, 1): drawn in `dtype`, cheaper than
    normal numbers): C-contiguous, or the transposed view of one (BLAS's
    transpose flag, as the cut passes it)."""
    x = rng.random(shape[::-1] if flip else shape, dtype=dtype)
    x *= 2
    x -= 1
    return x.T if flip else x


def _bands_keep_bits(a: Any, b: Any, whole: Any, axis: int, align: int, product: Product) -> bool:
    """Whether 2 and 3 bands of `a @ b` along `axis` at multiples of `align` (the last
    taking the rest, as gemm_jobs.cut makes them) give `whole`'s bits."""
    size = whole.shape[axis]
    for bands in (2, 3):
        step = size // bands // align * align
        if step < align:
            continue
        edges = [step * i for i in range(bands)] + [size]
        for start, end in zip(edges, edges[1:], strict=False):
            if axis == ROWS:
                band, expected = product(a[start:end], b), whole[start:end]
            else:
                band, expected = product(a, b[:, start:end]), whole[:, start:end]
            if not np.array_equal(band, expected):
                return False
    return True


def alignment(dtype: Any, axis: int, product: Product = np.matmul) -> int:
    """The first of CANDIDATES at which bands of C's rows (`axis` ROWS) or columns keep
    the bits of `product` (one BLAS thread's matmul: the caller sets it) for `dtype`
    over SHAPES, C's other dimension a multiple of it; 0 where none does."""
    rng = np.random.default_rng(0)
    wholes: dict[tuple[int, ...], tuple[Any, Any, Any]] = {}
    for align in CANDIDATES:
        if _kept(rng, wholes, dtype, axis, align, False, product):
            return align
    return 0


def any_other(dtype: Any, axis: int, align: int, product: Product = np.matmul) -> bool:
    """Whether bands at multiples of `align` keep the bits of `product` also where C's
    other dimension is not a multiple of it (SHAPES' rounded up, plus ODD's)."""
    rng = np.random.default_rng(1)
    return _kept(rng, {}, dtype, axis, align, True, product)


def _kept(
    rng: np.random.Generator,
    wholes: dict[tuple[int, ...], tuple[Any, Any, Any]],
    dtype: Any,
    axis: int,
    align: int,
    odd: bool,
    product: Product,
) -> bool:
    """Whether bands at multiples of `align` keep the bits over SHAPES, C's other
    dimension rounded up to a multiple of `align` (plus ODD's, where `odd`; `wholes`: the
    products already computed, by shape)."""
    for index, (size, other, k) in enumerate(SHAPES):
        other = -(-other // align) * align + (ODD[index] if odd else 0)
        m, n = (size, other) if axis == ROWS else (other, size)
        key = (m, n, k, index)
        if key not in wholes:
            flip_a, flip_b = FLIPS[index % len(FLIPS)]
            a = _operand(rng, (m, k), dtype, flip_a)
            b = _operand(rng, (k, n), dtype, flip_b)
            wholes[key] = a, b, product(a, b)
        if not _bands_keep_bits(*wholes[key], axis, align, product):
            return False
    return True


def probe(product: Product = np.matmul) -> tuple[int, ...]:
    """Where bands keep the bits, in gemm_jobs' order: per dtype (float32, float64) and
    axis (C's rows, its columns), the alignment (0: never cut so) and whether C's other
    dimension may then be any length (1) or must be a multiple of it (0); on one BLAS
    thread."""
    from fastgrad.runtime.blas import OneThread

    found: list[int] = []
    with OneThread():
        for dtype in DTYPES:
            for axis in (ROWS, COLUMNS):
                align = alignment(dtype, axis, product)
                found += [align, int(align > 0 and any_other(dtype, axis, align, product))]
    return tuple(found)


def _key() -> bytes:
    """What decides the probe's answer: the BLAS library (file, version and build as it
    reports them, its kernels' core), the CPU, and this module's source."""
    from fastgrad.runtime.blas import library_identity

    return "\n".join(
        [
            FORMAT,
            library_identity(),
            np.__version__,
            machine_code._cpu(),
            machine_code.source_tag("gemm probe", __file__),
        ]
    ).encode()


def _path(key: bytes) -> Any:
    return cache_dir() / "gemm_probe" / f"{hashlib.sha256(key).hexdigest()[:40]}.json"


def _stored(key: bytes) -> tuple[int, ...] | None:
    """The stored answer for `key`, or None where there is none, or it is damaged or
    another key's (never trusted: then probed again)."""
    try:
        found = json.loads(machine_code.unsealed(key, _path(key).read_bytes()))
    except (OSError, ValueError):
        return None
    if not isinstance(found, list) or len(found) != 4 * len(DTYPES):
        return None
    if not all(type(g) is int for g in found):
        return None
    pairs = list(zip(found[::2], found[1::2], strict=True))
    if not all((g == 0 or g in CANDIDATES) and o in (0, int(g > 0)) for g, o in pairs):
        return None
    return tuple(found)


def measured() -> tuple[int, ...]:
    """The probe's answer for this machine: stored, else probed and stored."""
    key = _key()
    found = _stored(key)
    if found is None:
        found = probe()
        path = _path(key)
        try:
            machine_code.write_atomically(
                path, machine_code.sealed(key, json.dumps(found).encode())
            )
        except OSError as error:
            machine_code.cache_unusable(path, error)
    return found


_ANSWER: list[tuple[int, ...]] = []
_LOCK = machine_code.OnceLock()  # (made anew in a forked child: gemm_split resets there)


def alignments() -> tuple[int, ...]:
    """`measured()`, once per process."""
    if _ANSWER:
        return _ANSWER[0]
    with _LOCK:
        if not _ANSWER:
            _ANSWER.append(measured())
        return _ANSWER[0]
