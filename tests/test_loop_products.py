"""Small matrix-vector products in loop bodies as reductions (compiler.loop_products): the
rewritten graph on the reference interpreter against `np.matmul` (within rounding), for
products on either side, transposed operands and both dtypes; products too large, or
whose operand a reshape would copy, kept; and the unbatched RNN at H = 16, whose bodies
then run as LOOPs of kernels and views alone, with the bits of the Python loop and the
step runner and the unrolled loop's values; a while loop's body too. ~4 s warm."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.loop_products import LIMIT, fuse_small_products
from fastgrad.core.config import config
from fastgrad.core.interpreter import eval_graph
from fastgrad.runtime import vm
from test_loop_matvec import _rnn
from test_runtime_loop_table import TOL, _close, _loops, _three_ways


@pytest.fixture(autouse=True)
def runtime(compiled_first_call: None) -> Iterator[None]:
    before = config.runtime
    yield
    config.update("runtime", before)


@settings(max_examples=40, deadline=None)
@given(
    dims=st.tuples(*[st.sampled_from([1, 2, 3, 7, 16])] * 3),
    column=st.booleans(),
    transposed=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_small_products_become_reductions(dims, column, transposed, dtype, seed):
    """W @ h, h @ W, W.T @ h, h @ W.T (h a column or a row): no matmul left, and the
    reduction's value is np.matmul's within rounding (~1 s)."""
    m, k, n = dims
    m, n = (m, 1) if column else (1, n)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if transposed and column else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if transposed and not column else (k, n)).astype(dtype)
    flip = (lambda x: x.T) if transposed else (lambda x: x)  # noqa: E731

    def product(a, b):
        return flip(a) @ b if column else a @ flip(b)

    graph = fg.make_graph(product)(a, b)
    rewritten = fuse_small_products(graph)
    assert not any(node.op.name == "matmul" for node in rewritten.nodes)
    (got,) = eval_graph(rewritten, [a, b])
    want = product(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])


def test_large_products_and_copying_layouts_stay_library_calls():
    """A product of more than LIMIT multiply-adds, one of a matrix (m, k) and (k, n) with
    neither m nor n 1, or one whose matrix is a slice (its reshape would copy) is kept."""
    big = np.ones((64, 64)), np.ones((64, 1))
    assert 64 * 64 > LIMIT
    matrix = np.ones((3, 4)), np.ones((4, 2))
    for a, b in (big, matrix):
        graph = fg.make_graph(lambda a, b: a @ b)(a, b)
        assert fuse_small_products(graph) is graph
    graph = fg.make_graph(lambda a, b: a[:, ::2] @ b)(np.ones((4, 8)), np.ones((4, 1)))
    assert fuse_small_products(graph) is graph


def _row_ops(jf, args) -> set[int]:
    """The opcodes of the rows of each LOOP's body tables."""
    ops = set()
    for step in _loops(jf, args):
        program = step.looped.program
        assert program is not None
        row = program.table[program.table[0]]
        for table, at in zip(program.keep, program.table[row + 8 : row + 11 : 2], strict=True):
            first, count = table[at], table[at + 1]
            ops |= {int(table[table[table[0] + i]]) for i in range(first, first + count)}
    return ops


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("steps", [0, 1, 5])
def test_the_unbatched_rnn_loops_over_kernels_alone(dtype, steps):
    """H = 16 (bench scan_matvec's size): value_and_grad's two scans run as LOOPs whose
    bodies hold kernels and views only (no GEMV row: its OpenBLAS call cost half a step),
    with the Python loop's and the step runner's bits, and the unrolled loop's values."""
    rng = np.random.default_rng(3)
    shapes = [(16, 16), (16, 8), (16,), (16,), (steps, 8)]
    args = tuple((rng.standard_normal(s) * 0.3).astype(dtype) for s in shapes)
    grad = fg.value_and_grad(_rnn, argnums=(0, 1, 2, 3))
    got = _three_ways(grad, args)
    if steps:
        jf = fg.jit(grad)
        for _ in range(3):  # lowered, watched, then a LOOP (as _three_ways does)
            jf(*args)
        assert _row_ops(jf, args) <= {vm.KERNEL, vm.VIEW}
    unrolled = fg.value_and_grad(lambda *a: _rnn(*a, scan=False), argnums=(0, 1, 2, 3))
    _close(got, fg.jit(unrolled, fuse=False)(*args), dtype)


def test_a_while_loops_body_takes_them_too():
    """A while loop's body with `W @ h` runs the rewritten graph: the NumPy loop's value
    within rounding, and its derivative by forward mode."""
    rng = np.random.default_rng(5)
    w, h0 = rng.standard_normal((6, 6)) * 0.3, rng.standard_normal(6)

    def run(w, h):
        body = lambda c: (c[0] + 1, fnp.tanh(w @ c[1] + 0.1))  # noqa: E731
        return fg.while_loop(lambda c: c[0] < 4, body, (0, h))[1]

    want = h0
    for _ in range(4):
        want = np.tanh(w @ want + 0.1)
    jf = fg.jit(run)
    np.testing.assert_allclose(jf(w, h0), want, rtol=1e-12, atol=1e-12)
    (loop,) = _loops(jf, (w, h0))
    assert not any(node.op.name == "matmul" for node in loop.bodies[1].graph.nodes)
    _, tangent = fg.jvp(lambda h: run(w, h), (h0,), (np.ones(6),))
    step, eps = np.ones(6), 1e-6
    plus, minus = h0 + eps * step, h0 - eps * step
    for _ in range(4):
        plus, minus = np.tanh(w @ plus + 0.1), np.tanh(w @ minus + 0.1)
    np.testing.assert_allclose(tangent, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-8)
