"""Sums of matmuls folded into BLAS accumulation (runtime.matmul, runtime.blas).

Oracles: NumPy's `c + a @ b` for the gemm call, and the reference interpreter
(`fg.jit(f, fuse=False)`) for whole plans with and without folded sums.
"""

from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime import blas
from fastgrad.runtime.executable import _KernelStep, _MatmulStep, numba_threads
from fastgrad.runtime.thread_budget import cut_pieces, may_cut

TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _operand(rng, rows, cols, dtype, layout):
    """A (rows, cols) array laid out as `layout`: C order, a transposed view, or a
    strided slice of a larger array."""
    if layout == "T":
        return rng.standard_normal((cols, rows)).astype(dtype).T
    if layout == "slice":
        return rng.standard_normal((rows + 2, 2 * cols)).astype(dtype)[1 : rows + 1, ::2]
    return rng.standard_normal((rows, cols)).astype(dtype)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(0, 5),
    k=st.integers(0, 5),
    n=st.integers(0, 5),
    layouts=st.tuples(*[st.sampled_from(["C", "T", "slice"])] * 2),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_accumulate_adds_the_product_in_place(m, k, n, layouts, dtype, seed):
    rng = np.random.default_rng(seed)
    a = _operand(rng, m, k, dtype, layouts[0])
    b = _operand(rng, k, n, dtype, layouts[1])
    c = rng.standard_normal((m, n)).astype(dtype)
    expected = c + a @ b
    address = c.ctypes.data
    blas.accumulate(a, b, c)
    assert c.ctypes.data == address and c.dtype == dtype
    np.testing.assert_allclose(c, expected, rtol=TOL[dtype], atol=TOL[dtype] * 10)


def test_accumulate_propagates_nan_and_inf_as_numpy_does():
    a = np.array([[np.inf, 1.0]])
    b = np.array([[1.0], [np.nan]])
    c = np.zeros((1, 1))
    blas.accumulate(a, b, c)
    assert np.isnan(c[0, 0])


def _sum_of_products(ws, hs, gs):
    """The weight gradient of an unrolled loop: a sum of products h_t^T g_t."""
    products = [fnp.swapaxes(fnp.tanh(h), 0, 1) @ fnp.sin(g) for h, g in zip(hs, gs, strict=True)]
    total = products[0]
    for p in products[1:]:
        total = total + p
    return fnp.sum(fnp.tanh(total @ ws.T)), total  # a matmul reads the sum: no fusion


def _plan(f, *args):
    return f.lower(*args).executable.plan


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rnn_gradient_sums_are_accumulated_by_blas(dtype):
    """In the unrolled RNN's gradient the sum over steps of h^T g (the recurrent weight's
    gradient) is accumulated by the matmuls: no add step is left for it, and the values
    are the reference interpreter's."""

    def rnn(wx, wh, b, xs, h):
        for t in range(xs.shape[0]):
            h = fnp.tanh(xs[t] @ wx + h @ wh + b)
        return fnp.mean(h * h)

    rng = np.random.default_rng(1)
    args = (
        rng.standard_normal((2, 5)).astype(dtype),
        rng.standard_normal((5, 5)).astype(dtype) * 0.5,
        rng.standard_normal(5).astype(dtype),
        rng.standard_normal((6, 3, 2)).astype(dtype),
        rng.standard_normal((3, 5)).astype(dtype),
    )
    f = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)))
    value, grads = f(*args)
    ref_value, ref_grads = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)), fuse=False)(*args)
    np.testing.assert_allclose(value, ref_value, rtol=TOL[dtype])
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)
    plan = _plan(f, *args)
    accumulating = [s for s in plan if isinstance(s, _MatmulStep) and s.accumulate]
    assert len(accumulating) >= 4  # wh's gradient: one product per step after the first
    adds = [s for s in plan if isinstance(s, _KernelStep) and s.source.ops == ["add"]]
    # Left: wx's and wh's last adds, into the fresh arrays the caller receives (wx's
    # products read views of the argument xs, whose address changes per call: they
    # accumulate too); unfolded there were 10.
    assert len(adds) == 2
    # A second call on other inputs: the accumulator starts again from zero.
    args2 = tuple(a * 0.5 for a in args)
    again = f(*args2)[1]
    reference = fg.jit(fg.value_and_grad(rnn, argnums=(0, 1, 2)), fuse=False)(*args2)[1]
    for g, r in zip(again, reference, strict=True):
        np.testing.assert_allclose(g, r, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)


