"""Loops reducing a short last axis run in blocks of rows (codegen.rowblocks): against the
reference interpreter, forward and backward, with NaN and infinities, partial blocks, rows
of one element and outputs of row values that keep their axis."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.executable import _KernelStep


def _blocked(f, *args):
    plan = fg.jit(f).lower(*args).executable.plan
    return any("for rb in range" in s.source.source for s in plan if isinstance(s, _KernelStep))


def mixture_like(z, w):
    """A logsumexp over the short axis (M4's), its gradient, a softmax and extrema."""
    s = z + w
    lse = fnp.logsumexp(s, axis=-1)
    p = fnp.exp(s - fnp.max(s, axis=-1, keepdims=True))
    return fnp.sum(lse), p / fnp.sum(p, axis=-1, keepdims=True), fnp.min(s * s, axis=1)


@settings(max_examples=5, deadline=None)
@given(
    rows=st.sampled_from([1, 3, 64, 65, 130]),
    width=st.sampled_from([1, 2, 8, 15]),
    dtype=st.sampled_from([np.float32, np.float64]),
    special=st.sampled_from([None, np.nan, np.inf, -np.inf]),
    seed=st.integers(0, 2**32 - 1),
)
def test_short_rows_match_reference(rows, width, dtype, special, seed):
    draw = np.random.default_rng(seed)
    z = draw.uniform(-3, 3, (rows, width)).astype(dtype)
    w = draw.uniform(-1, 1, width).astype(dtype)
    if special is not None:
        z[draw.integers(rows), draw.integers(width)] = special

    def f(z, w):
        value, grads = fg.value_and_grad(lambda z, w: mixture_like(z, w)[0], argnums=(0, 1))(z, w)
        return value, grads, mixture_like(z, w)[1:]

    fused = fg.pytree.flatten(fg.jit(f)(z, w))[0]
    reference = fg.pytree.flatten(fg.jit(f, fuse=False)(z, w))[0]
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for u, r in zip(fused, reference, strict=True):
        assert u.dtype == r.dtype and u.shape == r.shape
        np.testing.assert_allclose(u, r, rtol=tol, atol=tol * rows)
    assert _blocked(f, z, w)


def test_long_rows_keep_the_row_form():
    z, w = np.ones((4, 16)), np.ones(16)
    assert not _blocked(lambda z, w: mixture_like(z, w), z, w)
