"""Kernel identity: a Python loop unrolled T times asks for the same few kernels at any T,
counted from the generated sources (nothing is compiled)."""

from functools import partial

import numpy as np
from fastgrad_bench.workloads import rnn_inputs, rnn_unrolled_loss

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.fusion import partition
from fastgrad.compiler.passes import simplify
from fastgrad.runtime.executable import Executable


def kernel_sources(steps):
    """The source of every kernel step in the plan of the benchmark's unrolled RNN (M1:
    batch 32, hidden 128, float32) under `jit(value_and_grad)`."""
    loss = partial(rnn_unrolled_loss, fnp)
    f = fg.jit(fg.value_and_grad(loss, argnums=(0, 1, 2)))
    args = rnn_inputs(steps, np.float32, np.random.default_rng(0))
    graph = simplify(f.graph(*args))
    return [k.source for k in Executable(graph, partition(graph)).kernels]


def test_an_unrolled_rnn_asks_for_the_same_kernels_at_any_length():
    short, long = kernel_sources(10), kernel_sources(40)
    assert len(long) > 3 * len(short)  # one forward and one backward loop per step
    # The sources, not just their number: a loop that grew with T (it once gathered a term
    # of every step's backward pass) would be a new kernel, and a longer compile, per T.
    assert set(long) == set(short)
    assert len(set(short)) <= 6
