"""Kernel identity: a Python loop unrolled T times asks for the same few kernels at any T,
counted from the generated sources (nothing is compiled)."""

import numpy as np

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.fusion import partition
from fastgrad.compiler.passes import simplify
from fastgrad.runtime.executable import Executable

BATCH, HIDDEN, INPUT = 4, 8, 3


def rnn_loss(wx, wh, b, xs, h0):
    h, total = h0, 0.0
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] @ wx + h @ wh + b)
        total = total + fnp.sum(h * h)
    return total / (xs.shape[0] * BATCH * HIDDEN)


def arguments(steps):
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((INPUT, HIDDEN)).astype(np.float32),
        rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * 0.3,
        rng.standard_normal(HIDDEN).astype(np.float32),
        rng.standard_normal((steps, BATCH, INPUT)).astype(np.float32),
        rng.standard_normal((BATCH, HIDDEN)).astype(np.float32),
    )


def kernel_sources(steps):
    """The source of every kernel step of the plan of `jit(value_and_grad(rnn_loss))`."""
    f = fg.jit(fg.value_and_grad(rnn_loss, argnums=(0, 1, 2)))
    graph = simplify(f.graph(*arguments(steps)))
    return [k.source for k in Executable(graph, partition(graph)).kernels]


def test_an_unrolled_rnn_asks_for_the_same_kernels_at_any_length():
    short, long = kernel_sources(10), kernel_sources(40)
    assert len(long) > 3 * len(short)  # one forward and one backward loop per step
    # The sources, not just their number: a loop that grew with T (it once gathered a term
    # of every step's backward pass) would be a new kernel, and a longer compile, per T.
    assert set(long) == set(short)
    assert len(set(short)) <= 6
