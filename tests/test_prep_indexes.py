"""Preparation's indexes and incremental updates give what the straightforward computation
gives: the plans of random programs' gradients, of a mixture likelihood and of an unrolled
RNN are the same step for step. ~3 s."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import fusion
from fastgrad.compiler.passes import simplify
from fastgrad.compiler.steps import Loop
from fastgrad.testing import strategies as fst


def describe(steps: list[Any]) -> list[tuple[Any, ...]]:
    """The plan as plain data, values numbered in order of first appearance."""
    number: dict[int, int] = {}

    def n(v: Any) -> int:
        return number.setdefault(id(v), len(number))

    out = []
    for step in steps:
        if isinstance(step, Loop):
            nodes = [(m.op.name, [n(u) for u in m.inputs], n(m.out)) for m in step.nodes]
            out.append(
                (
                    "loop", step.shape, step.reduce_axes, nodes,
                    [n(v) for v in step.inputs], [n(v) for v in step.outputs],
                    sorted((number[k], lv) for k, lv in step.level.items() if k in number),
                )
            )  # fmt: skip
        else:
            out.append(("call", step.node.op.name, [n(u) for u in step.node.inputs]))
    return out


def _paste_rewriting_readers(cone: Any, v: Any, target: Any, users: Any, step_of: Any) -> None:
    """`fusion._paste` as it was: each rewritten reader replaced in the reader list of every
    value it reads (quadratic where one value is read at every step)."""
    pasted.append(v)
    before = list(target.nodes)
    paste(cone, v, target, users, step_of)
    for old, new in zip(before, target.nodes[len(target.nodes) - len(before) :], strict=True):
        if new is not old:
            for u in set(map(id, old.inputs)):
                users[u] = [new if r is old else r for r in users.get(u, [])]


paste = fusion._paste
pasted: list[Any] = []


def plans(graph: Any) -> tuple[Any, Any]:
    graph = simplify(graph)
    fast = describe(fusion.partition(graph))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fusion, "_paste", _paste_rewriting_readers)
        slow = describe(fusion.partition(graph))
    return fast, slow


def mixture_nll(means: Any, log_scales: Any, logits: Any, x: Any) -> Any:
    z = (x[:, None, :] - means) * fnp.exp(-log_scales)
    log_norm = fnp.sum(log_scales, axis=-1) + math.log(2 * math.pi)
    components = -0.5 * fnp.sum(z * z, axis=-1) - log_norm
    return -fnp.mean(fnp.logsumexp(components + logits - fnp.logsumexp(logits), axis=-1))


def rnn_loss(wx: Any, wh: Any, b: Any, xs: Any, h0: Any) -> Any:
    h, total = h0, 0.0
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] @ wx + h @ wh + b)
        total = total + fnp.sum(1.0 - h * h)
    return total


def test_models_plan_alike() -> None:
    rng = np.random.default_rng(0)
    mixture = [rng.standard_normal(s) for s in ((4, 2), (4, 2), (4,), (300, 2))]
    rnn = [rng.standard_normal(s) for s in ((3, 5), (5, 5), (5,), (6, 4, 3), (4, 5))]
    for loss, args in ((mixture_nll, mixture), (rnn_loss, rnn)):
        graph = fg.make_graph(fg.value_and_grad(loss, argnums=(0, 1, 2)))(*args)
        pasted.clear()
        fast, slow = plans(graph)
        assert fast == slow
        assert pasted  # the case pastes cheap work into later loops


@settings(max_examples=30, deadline=None)
@given(fst.programs(max_steps=8), st.sampled_from([np.float32, np.float64]))
def test_random_programs_plan_alike(program: Any, dtype: Any) -> None:
    args = [np.ones(s, dtype) for s in program.shapes]
    argnums = tuple(range(len(args)))
    graph = fg.make_graph(fg.value_and_grad(lambda *a: fnp.sum(program(*a)), argnums))(*args)
    fast, slow = plans(graph)
    assert fast == slow
