"""Where a single product may be cut into bands of C's rows or columns and keep its bits:
found on this machine's BLAS and CPU, not assumed (runtime.gemm_jobs.cut reads it).

The cut (runtime.gemm_split) promises the bits of the uncut product on one BLAS thread
(the step runner's). Whether a band computes what the whole product computes in its rows
depends on the BLAS's kernels: OpenBLAS's micro-kernels sum an element over k in an
order that may differ between a tile of full width and a narrower tail, so a band edge
that falls inside one of the whole product's tiles changes bits there. The widths differ
per CPU: OpenBLAS's SkylakeX kernels kept the bits of bands of rows or columns at
multiples of 16 where C's rows were a multiple of 16 long; its Haswell kernels (AVX2)
change float32 row bands at multiples of 16 (a[:16] @ b differs from (a @ b)[:16] in
rows 12-15) but keep them at multiples of 12, and change float32 column bands at every
multiple tried, while float64 keeps them at 16 either way.

So for each dtype and axis the probe tries the cut's own rule, C's other dimension a
multiple of an alignment and bands (2 and 3) at multiples of it, for each candidate in
order of preference, over shapes that vary k (short, past OpenBLAS's k blocks), the cut
axis (odd lengths, past its row and column blocks) and the operands' transposes, and
keeps the first candidate under which every band keeps the whole product's bits, 0 where
none does (that axis is then never cut for that dtype). It runs on one BLAS thread, once
per process when the cut's state is made (~45 ms of CPU on the AVX2 machine), and its
answer is stored in fastgrad's cache keyed by what decides it (the BLAS library's file,
version and kernels, the CPU, this module's source): one damaged or stored under another
key is probed again.
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
    over SHAPES; 0 where none does."""
    rng = np.random.default_rng(0)
    wholes: dict[tuple[int, ...], tuple[Any, Any, Any]] = {}
    for align in CANDIDATES:
        kept = True
        for index, (size, other, k) in enumerate(SHAPES):
            other = -(-other // align) * align
            m, n = (size, other) if axis == ROWS else (other, size)
            key = (m, n, k, index)
            if key not in wholes:
                flip_a, flip_b = FLIPS[index % len(FLIPS)]
                a = _operand(rng, (m, k), dtype, flip_a)
                b = _operand(rng, (k, n), dtype, flip_b)
                wholes[key] = a, b, product(a, b)
            if not _bands_keep_bits(*wholes[key], axis, align, product):
                kept = False
                break
        if kept:
            return align
    return 0


def probe(product: Product = np.matmul) -> tuple[int, ...]:
    """The alignments of bands that keep the bits, in gemm_jobs' order (float32 rows,
    float32 columns, float64 rows, float64 columns), on one BLAS thread."""
    from fastgrad.runtime.blas import OneThread

    with OneThread():
        return tuple(alignment(dtype, axis, product) for dtype in DTYPES for axis in (0, 1))


def _key() -> bytes:
    """What decides the probe's answer: the BLAS library (file, version and build as it
    reports them, its kernels' core), the CPU, and this module's source."""
    from fastgrad.runtime.blas import library_identity

    return "\n".join(
        [
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
    ok = isinstance(found, list) and len(found) == 2 * len(DTYPES)
    if not ok or not all(type(g) is int and (g == 0 or g in CANDIDATES) for g in found):
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
