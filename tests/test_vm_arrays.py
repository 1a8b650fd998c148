"""The plan interpreter's rows for a scan's work around its loop (runtime.vm_arrays): COPY
of any strides into a C-contiguous array, ADD, SUM over leading axes, each row run alone
in a table and checked bit for bit against the NumPy call it stands for (the rows must
give the step runner's bits: runtime.loop_row). Hypothesis examples, ~2 s warm."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fastgrad.runtime.vm import pack, run_steps
from fastgrad.runtime.vm_arrays import ADD, COPY, SUM
from fastgrad.runtime.vm_vectors import vector_function

DTYPES = [np.float32, np.float64, np.int32, np.bool_]


def _run(row: list[int], *arrays: np.ndarray) -> None:
    """Run `row` alone, its pointers 0, 1, ... the addresses of `arrays` (handed over as
    bytes, one kind of tuple for the interpreter whatever their dtypes and ranks)."""
    table, at = pack(
        row, [0], [vector_function()], len(arrays), [], [[0, 1, len(arrays), *range(len(arrays))]]
    )
    run_steps(table, at[0], tuple(_bytes(x) for x in arrays))


def _bytes(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1).view(np.uint8) if x.size else np.zeros(1, np.uint8)


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=4),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_copy_gives_numpys_contiguous_copy(shape: list[int], dtype: Any, seed: int) -> None:
    """A transposed (or sliced, strided) view copied C-contiguous: what
    `np.ascontiguousarray` gives, bit for bit (NaNs' payloads too)."""
    rng = np.random.default_rng(seed)
    x = np.asarray(rng.standard_normal(shape) * 4).astype(dtype)
    if dtype == np.float32 and x.size:
        x.reshape(-1)[0] = np.frombuffer(np.uint32(0x7FC00123).tobytes(), np.float32)[0]
    axes = tuple(rng.permutation(len(shape)))
    view = x.transpose(axes)
    if view.ndim and view.shape[-1] > 1:
        view = view[..., ::2]  # a stride no transpose gives
    if view.size == 0:
        return
    want = np.ascontiguousarray(view)
    out = np.full_like(want, 1)
    offset = view.ctypes.data - x.ctypes.data
    assert offset == 0
    row = [COPY, 0, view.ndim, view.itemsize, 0, 1, *view.shape, *view.strides]
    _run(row, x, out)
    assert out.tobytes() == want.tobytes()


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 300), double=st.booleans(), seed=st.integers(0, 2**16))
def test_add_gives_numpys_sums(n: int, double: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    dtype = np.float64 if double else np.float32
    a, b = (
        (rng.standard_normal(n) * 10 ** rng.uniform(-3, 3, n)).astype(dtype),
        rng.standard_normal(n).astype(dtype),
    )
    out = np.empty(n, dtype)
    _run([ADD, 0, int(double), n, 0, 1, 2], a, b, out)
    assert out.tobytes() == np.add(a, b).tobytes()


@settings(max_examples=15, deadline=None)
@given(
    lead=st.lists(st.integers(1, 40), min_size=1, max_size=2),
    cols=st.integers(2, 70),
    double=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sum_over_leading_axes_gives_numpys_bits(
    lead: list[int], cols: int, double: bool, seed: int
) -> None:
    """NumPy adds the rows in order where a row keeps 2 elements or more (its pairwise
    summation is for a reduction along contiguous memory)."""
    rng = np.random.default_rng(seed)
    dtype = np.float64 if double else np.float32
    x = (rng.standard_normal((*lead, cols)) * 10 ** rng.uniform(-3, 3, cols)).astype(dtype)
    x.reshape(-1)[0] = -0.0
    out = np.full(cols, np.nan, dtype)
    _run([SUM, 0, int(double), int(np.prod(lead)), cols, 0, 1], x, out)
    want = x.sum(axis=tuple(range(len(lead))))
    assert out.tobytes() == want.tobytes()