@settings(max_examples=12, deadline=None)
@given(
    steps=st.integers(1, 5),
    rows=st.integers(1, 4),
    cols=st.integers(1, 4),
    inner=st.integers(1, 4),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_sums_of_products_match_the_reference_interpreter(steps, rows, cols, inner, dtype, seed):
    """Random sums of matmul products, as a value and as an output the caller receives:
    the plan (folded into accumulating matmuls) against the reference interpreter, over
    two calls so that the accumulator's buffer is reused."""
    rng = np.random.default_rng(seed)

    def make():
        ws = rng.standard_normal((rows, cols)).astype(dtype)
        hs = [rng.standard_normal((inner, rows)).astype(dtype) for _ in range(steps)]
        gs = [rng.standard_normal((inner, cols)).astype(dtype) for _ in range(steps)]
        return ws, hs, gs

    fused, reference = fg.jit(_sum_of_products), fg.jit(_sum_of_products, fuse=False)
    for _ in range(2):
        args = make()
        for got, want in zip(fused(*args), reference(*args), strict=True):
            np.testing.assert_allclose(got, want, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)
    accumulating = [s for s in _plan(fused, *args) if getattr(s, "accumulate", False)]
    # The adds fuse into one kernel, which writes the fresh output the caller receives:
    # nothing to fold. Without that output, every product but the first accumulates.
    assert not accumulating
    value_only = fg.jit(lambda *a: _sum_of_products(*a)[0])
    np.testing.assert_allclose(
        value_only(*args), reference(*args)[0], rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10
    )
    accumulating = [s for s in _plan(value_only, *args) if getattr(s, "accumulate", False)]
    assert len(accumulating) == steps - 1


def test_one_blas_thread_is_set_for_this_thread_and_restored():
    set_local = blas._set_threads_local()
    if set_local is None:
        pytest.skip("NumPy's BLAS has no per-thread thread count")
    before = set_local(2)
    try:
        with blas.OneThread():
            inside = set_local(1)  # returns the count in force: the context's
        assert inside == 1
        assert set_local(2) == 2  # restored on exit
    finally:
        set_local(before)


def test_plans_of_small_matmuls_run_on_one_blas_thread():
    def f(a, b):
        return fnp.sum(fnp.tanh(a @ b))

    small = (np.ones((4, 8)), np.ones((8, 3)))
    big = (np.ones((256, 256)), np.ones((256, 256)))
    assert fg.jit(f).lower(*small).executable.small_matmuls
    assert not fg.jit(f).lower(*big).executable.small_matmuls
    assert not fg.jit(lambda a: fnp.sum(a * 2)).lower(small[0]).executable.small_matmuls
    assert fg.jit(f)(*small) == pytest.approx(np.sum(np.tanh(small[0] @ small[1])))


def test_parallel_kernels_between_midsize_products_run_blas_on_one_thread():
    """Numba's threads and BLAS's would fight over the cores (`thread_budget.shares_cores`): a plan
    with parallel kernels runs its matrix-matrix products on one BLAS thread, unless
    they are matrix-vector products (bandwidth-bound) or large and not cut across the
    cores by the interpreter (`may_cut`; a single product is cut only where its bands
    keep its bits on this machine: `cut_pieces`)."""
    if numba_threads() < 2:
        pytest.skip("kernels run serial with one thread")

    def f(x, w):
        return fnp.sum(fnp.tanh(x @ w))

    x = np.ones((1024, 64), np.float32)  # the loop over (1024, 512): parallel
    plan = fg.jit(f).lower(x, np.ones((64, 512), np.float32)).executable
    assert any(getattr(s, "parallel", False) for s in plan.plan)
    assert plan.one_blas_thread and not plan.small_matmuls
    ones = partial(np.broadcast_to, np.float32(1))  # lowered only: no memory needed
    # 2^24 multiply-adds: above SMALL_MATMUL, where every plan runs BLAS on one thread.
    vector = fg.jit(f).lower(ones((1 << 21, 8)), ones((8, 1))).executable
    assert not vector.one_blas_thread  # x @ w is a matrix-vector product
    big = fg.jit(f).lower(ones((1024, 1 << 18)), ones((1 << 18, 512))).executable
    # 2^37 multiply-adds: BLAS's threads pay, unless the interpreter cuts the product
    assert big.one_blas_thread == may_cut()
    # C 1000 wide: cut where bands of its rows keep the bits at any width (runtime.gemm_probe),
    # else BLAS's threads keep it. The step runner decides as the interpreter does.
    odd = fg.jit(f).lower(ones((1024, 1 << 18)), ones((1 << 18, 1000))).executable
    cut = cut_pieces(np.float32, 1024, 1000, 1 << 18) > 1
    assert odd.one_blas_thread == (may_cut() and cut)
    assert fg.jit(f)(x, np.full((64, 512), 0.01, np.float32)) == pytest.approx(
        np.sum(np.tanh(x @ np.full((64, 512), 0.01))), rel=1e-5
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_first_call_runs_its_products_unbound_and_the_next_binds_them(monkeypatch, dtype):
    """In background mode an arena's first run calls its products step by step (binding
    them would cost that call as much as it saves) and the next run binds them, then
    lowers the plan as before; in sync mode the first run binds them. Every call gives
    the reference interpreter's values, accumulated sums starting again from zero."""
    from fastgrad.runtime import background

    rng = np.random.default_rng(7)

    def make():
        ws = rng.standard_normal((3, 4)).astype(dtype)
        hs = [rng.standard_normal((5, 3)).astype(dtype) for _ in range(4)]
        gs = [rng.standard_normal((5, 4)).astype(dtype) for _ in range(4)]
        return ws, hs, gs

    def value(*a):
        return _sum_of_products(*a)[0]

    reference = fg.jit(value, fuse=False)
    for mode in ("background", "sync"):
        monkeypatch.setattr(fg.config, "compile", mode)
        f = fg.jit(value)
        args = make()
        np.testing.assert_allclose(f(*args), reference(*args), rtol=TOL[dtype] * 10)
        executable = f.lower(*args).executable
        arena, plan = executable.arena, executable.arena.steps
        products = [k for k, s in enumerate(plan) if isinstance(s, _MatmulStep)]
        assert sum(plan[k].accumulate for k in products) == 3
        unbound = [k for k in products if k in set(arena.unsettled)]
        if mode == "sync":
            assert not unbound
            continue
        assert unbound == products
        assert all(arena.calls[k].func == plan[k].run for k in products)
        assert background.wait_idle(timeout=300)
        for _ in range(2):
            args = make()
            np.testing.assert_allclose(f(*args), reference(*args), rtol=TOL[dtype] * 10)
        assert arena.settled and arena.unsettled == []
