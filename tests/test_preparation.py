"""Preparing a function (tracing, autodiff, simplification, partitioning) in time linear in
its length: no full garbage collections while it runs, and a partition whose work is
counted, not timed, on an unrolled loop of T and 2T steps."""

import gc

import numpy as np

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import fusion
from fastgrad.compiler.passes import simplify
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


def test_a_first_call_on_numpy_makes_no_full_collection(monkeypatch):
    """Its run (NumPy while the kernels load, background mode) counts as preparation, all
    of it (the compile thread's jobs handed over and announced too): a full collection
    that the objects preparing it made call for comes after it."""
    import contextlib

    from fastgrad.core.config import config
    from fastgrad.runtime import background

    opened = background.first_run
    seen = []

    @contextlib.contextmanager
    def watched(what):
        seen.append(gc.get_threshold()[2])
        with opened(what) as batch:
            yield batch
        seen.append(gc.get_threshold()[2])  # the batch's notices still to come

    monkeypatch.setattr(background, "first_run", watched)
    mode = config.compile
    config.update("compile", "background")
    try:
        f = fg.jit(fg.value_and_grad(lambda x: fnp.sum(fnp.tanh(x) ** 3)))
        _, g = f(np.linspace(-1.0, 1.0, 7))
    finally:
        config.update("compile", mode)
    x = np.linspace(-1.0, 1.0, 7)
    np.testing.assert_allclose(g, 3 * np.tanh(x) ** 2 / np.cosh(x) ** 2)
    assert len(seen) == 2 and min(seen) > 10**6
    assert gc.get_threshold()[2] < 10**6


def test_thresholds_come_back_even_when_tracing_fails():
    before = gc.get_threshold()

    def bad(x):
        raise RuntimeError("user error")

    try:
        fg.jit(bad)(np.ones(2))
    except RuntimeError:
        pass
    assert gc.get_threshold() == before


def unrolled(w, xs):
    """A loop unrolled in Python: each step's `1 - h*h` (and `2 * s` times the constant
    cotangent) sinks into the backward loop."""
    total = 0.0
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] * w[0])
        s = h @ w
        total = total + fnp.sum(s * s)
    return total


def partition_work(steps, monkeypatch):
    """How many (loop, node) pairs partition tries, how many loops sinking looks at, and
    how many moves it makes, for `unrolled` of `steps` steps under value_and_grad."""
    work = {"placements": 0, "sink looks": 0, "moves": 0}
    placement, sinkable = fusion._placement, fusion._sinkable

    def counted_placement(*args):
        work["placements"] += 1
        return placement(*args)

    def counted_sinkable(*args):
        work["sink looks"] += 1
        move = sinkable(*args)
        work["moves"] += move is not None
        return move

    monkeypatch.setattr(fusion, "_placement", counted_placement)
    monkeypatch.setattr(fusion, "_sinkable", counted_sinkable)
    f = fg.jit(fg.value_and_grad(unrolled))
    graph = simplify(f.graph(np.ones((3, 3)), np.ones((steps, 2, 3))))
    fusion.partition(graph)
    monkeypatch.undo()
    return work, len(graph.nodes)


def test_partition_work_grows_linearly_with_the_program(monkeypatch):
    short, short_nodes = partition_work(10, monkeypatch)
    long, long_nodes = partition_work(20, monkeypatch)
    # Sinking is exercised: per step, `1 - h*h` and the scaled cotangent of `s * s`.
    assert short["moves"] == 20 and long["moves"] == 40
    assert long_nodes <= 2.1 * short_nodes
    for kind in short:
        # Twice the steps: twice the work, plus what the loop's end and start add once.
        assert long[kind] <= 2.1 * short[kind], (kind, short, long)
