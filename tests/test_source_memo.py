"""Loop sources generated once per structure (codegen.memo): a source reused for a loop is
the one generating it would give (text, and the loop's own values as its inputs,
scalars, outputs and index checks), on an unrolled RNN's gradient and on random programs;
loops differing in one op, dtype, shape, broadcast, constant or param have keys of their
own. ~3 s."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.codegen import memo
from fastgrad.compiler.codegen.loops import generate
from fastgrad.compiler.codegen.math_names import VECTOR_MATH
from fastgrad.compiler.fusion import partition
from fastgrad.compiler.passes import simplify
from fastgrad.compiler.steps import Loop
from fastgrad.testing import strategies as fst


def loops_of(function: Any, *args: Any) -> tuple[list[Loop], dict[int, np.ndarray]]:
    """The loops of `function`'s plan at `args`, and the graph's constants by id(var)."""
    graph = simplify(fg.make_graph(function)(*args))
    constants = {id(n.out): n.params["value"] for n in graph.nodes if n.op.name == "const"}
    return [s for s in partition(graph) if isinstance(s, Loop)], constants


def assert_reused_as_generated(loops: list[Loop], constants: dict[int, np.ndarray]) -> None:
    """Each loop's source through the memo equals its fresh generation, serial and
    parallel (KernelSource compares its values by identity)."""
    memo.clear()
    for parallel in (False, True):
        for loop in loops:
            fresh = generate(loop, parallel, VECTOR_MATH, constants)
            assert memo.generated(loop, parallel, VECTOR_MATH, constants) == fresh


def key(loop: Loop, constants: dict[int, np.ndarray], parallel: bool = False) -> Any:
    return memo.structure(loop, parallel, VECTOR_MATH, constants)[0]


def rnn_loss(wx: Any, wh: Any, b: Any, xs: Any, h0: Any) -> Any:
    h, total = h0, 0.0
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] @ wx + h @ wh + b)
        total = total + fnp.sum(h * h)
    return total / xs.size


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unrolled_rnn(dtype: Any) -> None:
    rng = np.random.default_rng(0)
    shapes = ((6, 8), (8, 8), (8,), (7, 4, 6), (4, 8))
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    loops, constants = loops_of(fg.value_and_grad(rnn_loss, argnums=(0, 1, 2)), *args)
    assert len({key(loop, constants) for loop in loops}) < len(loops) / 3  # steps share
    assert_reused_as_generated(loops, constants)


@settings(max_examples=25, deadline=None)
@given(fst.programs(max_steps=6), st.sampled_from([np.float32, np.float64]), st.booleans())
def test_random_programs(program: Any, dtype: Any, mixed: bool) -> None:
    """The program's gradient three times over inputs of their own (one copy in the other
    dtype if `mixed`): loops of one structure, and loops alike but for their dtype."""
    n = len(program.shapes)
    dtypes = [dtype, dtype, np.float64 if mixed and dtype == np.float32 else dtype]
    args = [np.ones(s, d) + k for k, d in enumerate(dtypes) for s in program.shapes]

    def loss(*a: Any) -> Any:
        return sum(fnp.sum(program(*a[k * n : (k + 1) * n])).astype(np.float64) for k in range(3))

    loops, constants = loops_of(fg.value_and_grad(loss, tuple(range(len(args)))), *args)
    assert_reused_as_generated(loops, constants)


def test_sin_and_cos_differ() -> None:
    x = np.ones((3, 4))
    assert_differ(lambda x, y: fnp.sin(x) * y, lambda x, y: fnp.cos(x) * y, (x, x), (x, x))


def test_dtypes_differ() -> None:
    f = lambda x, y: fnp.exp(x) + y  # noqa: E731
    a, b = np.ones((3, 4), np.float32), np.ones((3, 4), np.float64)
    assert_differ(f, f, (a, a), (b, b))
    assert_differ(f, f, (a, a), (a, np.ones((3, 4), np.int32)))


def test_shapes_differ() -> None:
    f = lambda x: fnp.sum(fnp.tanh(x), axis=1)  # noqa: E731
    assert_differ(f, f, (np.ones((3, 4)),), (np.ones((4, 3)),))
    assert_differ(f, lambda x: fnp.sum(fnp.tanh(x), axis=0), (np.ones((3, 4)),), (np.ones((3, 4)),))


def test_broadcasts_differ() -> None:
    """A row broadcast down a loop's rows and a column across its columns (the strides its
    operand is read with)."""
    x, y = np.ones((3, 3)), np.ones(3)
    row = lambda x, y: fnp.sin(x + y[None, :]) * x  # noqa: E731
    column = lambda x, y: fnp.sin(x + y[:, None]) * x  # noqa: E731
    assert_differ(row, column, (x, y), (x, y))


def test_constants_differ() -> None:
    x = np.ones(5)
    for a, b in ((2.0, 3.0), (2.0, -2.0), (0.0, -0.0)):
        assert_differ(power(a), power(b), (x,), (x,))
        assert_differ(scaled(a), scaled(b), (x,), (x,))


def power(exponent: float) -> Any:
    return lambda x: x**exponent + 1.0


def scaled(factor: float) -> Any:
    return lambda x: fnp.exp(x) * factor


def test_params_by_type_and_bits() -> None:
    """Params compare as they print: 1, 1.0 and True differ, so do 0.0 and -0.0."""
    keys = [memo._exact({"p": v}) for v in (1, 1.0, True, 0.0, -0.0, (1,), [1], "1")]
    assert len(set(keys)) == len(keys)
    assert memo._exact({"p": (0.5, np.float32(2))}) == memo._exact({"p": (0.5, np.float32(2))})


def assert_differ(f: Any, g: Any, f_args: Any, g_args: Any) -> None:
    """`f`'s and `g`'s last loops have keys of their own; through the memo (`f`'s first)
    each gets the source generated for it."""
    (*_, a), a_constants = loops_of(f, *f_args)
    (*_, b), b_constants = loops_of(g, *g_args)
    assert key(a, a_constants) != key(b, b_constants)
    memo.clear()
    for loop, constants in ((a, a_constants), (b, b_constants)):
        fresh = generate(loop, False, VECTOR_MATH, constants)
        assert memo.generated(loop, False, VECTOR_MATH, constants) == fresh
