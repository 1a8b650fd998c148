"""A traced graph's digest (compiler.graph_key), which names its stored plan: the same
program traced twice gives the same digest; a graph changed in any one thing planning
reads (an op, a param, a dtype, a shape, an edge, a name, a constant's bytes, an output)
gives another, so that no plan is read for a graph it was not made for; a param of a
type with no plain form makes the graph Uncacheable.

Cost: well under a second (small graphs, no kernel compiled).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import graph_key
from fastgrad.compiler.plan_codec import Uncacheable
from fastgrad.core.ir import Aval, Graph, Node, Var
from fastgrad.core.primitive import REGISTRY


def _model(x: Any, w: Any) -> Any:
    h = fnp.tanh(x @ w + 0.5)
    return fnp.sum(h * h, axis=1), fnp.mean(h)


X, W = np.linspace(-1.0, 1.0, 12).reshape(3, 4), np.eye(4) * 0.3


def _graph(f: Any = _model, *args: Any) -> Graph:
    return fg.make_graph(f)(*(args or (X, W)))


def _digest(graph: Graph) -> str:
    return graph_key.graph_digest(graph)


def _edited(graph: Graph, at: int, **change: Any) -> Graph:
    """`graph` with node `at` replaced by a copy changed as `change` says (op, inputs,
    params, out: its readers then read the new one); the other nodes are the same."""
    node = graph.nodes[at]
    fields = {"op": node.op, "inputs": node.inputs, "params": node.params, "out": node.out}
    fields.update(change)
    new = Node(fields["op"], fields["inputs"], fields["params"], fields["out"])

    def read(v: Var) -> Var:
        return new.out if v is node.out else v

    later = [Node(n.op, list(map(read, n.inputs)), n.params, n.out) for n in graph.nodes[at + 1 :]]
    return Graph(graph.inputs, [*graph.nodes[:at], new, *later], list(map(read, graph.outputs)))


def _find(graph: Graph, name: str) -> int:
    return next(k for k, n in enumerate(graph.nodes) if n.op.name == name)


def test_the_same_program_gives_the_same_digest() -> None:
    assert _digest(_graph()) == _digest(_graph())
    assert _digest(_graph(_model, X.astype(np.float32), W.astype(np.float32))) == _digest(
        _graph(_model, X.astype(np.float32), W.astype(np.float32))
    )


def test_any_change_gives_another_digest() -> None:
    graph = _graph()
    base = _digest(graph)
    tanh, total = _find(graph, "tanh"), _find(graph, "sum")
    product, add = _find(graph, "matmul"), _find(graph, "add")
    node = graph.nodes[total]
    out = graph.nodes[tanh].out
    changed = {
        "an op": _edited(graph, tanh, op=REGISTRY["sin"]),
        "a param's value": _edited(graph, total, params={**node.params, "axis": (0,)}),
        "a param's type (True for 1)": _edited(
            graph, total, params={**node.params, "keepdims": int(node.params["keepdims"])}
        ),
        "an edge": _edited(graph, add, inputs=graph.nodes[add].inputs[::-1]),
        "an edge to another value": _edited(
            graph, product, inputs=(graph.inputs[0], graph.inputs[0])
        ),
        "an output's dtype": _edited(graph, tanh, out=Var(Aval(out.aval.shape, np.dtype("f4")))),
        "an output's shape": _edited(
            graph, tanh, out=Var(Aval((1, *out.aval.shape), out.aval.dtype))
        ),
        "an output's aval, another value's": _edited(graph, tanh, out=Var(node.out.aval)),
        "a weak type": _edited(graph, tanh, out=Var(Aval(out.aval.shape, out.aval.dtype, True))),
        "a value's name": _edited(graph, tanh, out=Var(out.aval, "h")),
        "the outputs": Graph(graph.inputs, graph.nodes, graph.outputs[::-1]),
        "an input's dtype": _graph(_model, X.astype(np.float32), W),
        "an input's shape": _graph(_model, X[:2], W),
        "a small constant's bytes": _graph(lambda x, w: _model(x, w * 2.0), X, W),
        "an input made a constant": _graph(lambda x: _model(x, W), X),
    }
    other = W.copy()
    other[3, 3] = np.nextafter(other[3, 3], 1.0)  # one bit of a constant of 16 elements
    big = np.ones((9, 9))
    bigger = big.copy()
    bigger[8, 8] = -1.0  # past the size hashed by a digest of its own
    changed["a constant's last bit"] = _graph(lambda x: _model(x, other), X)
    changed["a large constant's last element"] = _graph(
        lambda x: x @ bigger[:4, :4] + bigger[0, 0], X
    )
    base_big = _digest(_graph(lambda x: fnp.sum(x) * big, X))
    digests = {what: _digest(g) for what, g in changed.items()}
    for what, digest in digests.items():
        assert digest != base, what
    assert digests["a large constant's last element"] != base_big
    assert len(set(digests.values())) == len(digests)  # each change its own digest


def test_zero_and_minus_zero_params_are_apart() -> None:
    """Params equal as Python values but not in bits or type (0.0 and -0.0; 1, 1.0 and
    True) give other digests."""
    x = Var(Aval((3,), np.dtype("f8")), "x")

    def graph(value: Any) -> Graph:
        out = Var(Aval((3,), np.dtype("f8")))
        return Graph([x], [Node(REGISTRY["sin"], [x], {"what": value}, out)], [out])

    values = [0.0, -0.0, 1, 1.0, True, np.float64(1.0), np.float32(1.0), (1,), [1]]
    digests = [_digest(graph(v)) for v in values]
    assert len(set(digests)) == len(values)
    assert _digest(graph(np.dtype("f4"))) != _digest(graph(np.dtype("f8")))
    assert _digest(graph(slice(0, 2))) != _digest(graph(slice(0, 3)))


@pytest.mark.parametrize("value", [lambda: None, {1, 2}.__contains__, object()])
def test_a_param_with_no_plain_form_is_uncacheable(value: Any) -> None:
    x = Var(Aval((3,), np.dtype("f8")))
    out = Var(Aval((3,), np.dtype("f8")))
    graph = Graph([x], [Node(REGISTRY["sin"], [x], {"fn": value}, out)], [out])
    with pytest.raises(Uncacheable):
        graph_key.graph_digest(graph)
