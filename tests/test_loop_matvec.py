"""Products with a dimension of 1 (`W @ h` with h of shape (H,), `h @ W`, `x @ y`, outer
products) in the plan interpreter (runtime.vm_vectors, rows picked by
runtime.plan_rows.vector_row): the rows against `np.matmul` itself, bit for bit, over
shapes, strides, transposes and batches; and scans whose bodies hold them, which now run
as LOOPs, against the same scan's Python loop and the step runner (identical bits) and
the unrolled loop on the reference interpreter (within rounding), forward and reverse,
trip counts 0/1/2/5, float32 and float64, value_and_grad and grad of grad."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from test_runtime_loop_table import _close, _three_ways


@pytest.fixture(autouse=True)
def runtime(compiled_first_call: None) -> Iterator[None]:
    before = config.runtime
    yield
    config.update("runtime", before)


def _operand(draw: Any, rows: int, cols: int, dtype: Any, batch: tuple[int, ...]) -> np.ndarray:
    """A (batch, rows, cols) array, C-ordered, transposed, strided or broadcast."""
    kind = draw(st.sampled_from(["c", "t", "step", "broadcast"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if kind == "t":
        return rng.standard_normal((*batch, cols, rows)).astype(dtype).swapaxes(-1, -2)
    if kind == "step":
        return rng.standard_normal((*batch, rows, 2 * cols)).astype(dtype)[..., ::2]
    if kind == "broadcast" and rows == 1:
        return np.broadcast_to(rng.standard_normal((*batch, 1, 1)).astype(dtype), (*batch, 1, cols))
    return rng.standard_normal((*batch, rows, cols)).astype(dtype)


@st.composite
def _products(draw: Any) -> tuple[np.ndarray, np.ndarray]:
    dims = [draw(st.sampled_from([1, 2, 3, 7])) for _ in range(3)]
    dims[draw(st.integers(0, 2))] = 1  # one of m, k, p is 1
    m, k, p = dims
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    batch = draw(st.sampled_from([(), (2,)]))
    a = _operand(draw, m, k, dtype, batch if draw(st.booleans()) else ())
    b = _operand(draw, k, p, dtype, batch if draw(st.booleans()) else ())
    return a, b


def _run_row(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """`a @ b` by the interpreter's row for it (None: no row), on the operands' memory."""
    from fastgrad.runtime.plan_rows import vector_row
    from fastgrad.runtime.vm import pack, run_steps
    from fastgrad.runtime.vm_vectors import DOT, GEMV, NOBLAS, vector_function

    shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    out = np.full(shape, np.nan, a.dtype)
    fields = vector_row(a, b, out)
    if fields is None:
        return None
    kind, address, params, order, offsets = fields
    row = [*params, *order, 2, *offsets]
    functions = [vector_function()]  # the rows' own C function, then BLAS's routine
    if kind == "noblas":
        row = [NOBLAS, 0, *row]
    else:
        row, functions = [GEMV if kind == "gemv" else DOT, 0, 1, *row], [*functions, address]
    table, at = pack(row, [0], functions, 4, [], [[0, 1, 3, 0, 1, 2]])
    # The interpreter reads only where each operand starts (the row has the strides).
    starts = tuple(
        np.ctypeslib.as_array((ctypes.c_uint8 * 1).from_address(x.ctypes.data)) for x in (a, b)
    )
    run_steps(table, at[0], (*starts, out.reshape(-1)))
    return out


@settings(max_examples=60, deadline=None)
@given(_products())
def test_vector_rows_give_numpys_bits(operands):
    """Each row (gemv either side, dot, NumPy's loop for outer products and strides BLAS
    does not take), with NumPy's choice of routine, order, flags and increments, gives
    `np.matmul`'s bits; one draw per routine at least (~1 s warm)."""
    a, b = operands
    got = _run_row(a, b)
    assert got is not None
    assert np.array_equal(got, np.matmul(a, b))


