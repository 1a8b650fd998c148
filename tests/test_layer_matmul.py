"""A stack of rows times one matrix (`x @ w`, x of shape (..., n, k), w of (k, m)): one
2-D gemm over all the rows, forward and backward. Oracles: NumPy's matmul and einsum,
and the reference interpreter. Structure: no 3-D matmul, no w broadcast to a stack, and
no sum over the batch of per-matrix weight gradients (the transformer block's plan lost
7 of its 18 loops to this).
"""

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.executable import _KernelStep

rng = np.random.default_rng(13)
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def layer(x, w):
    return fnp.sum(fnp.tanh(x @ w) ** 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 4, 5), (0, 4, 5), (3, 1, 5)])
def test_rows_times_a_matrix_match_numpy_forward_and_backward(dtype, shape):
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((shape[-1], 6)).astype(dtype)
    v = rng.standard_normal(shape[-1]).astype(dtype)
    np.testing.assert_allclose(fnp.matmul(x, w), x @ w, rtol=TOL[dtype])  # plain arrays
    np.testing.assert_allclose(fnp.matmul(x, v), x @ v, rtol=TOL[dtype])
    assert fnp.matmul(x, v).shape == (x @ v).shape and fnp.matmul(x, w).dtype == dtype
    gx, gw = fg.jit(fg.grad(layer, argnums=(0, 1)))(x, w)
    t = np.tanh(x @ w)
    g = 2 * t * (1 - t * t)  # d sum(tanh(y)^2) / dy
    np.testing.assert_allclose(gx, g @ w.T, rtol=TOL[dtype] * 10, atol=TOL[dtype])
    lead = list(range(x.ndim - 1))
    ref = np.tensordot(x, g, axes=(lead, lead))  # summed over every row of the stack
    np.testing.assert_allclose(gw, ref, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)
    assert gx.dtype == gw.dtype == dtype


def test_second_order_and_vector_right_operand_match_the_reference_interpreter():
    x = rng.standard_normal((2, 3, 4))
    w = rng.standard_normal((4, 3))
    v = rng.standard_normal(4)

    def f(x, w, v):
        return fnp.sum(fnp.sin(x @ w) * fnp.sum(x @ v))

    hvp = fg.grad(lambda x: fnp.sum(fg.grad(f)(x, w, v) * x))
    np.testing.assert_allclose(fg.jit(hvp)(x), fg.jit(hvp, fuse=False)(x), rtol=1e-10)
    fg.testing.check_grads(f, (x, w, v), order=2, modes=("rev", "fwd"))


def test_a_layer_on_a_stack_is_one_2d_gemm_each_way_with_no_broadcast_weight():
    x = rng.standard_normal((8, 16, 32)).astype(np.float32)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    lowered = fg.jit(fg.grad(layer, argnums=(0, 1))).lower(x, w)
    matmuls = [n for n in lowered.graph.nodes if n.op.name == "matmul"]
    assert len(matmuls) == 3  # forward, and the gradients of x and of w
    assert all(n.out.aval.ndim == 2 for n in matmuls)
    assert not any(
        n.op.name == "broadcast_to" and n.inputs[0].aval.shape == w.shape
        for n in lowered.graph.nodes
    )
    # w's gradient comes out of its gemm: no loop sums products over the stack
    loops = [s for s in lowered.executable.plan if isinstance(s, _KernelStep)]
    assert all(s.loop.reduce_axes == () or s.loop.shape != (8, 32, 64) for s in loops)
    assert len(loops) == 1  # tanh and its derivative (w's gradient needs no loop)
