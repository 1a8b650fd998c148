"""A plan runs BLAS on one thread only where its own cut takes its big products
(thread_budget.shares_cores): a product the interpreter refuses at run time, a matrix
times its own transpose (syrk, which the cut leaves whole) or one with an operand no BLAS
call takes without a copy (left to NumPy: plan_rows.gemm_row), runs on BLAS's threads as
NumPy runs it, not whole on one core; values keep the step runner's bits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime import gemm_probe, thread_budget
from test_blas_region import two_threads  # noqa: F401 - a fixture
from test_runtime_vm import _jitted, sync  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(not thread_budget.may_cut(), reason="products are not cut here")

# This machine's kind of answer (OpenBLAS's AVX2 kernels): float32 rows at 12, any width;
# float64 at 16 both ways. Set, so that the cut takes these products on any machine.
ANSWER = (12, 1, 0, 0, 16, 1, 16, 1)


@pytest.fixture
def answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemm_probe, "_ANSWER", [ANSWER])


def _one_thread(f: Any, *shapes: tuple[int, ...], dtype: Any = np.float32) -> bool:
    args = [np.broadcast_to(np.ones((), dtype), s) for s in shapes]  # lowered: no memory
    return bool(fg.jit(f).lower(*args).executable.one_blas_thread)


@pytest.mark.usefixtures("answer")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_gram_matrix_keeps_blas_threads(dtype: Any) -> None:
    """x.T @ x and x @ x.T: the interpreter computes them with syrk, as NumPy does, and
    the cut leaves them whole (gemm_split), so BLAS keeps its threads; a product of x by
    another array of its shape's transpose is cut."""
    assert not _one_thread(lambda x: x.T @ x, (3000, 768), dtype=dtype)
    assert not _one_thread(lambda x: x @ x.T, (768, 3000), dtype=dtype)
    assert not _one_thread(lambda x: fnp.swapaxes(x, -1, -2) @ x, (4, 3000, 256), dtype=dtype)
    assert _one_thread(lambda x, y: x.T @ y, (3000, 768), (3000, 768), dtype=dtype)


@pytest.mark.usefixtures("answer")
def test_a_product_of_a_strided_operand_keeps_blas_threads() -> None:
    """x[:, ::2] @ w: no BLAS call takes the slice without a copy, so the interpreter
    leaves the product to NumPy; x[::2] @ w (rows apart, each contiguous) is a GEMM row
    the cut takes."""
    assert not _one_thread(lambda x, w: x[:, ::2] @ w, (2000, 1536), (768, 512))
    assert _one_thread(lambda x, w: x[::2] @ w, (4000, 768), (768, 512))


@pytest.mark.usefixtures("answer")
def test_a_plan_mixing_cut_and_refused_products_decides_by_their_work() -> None:
    """Bench W4's product (10^8 multiply-adds), cut, beside a Gram matrix of 2.8 * 10^6
    (refused): one BLAS thread; beside one of 1.8 * 10^9: BLAS's threads."""
    w4 = (256, 784), (784, 512)

    def both(x: Any, w: Any, y: Any) -> Any:
        return fnp.sum(x @ w) + fnp.sum(y.T @ y)

    assert _one_thread(both, *w4, (300, 96))
    assert not _one_thread(both, *w4, (3000, 768))


@pytest.mark.usefixtures("sync", "answer")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_refused_products_keep_the_step_runners_bits(dtype: Any) -> None:
    """The Gram matrix and the strided product, values and gradients, on BLAS's threads
    in both runners."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((600, 192)).astype(dtype)
    w = (rng.standard_normal((96, 160)) * 0.1).astype(dtype)

    def loss(x: Any, w: Any) -> Any:
        return fnp.sum(fnp.tanh(x.T @ x * 0.01) ** 2) + fnp.sum((x[:, ::2] @ w) ** 2)

    vg = fg.value_and_grad(loss, argnums=(0, 1))
    steps, interpreted = _jitted(vg, "steps"), _jitted(vg, "vm")
    assert not fg.jit(vg).lower(x, w).executable.one_blas_thread
    expected = [steps(x, w) for _ in range(2)][-1]
    got = [interpreted(x, w) for _ in range(2)][-1]
    for e, g in zip([expected[0], *expected[1]], [got[0], *got[1]], strict=True):
        assert np.array_equal(np.asarray(e), np.asarray(g))


@pytest.mark.usefixtures("sync", "answer", "two_threads")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_scan_body_running_blas_on_one_thread_keeps_the_step_runners_bits(
    dtype: Any,
) -> None:
    """A scan's body whose products the cut takes runs BLAS on one thread in the
    interpreter's body tables; the step runner's Python loop called the body's plan
    outside the one-thread region (on BLAS's threads: other float32 bits, the carry's
    too). Its Gram matrix of the carry, refused by the cut, runs whole in both."""
    rng = np.random.default_rng(4)
    h0 = rng.standard_normal((96, 256)).astype(dtype)
    xs = rng.standard_normal((3, 96, 256)).astype(dtype)
    w = (rng.standard_normal((256, 2048)) * 0.05).astype(dtype)
    v = (rng.standard_normal((2048, 256)) * 0.05).astype(dtype)

    def f(h0: Any, xs: Any, w: Any, v: Any) -> Any:
        def body(h: Any, x: Any) -> Any:
            return fnp.tanh(((h @ w) * 0.01) @ v + x), h.T @ h

        return fg.scan(body, h0, xs)

    expected = [_jitted(f, "steps")(h0, xs, w, v) for _ in range(2)][-1]
    interpreted = _jitted(f, "vm")
    got = [interpreted(h0, xs, w, v) for _ in range(3)][-1]
    for e, g in zip(expected, got, strict=True):
        assert np.array_equal(np.asarray(e), np.asarray(g))