def _body(form: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A step h -> tanh(product + x), traced and in NumPy, for each product form."""
    products: dict[str, Callable[..., Any]] = {
        "W @ h": lambda w, h, x: w @ h,
        "h @ W": lambda w, h, x: h @ w,
        "W.T @ h": lambda w, h, x: w.T @ h,
        "h @ W.T": lambda w, h, x: h @ w.T,
        "x . h": lambda w, h, x: (x @ h) * h,
        "outer": lambda w, h, x: (h[:, None] @ x[None, :]) @ x,
    }
    product = products[form]

    def traced(w, h, x):
        return fnp.tanh(product(w, h, x) * 0.5 + x)

    def plain(w, h, x):
        return np.tanh(product(w, h, x) * 0.5 + x)

    return traced, plain


def _loss(form: str, reverse: bool, scan: bool = True) -> Callable[..., Any]:
    step, _ = _body(form)

    def loss(w, h0, xs):
        if scan:
            h, hs = fg.scan(
                lambda h, x: (step(w, h, x), step(w, h, x) @ h), h0, xs, reverse=reverse
            )
        else:
            h, ys = h0, []
            for t in range(xs.shape[0])[::-1] if reverse else range(xs.shape[0]):
                ys.append(step(w, h, xs[t]) @ h)
                h = step(w, h, xs[t])
            hs = fnp.stack(ys[::-1] if reverse else ys) if ys else fnp.zeros((0,), h0.dtype)
        return fnp.sum(h * h) + fnp.sum(hs * 0.5)

    return loss


FORMS = ["W @ h", "h @ W", "W.T @ h", "h @ W.T", "x . h", "outer"]


@settings(max_examples=10, deadline=None)
@given(
    form=st.sampled_from(FORMS),
    steps=st.sampled_from([0, 1, 2, 5]),
    reverse=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_scans_with_matvecs_run_as_loops(form, steps, reverse, dtype, seed):
    """value_and_grad of a scan whose body multiplies by a vector: both scans are LOOPs,
    with the bits of the Python loop and the step runner, and the unrolled loop's values."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((4, 4)) * 0.5).astype(dtype)
    h0 = rng.standard_normal(4).astype(dtype)
    xs = rng.standard_normal((steps, 4)).astype(dtype)
    args = (w, h0, xs)
    grad = fg.value_and_grad(_loss(form, reverse), argnums=(0, 1, 2))
    got = _three_ways(grad, args)
    unrolled = fg.value_and_grad(_loss(form, reverse, scan=False), argnums=(0, 1, 2))
    _close(got, fg.jit(unrolled, fuse=False)(*args), dtype)


@pytest.mark.parametrize("form", ["W @ h", "h @ W.T"])
def test_grad_of_grad_through_a_matvec_scan(form):
    rng = np.random.default_rng(9)
    w = rng.standard_normal((3, 3)) * 0.5
    h0, v = rng.standard_normal(3), rng.standard_normal((3, 3))
    xs = rng.standard_normal((4, 3))

    def along_v(loss: Callable[..., Any]) -> Callable[..., Any]:
        grad = fg.grad(loss)
        return lambda w, h, xs: fnp.sum(grad(w, h, xs) * v)

    f = along_v(_loss(form, reverse=True))
    got = _three_ways(fg.value_and_grad(f), (w, h0, xs), looped=None)
    unrolled = along_v(_loss(form, reverse=True, scan=False))
    _close(got, fg.jit(fg.value_and_grad(unrolled), fuse=False)(w, h0, xs), np.float64)


def _rnn(w, u, b, h0, xs, reverse=False, scan=True, left=False):
    """The unbatched RNN, `h = tanh(W @ h + U @ x_t + b)` (with `left`, h @ W + x_t @ U)."""

    def step(h, x):
        h = fnp.tanh((h @ w + x @ u if left else w @ h + u @ x) + b)
        return h, h

    if scan:
        _, hs = fg.scan(step, h0, xs, reverse=reverse)
    else:
        h, hs = h0, [None] * xs.shape[0]
        for t in range(xs.shape[0])[::-1] if reverse else range(xs.shape[0]):
            h, hs[t] = step(h, xs[t])
        hs = fnp.stack(hs) if hs else fnp.zeros((0, h0.shape[0]), h0.dtype)
    return fnp.sum(hs * hs)


@settings(max_examples=6, deadline=None)
@given(
    steps=st.sampled_from([0, 1, 2, 5]),
    reverse=st.booleans(),
    left=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_the_unbatched_rnn_hoists_its_input_products_and_weight_gradients(
    steps, reverse, left, dtype, seed
):
    """`U @ x_t` (or `x_t @ U`) is one product before the forward loop, and the weight
    gradients' outer products one product after the backward loop (loop_hoisting): each
    body keeps one matrix-vector product, W's (a reduction, compiler.loop_products); both
    scans are LOOPs with the Python loop's and the step runner's bits, and the unrolled
    loop's values."""
    rng = np.random.default_rng(seed)
    shapes = [(4, 4), (3, 4) if left else (4, 3), (4,), (4,), (steps, 3)]
    args = tuple((rng.standard_normal(s) * 0.5).astype(dtype) for s in shapes)
    loss = lambda *a: _rnn(*a, reverse=reverse, left=left)  # noqa: E731
    grad = fg.value_and_grad(loss, argnums=(0, 1, 2, 3))
    got = _three_ways(grad, args)
    jf = fg.jit(grad)
    jf(*args)
    loops = [s for s in jf.lower(*args).executable.plan if type(s).__name__ == "LoopStep"]
    assert len(loops) == 2
    for loop in loops:
        nodes = loop.bodies[0].graph.nodes
        assert not any(n.op.name == "matmul" for n in nodes)
        assert sum(n.op.name == "sum" and n.inputs[0].aval.ndim == 3 for n in nodes) == 1
    unrolled = fg.value_and_grad(
        lambda *a: _rnn(*a, reverse=reverse, scan=False, left=left), argnums=(0, 1, 2, 3)
    )
    _close(got, fg.jit(unrolled, fuse=False)(*args), dtype)


def test_the_vector_rows_compile_in_the_background():
    """In background mode the plan runs its steps until the rows' C function (compiled
    once, apart from the interpreter's loop) and the LOOP are ready, then the LOOP takes
    over with the Python loop's bits."""
    from fastgrad.runtime.background import wait_idle
    from test_runtime_loop_table import _flat, _python_loop

    rng = np.random.default_rng(11)
    args = (rng.standard_normal((5, 5)) * 0.5, rng.standard_normal((5, 3)) * 0.5)
    args += (rng.standard_normal(5), rng.standard_normal(5), rng.standard_normal((6, 3)))
    config.update("runtime", "vm")
    config.update("compile", "background")
    jf = fg.jit(fg.value_and_grad(_rnn, argnums=(0, 1)))
    want = _flat(
        fg.jit(fg.value_and_grad(lambda *a: _rnn(*a, scan=False), argnums=(0, 1)), fuse=False)(
            *args
        )
    )
    for _ in range(8):
        _close(_flat(jf(*args)), want, np.float64)
        assert wait_idle(timeout=600)
    loops = [s for s in jf.lower(*args).executable.plan if type(s).__name__ == "LoopStep"]
    assert all(s.looped.program is not None for s in loops)
    got, python = _flat(jf(*args)), _python_loop(jf, args)
    assert all(np.array_equal(a, b) for a, b in zip(got, python, strict=True))


def test_batch_offsets_of_single_matrices_and_of_a_broadcast_batch():
    """A product of single matrices is one of offsets 0; a batch against a broadcast
    matrix steps through the batch's matrices only. (~0.001 s)"""
    from fastgrad.runtime.plan_rows import _batch_offsets

    a, b, out = np.zeros((3, 4)), np.zeros((4, 5)), np.zeros((3, 5))
    assert _batch_offsets((a, b, out)) == [1, 0, 0, 0]
    batch, outs = np.zeros((2, 4, 5)), np.zeros((2, 3, 5))
    assert _batch_offsets((a, batch, outs)) == [2, 0, 0, 0, 0, 4 * 5 * 8, 3 * 5 * 8]
