"""A jitted gradient's plan named without a digest of its graph (api.trace `_inlined`,
compiler.plan_cache.inlined_key): `jit(value_and_grad(f))`'s graph is f's stored
forward and backward graph inlined and nothing else, so its key follows from that graph's
key and where its inputs come from. Such a graph is named so whether the backward graph
was built or read from disk, and its plan read back gives the bits of the plan prepared
with the cache off; a traced function that records anything else, or returns the
gradient's outputs otherwise, is digested as before; the key holds the graph's input
names and types, and what planning reads of its ops' records.

Cost: ~5 s with the kernels on disk (~40 s cold).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import graph_key, plan_cache
from fastgrad.core.config import config
from fastgrad.core.pytree import flatten
from test_plan_cache import RNN_ARGS, _check, _random_program, _rnn, _same_bits


def _leaves(tree: Any) -> list[Any]:
    return flatten(tree)[0]


def _traced(f: Any, *args: Any) -> Any:
    traced, _ = fg.jit(f)._trace(args, {})
    return traced


def test_a_jitted_gradient_is_named_without_its_digest(
    plans: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digested: list[int] = []
    digest = plan_cache.graph_digest
    monkeypatch.setattr(
        plan_cache, "graph_digest", lambda g: digested.append(len(g.nodes)) or digest(g)
    )
    _check(fg.jit(fg.value_and_grad(_rnn))(*RNN_ARGS))  # the backward graph built, saved
    _check(fg.jit(fg.value_and_grad(_rnn))(*RNN_ARGS))  # read back: the same key
    assert (plan_cache.COUNTERS.saved, plan_cache.COUNTERS.loaded) == (1, 1)
    traced = _traced(fg.value_and_grad(_rnn), *RNN_ARGS)
    assert traced.inlined is not None
    assert max(digested) < len(traced.graph.nodes)  # only the forward graphs were digested


def _scaled(w: Any, xs: Any) -> Any:
    value, grad = fg.value_and_grad(_rnn)(w, xs)
    return value * 2.0, grad


def _swapped(w: Any, xs: Any) -> Any:
    value, grad = fg.value_and_grad(_rnn)(w, xs)
    return grad, value


def _after_work(w: Any, xs: Any) -> Any:
    return fg.value_and_grad(_rnn)(fnp.tanh(w), xs)


def _twice(w: Any, xs: Any) -> Any:
    return fg.value_and_grad(_rnn)(w, xs), fg.value_and_grad(_rnn)(w, xs * 2.0)


@pytest.mark.parametrize("f", [_scaled, _after_work, _twice])
def test_anything_else_is_digested(plans: Path, f: Any) -> None:
    assert _traced(f, *RNN_ARGS).inlined is None
    fresh = fg.jit(f)(*RNN_ARGS)
    again = fg.jit(f)(*RNN_ARGS)  # the plan read back under the graph's digest
    assert plan_cache.COUNTERS.loaded == 1
    config.update("plan_cache", False)
    try:
        want = fg.jit(f)(*RNN_ARGS)
    finally:
        config.update("plan_cache", True)
    for got in (fresh, again):
        _same_bits(_leaves(got), _leaves(want))


def _key(f: Any, *args: Any) -> Any:
    traced = _traced(f, *args)
    return plan_cache.inlined_key(traced.graph, traced.inlined)


def test_the_key_holds_names_types_and_op_records(
    plans: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastgrad.core.primitive import REGISTRY

    def renamed(a: Any, b: Any) -> Any:
        return _rnn(a, b)

    w, xs = RNN_ARGS
    base = _key(fg.value_and_grad(_rnn), w, xs)
    others = [
        _key(fg.value_and_grad(renamed), w, xs),
        _key(fg.value_and_grad(_rnn), w.astype(np.float32), xs.astype(np.float32)),
        _key(fg.value_and_grad(_rnn, (0, 1)), w, xs),
    ]
    # An op of the backward graph alone (the matmul's VJP transposes): not in f's key.
    forward = _traced(_rnn, w, xs).graph
    assert "transpose" not in {n.op.name for n in forward.nodes}
    monkeypatch.setattr(REGISTRY["transpose"], "extra", {"note": 1})
    others.append(_key(fg.value_and_grad(_rnn), w, xs))
    assert None not in others and len({base, *others}) == len(others) + 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_gradients_read_back_give_the_fresh_bits(plans: Path, dtype: Any, data: Any) -> None:
    program, xs = _random_program(data, dtype)
    argnums = tuple(range(len(xs)))
    f = fg.value_and_grad(lambda *a: fnp.sum(program(*a)), argnums)
    for path in plans.iterdir():
        path.unlink()
    config.update("plan_cache", False)
    try:
        want = _leaves(fg.jit(f)(*xs))
    finally:
        config.update("plan_cache", True)
    assert _traced(f, *xs).inlined is not None
    loaded = plan_cache.COUNTERS.loaded
    for _ in range(2):  # stored, then read back
        _same_bits(_leaves(fg.jit(f)(*xs)), want)
    assert plan_cache.COUNTERS.loaded == loaded + 1


def test_a_stored_backward_graph_inlined_from_its_rows_is_the_decoded_one(
    plans: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reverse-mode graph read from disk goes into the jitted trace straight from its
    rows (plan_codec.StoredGraph, no node made for it) once the traced graph's nodes are
    asked for (core.interpreter.DeferredGraph): the traced graph is the one its decoded
    nodes give (same digest, same printed program), and so is its plan's key."""
    from fastgrad.compiler import plan_codec

    f = fg.value_and_grad(_rnn)
    _check(fg.jit(f)(*RNN_ARGS))  # the backward graph built, saved
    rows = plan_codec.StoredGraph.inline_rows
    used: list[bool] = []

    def counted(graph: Any) -> Any:
        stream = rows(graph)
        used.append(stream is not None)
        return stream

    monkeypatch.setattr(plan_codec.StoredGraph, "inline_rows", counted)
    loaded = plan_cache.GRAPH_COUNTERS.loaded
    from_rows = _traced(f, *RNN_ARGS)
    assert used == [] and plan_cache.GRAPH_COUNTERS.loaded == loaded + 1  # held back
    assert from_rows.graph.nodes and used == [True]  # made when asked for, from the rows
    monkeypatch.setattr(plan_codec.StoredGraph, "inline_rows", lambda graph: None)
    from_nodes = _traced(f, *RNN_ARGS)
    assert plan_cache.GRAPH_COUNTERS.loaded == loaded + 2
    assert str(from_rows.graph) == str(from_nodes.graph)
    assert graph_key.graph_digest(from_rows.graph) == graph_key.graph_digest(from_nodes.graph)
    keys = [plan_cache.inlined_key(t.graph, t.inlined) for t in (from_rows, from_nodes)]
    assert None not in keys and keys[0] == keys[1]
    stored = plan_cache.load_graph(from_rows.inlined[0])
    assert isinstance(stored, plan_codec.StoredGraph)
    stored.verify()  # its nodes, made when asked for, define its outputs
    assert stored.inline_rows is not None and stored.nodes[-1].out in stored.outputs


