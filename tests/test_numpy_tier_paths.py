"""The NumPy tier's shorter paths give the bits of the longer ones. A broadcast is left
to the ufuncs reading it where their results keep their shape (runtime.numpy_tier.
_passed): the loop gives the same bits as with every broadcast made, in float32 and
float64; a broadcast that is an output of the loop, read by something other than a
ufunc, or whose readers would give a smaller result, is made. A reduction of a float
array calls the ufunc's reduce (runtime.numpy_reductions.tier_impl): np.sum's (max's,
min's, prod's) bits and dtype, by slices or not, for any axes.

Cost: well under a second (no kernel compiled: the tier alone runs).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.fusion import Loop, partition
from fastgrad.compiler.passes import simplify
from fastgrad.core.primitive import REGISTRY
from fastgrad.runtime.numpy_reductions import tier_impl
from fastgrad.runtime.numpy_tier import _BROADCAST, NumpyLoop


def _program(x: Any, b: Any, c: Any, s: Any) -> Any:
    bias = x + b  # (8,) -> (32, 8): left to the add
    scaled = bias * s  # () -> (32, 8): left to the multiply
    both = fnp.broadcast_to(b, (32, 8)) + fnp.broadcast_to(c, (32, 8))  # (8,) and (32, 1)
    wide = fnp.broadcast_to(s, (32, 8))  # an output of the loop: made
    total = fnp.sum(fnp.broadcast_to(c, (32, 8)), axis=0)  # read by a reduction: made
    # (8,) and (): both left to the multiply would give (8,): one is made
    pair = fnp.broadcast_to(fnp.sin(b), (32, 8)) * fnp.broadcast_to(fnp.cos(s), (32, 8))
    return scaled * both + 1.5 + pair, wide, total


def _loops_and_env(dtype: Any) -> tuple[list[Loop], Any, list[Any]]:
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(shape).astype(dtype) for shape in ((32, 8), (8,), (32, 1), ())]
    graph = simplify(fg.make_graph(_program)(*args))
    loops = [s for s in partition(graph) if isinstance(s, Loop)]
    slots: dict[int, int] = {}
    env: list[Any] = []

    def slot_of(v: Any) -> int:
        if id(v) not in slots:
            slots[id(v)] = len(env)
            env.append(None)
        return slots[id(v)]

    for v, a in zip(graph.inputs, args, strict=True):
        env[slot_of(v)] = a
    for node in graph.nodes:
        if node.op.name == "const":
            env[slot_of(node.out)] = node.params["value"]
    return loops, slot_of, env


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_broadcasts_left_to_ufuncs_give_the_same_bits(dtype: Any) -> None:
    loops, slot_of, env = _loops_and_env(dtype)
    tiers = [NumpyLoop(loop, slot_of) for loop in loops]
    loop, tier = max(zip(loops, tiers, strict=True), key=lambda pair: len(pair[0].nodes))
    names = [n.op.name for n in loop.nodes]
    broadcasts = [i for i, name in enumerate(names) if name == "broadcast_to"]
    passed = set(tier.passed)
    assert passed and passed < set(broadcasts)  # some made: an output, a reduction's
    outputs = {i for i, n in enumerate(loop.nodes) if n.out in loop.outputs}
    assert not passed & outputs
    for i in passed:  # each read by ufuncs only
        readers = [n for n in loop.nodes if loop.nodes[i].out in n.inputs]
        assert readers and all(n.op.ufunc is not None for n in readers)
    (pair,) = [  # (loop, tier, node) of the multiply of broadcasts from (8,) and ()
        (lp, t, n)
        for lp, t in zip(loops, tiers, strict=True)
        for n in lp.nodes
        if [_source(lp, v) for v in n.inputs] == [(8,), ()]
    ]
    lp, t, node = pair
    assert len({lp.nodes.index(_node(lp, v)) for v in node.inputs} & set(t.passed)) == 1
    got, want = list(env), list(env)
    for tier in tiers:
        made = copy.copy(tier)  # the same loop with every broadcast made
        made.ops = [
            (_BROADCAST(), *op[1:]) if i in tier.passed else op for i, op in enumerate(tier.ops)
        ]
        tier.run(got)
        made.run(want)
    for v in (v for loop in loops for v in loop.outputs):
        a, b = got[slot_of(v)], want[slot_of(v)]
        assert a.shape == b.shape == v.aval.shape and a.dtype == b.dtype == v.aval.dtype
        assert np.array_equal(a, b) and a.tobytes() == b.tobytes()


def _node(loop: Loop, v: Any) -> Any:
    return next(n for n in loop.nodes if n.out is v)


def _source(loop: Loop, v: Any) -> Any:
    """The shape broadcast `v` broadcasts from (None for anything else)."""
    node = next((n for n in loop.nodes if n.out is v), None)
    return node.inputs[0].aval.shape if node and node.op.name == "broadcast_to" else None


def test_a_stored_tier_passes_the_same_broadcasts() -> None:
    loops, slot_of, _ = _loops_and_env(np.float32)
    for loop in loops:
        tier = NumpyLoop(loop, slot_of)
        again = NumpyLoop(loop, slot_of, stored=tier.tables())
        assert again.passed == tier.passed
        assert [op[0] for op in again.ops] == [op[0] for op in tier.ops]


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.bool_])
def test_the_tiers_reductions_give_numpys_bits(name: str, dtype: Any) -> None:
    reference = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[name]
    reduce = tier_impl(name, REGISTRY[name].impl)
    rng = np.random.default_rng(1)
    shapes_axes = [
        ((32, 128), (0,)), ((32, 128), (1,)), ((32, 128), (0, 1)), ((3, 4, 5), (0, 2)),
        ((2048, 4), (1,)), ((2048, 2, 3), (1, 2)), ((2048, 3), (0,)), ((), ()), ((5,), (-1,)),
    ]  # fmt: skip
    for shape, axis in shapes_axes:
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        if x.ndim == 2:
            x = x[:, ::-1]  # a view whose last axis runs backward
        for keepdims in (False, True):
            for _ in range(2):  # (a shape's second reduction takes the remembered path)
                with np.errstate(all="ignore"):  # (as the tier runs: a product overflows)
                    got = reduce(x, axis=axis, keepdims=keepdims)
                    want = reference(x, axis=axis, keepdims=keepdims)
                assert np.shape(got) == np.shape(want) and got.dtype == want.dtype
                if (2048,) != shape[:1] or x.dtype.kind != "f":  # (slices: another order)
                    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
                else:
                    np.testing.assert_allclose(got, want, rtol=1e-5)
