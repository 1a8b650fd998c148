"""The fast paths of tracing (ops.base, ops.products, ops.indexing, ufunc_records, core.
tracing): each gives what the general path gives, and each is taken where it should be
(the general path made to raise there)."""

import itertools

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.interpreter import run_graph
from fastgrad.core.ir import SUPPORTED_DTYPES, Aval
from fastgrad.core.primitive import REGISTRY
from fastgrad.core.tracing import Trace, Tracer, bind
from fastgrad.ops import base, indexing, products

F32 = np.dtype("float32")


def _refuse(*args, **kwargs):
    raise AssertionError("the general path ran where the fast path should have")


def test_broadcast_shapes_agree_with_numpy_and_skip_it(monkeypatch):
    dims = (0, 1, 2, 3)
    shapes = [s for n in range(4) for s in itertools.product(dims, repeat=n)]
    for a, b in itertools.product(shapes, shapes[::7]):
        try:
            expected = tuple(np.broadcast_shapes(a, b))
        except ValueError:
            with pytest.raises(ValueError, match=r"shapes \(.*\) cannot be broadcast together"):
                base.broadcast_shapes(a, b, what="x")
            continue
        assert base.broadcast_shapes(a, b) == expected, (a, b)
    # Shapes NumPy must judge still reach it: negative sizes, lists.
    with pytest.raises(ValueError, match="cannot be broadcast together"):
        base.broadcast_shapes((-1,), (1,))
    assert base.broadcast_shapes([2, 1], (3,)) == (2, 3)
    monkeypatch.setattr(np, "broadcast_shapes", _refuse)
    assert base.broadcast_shapes((4, 1, 3), (2, 1), ()) == (4, 2, 3)


def test_promotions_are_numpy_s_and_computed_once_each(monkeypatch):
    standins = {"b": False, "i": 0, "u": 0, "f": 0.0}
    avals = [Aval((), d, w) for d in sorted(SUPPORTED_DTYPES, key=str) for w in (False, True)]
    pairs = list(itertools.product(avals, avals))
    for pair in pairs:
        strong = [a.dtype for a in pair if not a.weak]
        weak = [standins[a.dtype.kind] for a in pair if a.weak]
        assert base.promote(pair) == (np.result_type(*strong, *weak), not strong)
    monkeypatch.setattr(np, "result_type", _refuse)
    for pair in pairs:
        base.promote(pair)


def test_alike_operands_are_neither_promoted_nor_broadcast(monkeypatch):
    monkeypatch.setattr(base, "promote", _refuse)
    monkeypatch.setattr(base, "broadcast_shapes", _refuse)
    graph = fg.make_graph(lambda a, b: fnp.tanh(a * b + a))(np.ones((2, 3)), np.ones((2, 3)))
    assert [n.op.name for n in graph.nodes] == ["multiply", "add", "tanh"]


def test_operands_that_differ_are_still_promoted_and_broadcast():
    f32, f64 = np.ones((2, 3), np.float32), np.ones(3)
    graph = fg.make_graph(lambda a, b: a + b)(f32, f64)
    assert [n.op.name for n in graph.nodes] == ["astype", "broadcast_to", "add"]
    assert graph.outputs[0].aval == Aval((2, 3), np.dtype("float64"))
    with Trace() as trace:  # a weak tracer of the same shape and dtype takes the strong one's
        strong = trace.new_input(Aval((2,), F32))
        weak = trace.new_input(Aval((2,), np.dtype("float64"), weak=True))
        assert (strong + weak).aval == Aval((2,), F32)
        assert (weak + weak).aval.weak


def test_an_elementwise_rule_gives_its_input_aval_when_nothing_changes():
    a, weak = Aval((2, 3), F32), Aval((2, 3), F32, weak=True)
    assert REGISTRY["tanh"].abstract_eval(a) is a
    assert REGISTRY["add"].abstract_eval(a, a) is a
    assert REGISTRY["add"].abstract_eval(weak, a) == a  # not the weak one
    assert REGISTRY["add"].abstract_eval(a, weak) is a
    assert REGISTRY["less"].abstract_eval(a, a) == Aval((2, 3), np.dtype(bool))
    with pytest.raises(ValueError, match="needs operands of one shape"):
        REGISTRY["add"].abstract_eval(a, Aval((3,), F32))


def test_a_product_of_matrices_is_one_node_without_the_general_path(monkeypatch):
    for x, y in [((3,), (3, 4)), ((2, 3), (3,)), ((2, 2, 3), (3, 4)), ((3,), (2, 3, 4))]:
        a, b = np.arange(np.prod(x)).reshape(x), np.arange(np.prod(y)).reshape(y)
        graph = fg.make_graph(lambda a, b: a @ b)(a, b)
        np.testing.assert_array_equal(run_graph(graph, [a, b])[0], a @ b)
    mixed = fg.make_graph(lambda a, b: a @ b)(np.ones((2, 3), np.float32), np.ones((3, 4)))
    assert [n.op.name for n in mixed.nodes] == ["astype", "matmul"]
    with pytest.raises(ValueError, match="do not align"):
        fg.make_graph(lambda a, b: a @ b)(np.ones((2, 3)), np.ones((4, 3)))
    for name in ("promote", "reshape", "broadcast_to"):
        monkeypatch.setattr(products, name, _refuse)
    graph = fg.make_graph(lambda a, b: a @ b)(np.ones((2, 3)), np.ones((3, 4)))
    assert [n.op.name for n in graph.nodes] == ["matmul"]


def test_an_int_index_takes_a_row_as_the_general_path_does(monkeypatch):
    xs = np.arange(24.0).reshape(3, 4, 2)
    rows = run_graph(fg.make_graph(lambda x: [x[i] for i in range(-3, 3)])(xs), [xs])
    for i, row in zip(range(-3, 3), rows, strict=True):
        np.testing.assert_array_equal(row, xs[i])
    with pytest.raises(IndexError, match="index 3 is out of bounds for axis 0 with size 3"):
        fg.make_graph(lambda x: x[3])(xs)
    monkeypatch.setattr(indexing, "normalize_index", _refuse)
    graph = fg.make_graph(lambda x: x[1])(xs)
    assert [n.op.name for n in graph.nodes] == ["slice", "reshape"]
    assert graph.outputs[0].aval.shape == (4, 2)


def test_scalar_arithmetic_on_constants_folds_and_nothing_else_does():
    with Trace() as trace:
        two = Tracer(trace, trace.const(np.float32(2)))
        ones = Tracer(trace, trace.const(np.ones(3, np.float32)))
        x = trace.new_input(Aval((), F32))
        folded = bind(REGISTRY["multiply"], two, two)
        assert trace._const_values[id(folded._var)] == 4
        kept = [bind(REGISTRY["multiply"], ones, ones), bind(REGISTRY["multiply"], two, x)]
    assert [n.op.name for n in trace.nodes] == ["const", "const", "const", "multiply", "multiply"]
    assert all(id(k._var) not in trace._const_values for k in kept)