def _closing_over(w: Any, xs: Any) -> Any:
    return _rnn(w, xs) + fnp.sum(w * _WEIGHTS)


_WEIGHTS = np.arange(9.0).reshape(3, 3)


@pytest.mark.parametrize(
    "vg",
    [
        fg.value_and_grad(_rnn),
        fg.value_and_grad(_closing_over),
        fg.grad(_rnn),  # some of the inlined graph's outputs
        fg.grad(_rnn, (0, 1)),
        _swapped,  # in another order
    ],
)
def test_a_warm_call_makes_no_node_of_the_backward_graph(plans: Path, vg: Any) -> None:
    """A jitted gradient whose plan is on disk is named, read and run with its traced
    graph held back (core.interpreter.DeferredGraph: the stored backward graph never
    inlined node by node), its constants stored with the plan, whichever of its outputs
    it returns; its nodes, asked for later, are the graph the cache-off trace gives, and
    the results its bits."""
    from fastgrad.core.interpreter import DeferredGraph

    fg.jit(vg)(*RNN_ARGS)  # the backward graph and the plan built, saved
    config.update("plan_cache", False)
    try:
        want = fg.jit(vg)(*RNN_ARGS)
        plain = _traced(vg, *RNN_ARGS).graph
    finally:
        config.update("plan_cache", True)
    jitted = fg.jit(vg)
    got = jitted(*RNN_ARGS)
    (traced,) = jitted._cache.values()
    assert plan_cache.COUNTERS.loaded == 1
    assert isinstance(traced.graph, DeferredGraph) and not traced.graph.made
    # Nor are the stored graph's rows read from their run of ints (plan_codec.encode_graph).
    assert "_rows" not in vars(traced.graph.source)
    _same_bits(_leaves(got), _leaves(want))
    assert not isinstance(plain, DeferredGraph)  # (nothing held back with the cache off)
    assert str(traced.graph) == str(plain) and traced.graph.made


def test_a_graph_made_lets_go_of_what_it_was_made_from(plans: Path) -> None:
    """Once a held-back graph's nodes are made (a plan not on disk), the trace it was
    recorded in and the stored graph go (they would live as long as the jitted function);
    asked again, its key is worked out the same way, and the plan reads back."""
    import gc
    import weakref

    from fastgrad.core.tracing import Trace

    f = fg.jit(fg.value_and_grad(_rnn))
    _check(f(*RNN_ARGS))
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, Trace)]
    traced = _traced(fg.value_and_grad(_rnn), *RNN_ARGS)
    key = plan_cache.inlined_key(traced.graph, traced.inlined)
    held = weakref.ref(traced.graph.deferred.trace)
    assert traced.graph.nodes  # made
    gc.collect()
    assert held() is None
    assert plan_cache.inlined_key(traced.graph, traced.inlined) == key
