"""The probe of the alignments at which bands of a product keep its bits
(runtime.gemm_probe): it rejects an alignment under which a band's bits change (a fake
product that sums a tile's tail in another order, as OpenBLAS's kernels do), keeps the
first that holds, and answers 0 where none does; it asks whether C's other dimension may
then be any length (a fake product that changes bits only where it is not a multiple of
4 is refused); its stored answer is used, and probed again where damaged, another key's
or of an older layout; the cut takes the answer in its state, and a plan's build reads
the same rule (thread_budget.cut_pieces against the interpreter's counters)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastgrad.compiler import machine_code
from fastgrad.runtime import gemm_probe, gemm_split, thread_budget
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


def _odd_tails(axis: int) -> Any:
    """A fake product tiled by 7 along `axis` (`_tiled`), but only where C's other
    dimension is not a multiple of 4 (a kernel's narrower tail in that dimension summing
    in another order): bands keep the bits where C's other dimension is a multiple of the
    alignment, not where it is any length."""
    tiled = _tiled(7, axis)

    def product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        c = tiled(a, b)
        if c.shape[1 - axis] % 4 == 0:
            return np.matmul(np.round(a * 8), np.round(b * 8))
        return c

    return product


@pytest.mark.parametrize("axis", [ROWS, COLUMNS])
def test_an_alignment_is_asked_whether_c_may_be_any_width(axis: int) -> None:
    """A product whose bands change bits only where C's other dimension is not a multiple
    of 4 keeps 16, but not at any width; one whose bands keep 12's bits whatever the
    width keeps them at any width too. The probe's answer says so per dtype and axis."""
    odd, tiled = _odd_tails(axis), _tiled(12, axis)
    for dtype in gemm_probe.DTYPES:
        assert gemm_probe.alignment(dtype, axis, odd) == 16
        assert not gemm_probe.any_other(dtype, axis, 16, odd)
        assert gemm_probe.any_other(dtype, axis, 12, tiled)
    found = gemm_probe.probe(odd)
    assert found[2 * axis : 2 * axis + 2] == (16, 0) == found[4 + 2 * axis : 6 + 2 * axis]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_the_answer_is_stored_and_a_damaged_one_probed_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes: list[int] = []
    answer = (12, 1, 0, 0, 16, 0, 16, 1)
    monkeypatch.setattr(gemm_probe, "probe", lambda: probes.append(1) or answer)
    assert gemm_probe.measured() == answer and len(probes) == 1
    assert gemm_probe.measured() == answer and len(probes) == 1  # stored
    (path,) = (cache / "gemm_probe").iterdir()
    key = gemm_probe._key()
    for blob in [
        path.read_bytes()[:-3],  # cut short
        machine_code.sealed(b"another machine", json.dumps([16, 1] * 4).encode()),
        machine_code.sealed(key, json.dumps([16, 1, 16, 1, 5, 1, 16, 1]).encode()),  # no candidate
        machine_code.sealed(key, json.dumps([16, 1, 0, 1, 16, 1, 16, 1]).encode()),  # never cut
        machine_code.sealed(key, json.dumps([16, 2, 16, 1, 16, 1, 16, 1]).encode()),
        machine_code.sealed(key, json.dumps([12, 0, 16, 16]).encode()),  # the older layout
        machine_code.sealed(key, b"[16, 16]"),
    ]:
        path.write_bytes(blob)
        probes.clear()
        assert gemm_probe.measured() == answer and probes == [1]  # probed again
        assert gemm_probe.measured() == answer and probes == [1]  # and stored


def test_the_key_holds_the_blas_the_cpu_and_the_probes_source() -> None:
    from fastgrad.runtime.blas import library_identity

    key = gemm_probe._key().decode()
    assert library_identity() in key and machine_code._cpu() in key
    assert machine_code.source_tag("gemm probe", gemm_probe.__file__) in key
    assert gemm_probe.FORMAT in key  # an answer of another layout is another key's


