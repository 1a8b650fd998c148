"""Preparing a function (tracing, autodiff, simplification, partitioning) in time linear in
its length: no full garbage collections while it runs, and a partition whose work is
counted, not timed, on an unrolled loop of T and 2T steps."""

import gc

import numpy as np

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.collector import no_full_collections


def test_no_full_collections_while_preparing_and_thresholds_restored_after():
    before = gc.get_threshold()
    with no_full_collections():
        paused = gc.get_threshold()
        with no_full_collections():  # nested, as a trace inside a trace
            pass
        assert gc.get_threshold() == paused
    assert paused[:2] == before[:2] and paused[2] > 10**6
    assert gc.get_threshold() == before


def test_a_first_call_leaves_the_collector_as_it_was():
    before = gc.get_threshold()
    f = fg.jit(fg.value_and_grad(lambda x: fnp.sum(fnp.tanh(x) ** 2)))
    x = np.linspace(-1.0, 1.0, 5)
    _, g = f(x)
    np.testing.assert_allclose(g, 2 * np.tanh(x) / np.cosh(x) ** 2)
    assert gc.get_threshold() == before


def test_thresholds_come_back_even_when_tracing_fails():
    before = gc.get_threshold()

    def bad(x):
        raise RuntimeError("user error")

    try:
        fg.jit(bad)(np.ones(2))
    except RuntimeError:
        pass
    assert gc.get_threshold() == before
