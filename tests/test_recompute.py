"""Multi-pass loops store what is costly to recompute (compiler.codegen.recompute) and
compute a repeated expression once: a layer norm with a tanh-GELU and their gradient
against the reference interpreter at shapes and values hypothesis draws, with no
transcendental or power op recomputed in a later pass; `x * y` and `y * x` computed once."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.executable import _KernelStep

pytestmark = pytest.mark.usefixtures("compiled_first_call")


def layer_norm_gelu(x, g, b):
    mu = fnp.mean(x, axis=-1, keepdims=True)
    d = x - mu
    y = d / fnp.sqrt(fnp.mean(d * d, axis=-1, keepdims=True) + 1e-5) * g + b
    h = 0.5 * y * (1 + fnp.tanh(0.7978845608 * (y + 0.044715 * y**3)))
    return fnp.sum(h * h)


step = fg.value_and_grad(layer_norm_gelu, argnums=(0, 1, 2))


def kernels(fun, *args):
    plan = fg.jit(fun).lower(*args).executable.plan
    return [s.source for s in plan if isinstance(s, _KernelStep)]


@settings(max_examples=6, deadline=None)
@given(
    rows=st.integers(2, 5),
    cols=st.integers(2, 9),
    dtype=st.sampled_from([np.float32, np.float64]),
    data=st.data(),
)
def test_layer_norm_gelu_gradient_matches_reference(rows, cols, dtype, data):
    finite = st.floats(-20, 20, width=32 if dtype == np.float32 else 64)
    x = data.draw(hnp.arrays(dtype, (rows, cols), elements=finite))
    g, b = (data.draw(hnp.arrays(dtype, cols, elements=finite)) for _ in range(2))
    fused = fg.pytree.flatten(fg.jit(step)(x, g, b))[0]
    reference = fg.pytree.flatten(fg.jit(step, fuse=False)(x, g, b))[0]
    tol = 2e-3 if dtype == np.float32 else 1e-9  # a row of equal values: 1 / sqrt(1e-5)
    # Absolute against the largest derivative of all: over a row of equal values (the
    # truth d = 0), x - mean is an ulp of x or 0 depending on how the mean rounds (float32
    # sums accumulate in float64 in kernels, in float32 in NumPy), and times 1 / sqrt(1e-5)
    # it leaves the gain's gradient a noise of +-1e-3 when the bias's is 28.
    scale = max(1.0, *(float(np.abs(r).max()) for r in reference))
    for f, r in zip(fused, reference, strict=True):
        np.testing.assert_allclose(f, r, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("cols", [16, 8])
def test_later_passes_load_the_gelu_chain(cols):
    # Rows of 16: one row at a time; of 8: blocks of rows (codegen.rowblocks), whose
    # scratch is a part of the block's array.
    args = (np.ones((4, cols)), np.ones(cols), np.ones(cols))
    (multi_pass,) = [k for k in kernels(step, *args) if k.recomputed]
    again = {entry.split(" ")[0] for entry in multi_pass.recomputed}
    assert not again & {"tanh", "power", "divide", "sqrt"}, multi_pass.recomputed
    scratch = "np.empty(n1, " if cols == 16 else "np.uint64(64) * np.uint64(n1)"
    assert scratch in multi_pass.source  # the row scratch buffer


def test_a_product_in_either_order_is_computed_once():
    def f(x, y):
        return fnp.sin(x * y) + fnp.cos(y * x) * (x * y)

    (kernel,) = kernels(f, np.ones(5), np.ones(5))
    bodies = kernel.source.count("for i0 in")  # the sin/cos rerun loop has its own
    assert kernel.source.count("(a0[i0] * a1[i0])") == bodies, kernel.source
    assert "a1[i0] * a0[i0]" not in kernel.source