def test_this_machines_answer_keeps_the_bits() -> None:
    """The answer for NumPy's BLAS here, once per process: an alignment among the
    candidates, or 0, and whether C's other dimension may be any length, per dtype and
    axis."""
    found = gemm_probe.alignments()
    assert len(found) == 8
    for align, any_other in zip(found[::2], found[1::2], strict=True):
        assert (align == 0 or align in gemm_probe.CANDIDATES) and any_other in (0, int(align > 0))
    assert gemm_probe.alignments() is found


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or blas_address("gemm", np.dtype(np.float64)) is None,
    reason="products are cut on Linux with NumPy's OpenBLAS only",
)
@pytest.mark.usefixtures("split")
def test_the_cut_takes_the_alignments_in_its_state() -> None:
    """gemm_jobs.cut reads the probe's answer from the state: bands at multiples of the
    preferred axis's alignment, the other axis where that one may not be cut (no
    alignment, or C's 480 columns not a multiple of 64 and not allowed any length), whole
    where neither may (float64 here; the product of ones is exact however it is cut)."""
    from test_runtime_gemm_split import _table

    s = gemm_split.state()
    assert s is not None
    at = gemm_split.ALIGN + 4  # float64's rows and whether any width, then columns
    before = s[at : at + 4].copy()
    a, b, c = np.ones((1024, 64)), np.ones((64, 480)), np.zeros((1024, 480))
    try:
        for rule, axis in [
            ((24, 0, 0, 0), 0),
            ((0, 0, 16, 0), 1),
            ((64, 0, 16, 0), 1),
            ((64, 1, 16, 0), 0),  # 480 columns: any number
            ((0, 0, 0, 0), None),
        ]:
            s[at : at + 4] = rule
            jobs, c[:] = s[gemm_split.JOBS], 0
            _table(a, b, c, 0, cut=True)()
            assert np.all(c == 64)
            assert s[gemm_split.JOBS] == jobs + (axis is not None), rule
            if axis is not None:
                assert s[gemm_split.JOB + gemm_split.AXIS] == axis
                step = s[gemm_split.JOB + gemm_split.STEP]
                assert step > 0 and step % rule[2 * axis] == 0
    finally:
        s[at : at + 4] = before


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or blas_address("gemm", np.dtype(np.float64)) is None,
    reason="products are cut on Linux with NumPy's OpenBLAS only",
)
@pytest.mark.usefixtures("split")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_plans_build_reads_the_cuts_own_rule(dtype: Any) -> None:
    """thread_budget.cut_pieces, which decides whether a plan runs BLAS on one thread,
    says of each product what the interpreter's cut does with it (its counter of jobs):
    W4's two products, odd widths, a batch, one too small, one whose bands may change bits
    on this machine."""
    from test_runtime_gemm_split import _table

    s = gemm_split.state()
    assert s is not None
    rng = np.random.default_rng(2)
    shapes = [(256, 512, 784, 1), (784, 512, 256, 1), (1023, 701, 128, 1), (333, 70, 200, 1)]
    shapes += [(600, 1000, 64, 1), (64, 64, 64, 1), (64, 96, 128, 16)]
    for m, n, k, batch in shapes:
        batched = (batch,) if batch > 1 else ()
        a = rng.standard_normal((*batched, m, k)).astype(dtype)
        b = rng.standard_normal((*batched, k, n)).astype(dtype)
        jobs = s[gemm_split.JOBS]
        _table(a, b, np.empty((*batched, m, n), dtype), 0, cut=True)()
        cut = thread_budget.cut_pieces(dtype, m, n, k, batch) > 1
        assert s[gemm_split.JOBS] == jobs + cut, (m, n, k, batch)


@pytest.mark.skipif(not thread_budget.may_cut(), reason="products are not cut here")
def test_a_plan_keeps_blas_threads_for_a_product_the_cut_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bench W4's first product alone (no parallel kernels beside it): on one BLAS thread
    where the probe's answer lets the cut take it (rows at 12, C any width), on BLAS's own
    threads where no band keeps its bits (then it runs as NumPy runs it, not on one core).
    Lowered only: no memory needed."""
    import fastgrad as fg
    import fastgrad.numpy as fnp

    ones = np.broadcast_to(np.float32(1), (256, 784)), np.broadcast_to(np.float32(1), (784, 512))
    for answer, one in [((12, 1, 0, 0, 16, 1, 16, 1), True), ((0,) * 8, False)]:
        monkeypatch.setattr(gemm_probe, "_ANSWER", [answer])
        plan = fg.jit(lambda x, w: fnp.sum(x @ w)).lower(*ones).executable
        assert plan.one_blas_thread == one, answer
