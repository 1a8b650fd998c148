"""The probe of the alignments at which bands of a product keep its bits
(runtime.gemm_probe): it rejects an alignment under which a band's bits change (a fake
product that sums a tile's tail in another order, as OpenBLAS's kernels do), keeps the
first that holds, and answers 0 where none does; its stored answer is used, and probed
again where damaged or another key's; the cut takes the alignments in its state."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastgrad.compiler import machine_code
from fastgrad.runtime import gemm_probe, gemm_split
from fastgrad.runtime.blas import blas_address
from fastgrad.runtime.gemm_probe import COLUMNS, ROWS
from test_runtime_gemm_split import split  # noqa: F401 - a fixture


def _tiled(tile: int, axis: int) -> Any:
    """A fake product, the same on every CPU: exact (the operands rounded to multiples of
    1/8: every sum is exact in float32), but with its rows (axis ROWS) or columns past
    the last whole `tile` of its own C one ulp off, as a kernel's narrower tail that
    sums in another order may be: a band that ends inside one of the whole product's
    tiles changes bits there."""

    def product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        c = np.matmul(np.round(a * 8), np.round(b * 8))
        size = c.shape[axis]
        tail = (slice(size // tile * tile, size), slice(None))[:: 1 if axis == ROWS else -1]
        c[tail] = np.nextafter(c[tail], np.inf)
        return c

    return product


@pytest.mark.parametrize("axis", [ROWS, COLUMNS])
def test_the_probe_rejects_an_alignment_that_changes_bits(axis: int) -> None:
    """Tiles of 12 along the cut axis: bands at multiples of 16 change the bits of the
    rows (columns) at their edges, so 16 is rejected and 12, the next candidate, kept;
    the other axis is not affected by this product and keeps 16."""
    product = _tiled(12, axis)
    rng = np.random.default_rng(0)
    a, b = rng.random((40, 300), np.float32), rng.random((300, 40), np.float32)
    assert np.array_equal(product(a[:24], b[:, :24]), product(a, b)[:24, :24])
    band = product(a[:16], b) if axis == ROWS else product(a, b[:, :16])
    whole = product(a, b)[:16] if axis == ROWS else product(a, b)[:, :16]
    assert not np.array_equal(band, whole)  # else the fake shows nothing
    for dtype in gemm_probe.DTYPES:
        assert gemm_probe.alignment(dtype, axis, product) == 12
        assert gemm_probe.alignment(dtype, 1 - axis, product) == 16


def test_an_axis_no_alignment_keeps_is_never_cut() -> None:
    """Tiles of 7 (no candidate is a multiple of 7): 0, that axis is never cut."""
    assert gemm_probe.alignment(np.float32, COLUMNS, _tiled(7, COLUMNS)) == 0


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_the_answer_is_stored_and_a_damaged_one_probed_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes: list[int] = []
    monkeypatch.setattr(gemm_probe, "probe", lambda: probes.append(1) or (12, 0, 16, 16))
    assert gemm_probe.measured() == (12, 0, 16, 16) and len(probes) == 1
    assert gemm_probe.measured() == (12, 0, 16, 16) and len(probes) == 1  # stored
    (path,) = (cache / "gemm_probe").iterdir()
    key = gemm_probe._key()
    for blob in [
        path.read_bytes()[:-3],  # cut short
        machine_code.sealed(b"another machine", json.dumps([16, 16, 16, 16]).encode()),
        machine_code.sealed(key, json.dumps([16, 16, 5, 16]).encode()),  # no candidate
        machine_code.sealed(key, b"[16, 16]"),
    ]:
        path.write_bytes(blob)
        probes.clear()
        assert gemm_probe.measured() == (12, 0, 16, 16) and probes == [1]  # probed again
        assert gemm_probe.measured() == (12, 0, 16, 16) and probes == [1]  # and stored


def test_the_key_holds_the_blas_the_cpu_and_the_probes_source() -> None:
    from fastgrad.runtime.blas import library_identity

    key = gemm_probe._key().decode()
    assert library_identity() in key and machine_code._cpu() in key
    assert machine_code.source_tag("gemm probe", gemm_probe.__file__) in key


def test_this_machines_answer_keeps_the_bits() -> None:
    """The answer for NumPy's BLAS here, once per process: an alignment among the
    candidates, or 0, per dtype and axis."""
    found = gemm_probe.alignments()
    assert len(found) == 4 and all(g == 0 or g in gemm_probe.CANDIDATES for g in found)
    assert gemm_probe.alignments() is found


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or blas_address("gemm", np.dtype(np.float64)) is None,
    reason="products are cut on Linux with NumPy's OpenBLAS only",
)
@pytest.mark.usefixtures("split")
def test_the_cut_takes_the_alignments_in_its_state() -> None:
    """gemm_jobs.cut reads the alignments from the state: bands at multiples of the
    preferred axis's, the other axis where that one may not be cut (no alignment, or C's
    480 columns not a multiple of 64), whole where neither may (float64 here; the product
    of ones is exact however it is cut)."""
    from test_runtime_gemm_split import _table

    s = gemm_split.state()
    assert s is not None
    at = gemm_split.ALIGN + 2  # float64's rows, then columns
    before = s[at : at + 2].copy()
    a, b, c = np.ones((1024, 64)), np.ones((64, 480)), np.zeros((1024, 480))
    try:
        for rows, columns, axis in [(24, 0, 0), (0, 16, 1), (64, 16, 1), (0, 0, None)]:
            s[at], s[at + 1] = rows, columns
            jobs, c[:] = s[gemm_split.JOBS], 0
            _table(a, b, c, 0, cut=True)()
            assert np.all(c == 64)
            assert s[gemm_split.JOBS] == jobs + (axis is not None), (rows, columns)
            if axis is not None:
                assert s[gemm_split.JOB + gemm_split.AXIS] == axis
                step = s[gemm_split.JOB + gemm_split.STEP]
                assert step > 0 and step % (rows, columns)[axis] == 0
    finally:
        s[at : at + 2] = before
