"""jit: signature cache, static arguments, pytrees, tracer behaviour, the graph and printer."""

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.ir import Aval, Graph, Node, Var
from fastgrad.core.primitive import REGISTRY


def test_traces_once_per_signature():
    calls = []

    @fg.jit
    def f(x, y):
        calls.append(1)
        return x * y

    f(np.ones(3), np.ones(3))
    f(np.zeros(3), np.ones(3))
    assert len(calls) == 1
    f(np.ones(4), np.ones(4))  # new shape
    f(np.ones(3, np.float32), np.ones(3))  # new dtype
    assert len(calls) == 3


def test_static_arguments_steer_python_control_flow():
    @fg.jit
    def plain(x, n):
        return x * n

    def power(x, n, *, clip=False):
        y = x
        for _ in range(n - 1):
            y = y * x
        return fnp.clip(y, -1, 1) if clip else y

    f = fg.jit(power, static_argnums=1, static_argnames="clip")
    np.testing.assert_allclose(f(np.full(2, 2.0), 3), [8.0, 8.0])
    np.testing.assert_allclose(f(np.full(2, 2.0), 3, clip=True), [1.0, 1.0])
    np.testing.assert_allclose(f(np.full(2, 2.0), n=2), [4.0, 4.0])
    np.testing.assert_allclose(plain(np.ones(2), 3), [3.0, 3.0])  # traced Python scalar
    g = fg.jit(fg.grad(power), static_argnums=1)
    np.testing.assert_allclose(g(np.array(2.0), 3), 12.0)


def test_pytrees_in_and_out():
    @fg.jit
    def f(tree):
        return {"sum": tree["a"] + tree["b"][0], "list": [tree["b"][1] * 2, None]}

    out = f({"a": np.ones(2), "b": (np.ones(2), np.ones(3))})
    assert set(out) == {"sum", "list"} and out["list"][1] is None
    np.testing.assert_array_equal(out["list"][0], np.full(3, 2.0))


def test_tracer_attributes_and_numpy_dispatch():
    seen = {}

    @fg.jit
    def f(x):
        seen.update(shape=x.shape, dtype=x.dtype, ndim=x.ndim, size=x.size, n=len(x))
        return np.exp(x).T + np.float32(1)  # a NumPy ufunc on a tracer dispatches to fnp

    out = f(np.zeros((2, 3), np.float32))
    assert seen == dict(shape=(2, 3), dtype=np.float32, ndim=2, size=6, n=2)
    assert out.shape == (3, 2) and out.dtype == np.float32
    np.testing.assert_array_equal(out, np.full((3, 2), 2.0))


def test_constant_outputs_and_python_scalar_arguments():
    out = fg.jit(lambda x: (x, 3.0, np.arange(2)))(1.5)
    assert out[0] == 1.5 and out[1] == 3.0
    np.testing.assert_array_equal(out[2], [0, 1])


def test_printed_graph_reads_like_the_code():
    def loss(params, x):
        z = x @ params["w"]
        return fnp.sum(z - fg.stop_gradient(fnp.max(z, axis=1, keepdims=True), name="shift"))

    text = str(fg.make_graph(loss)({"w": np.ones((3, 2), np.float32)}, np.ones((4, 3), np.float32)))
    assert text == "\n".join(
        [
            "graph(params_w: f32[3,2], x: f32[4,3]):",
            "    a: f32[4,2] = x @ params_w",
            "    b: f32[4,1] = max(a, axis=1, keepdims=True)",
            "    c: f32[4,1] = stop_gradient(b, name='shift')",
            "    d: f32[4,2] = broadcast_to(c, shape=(4, 2))",
            "    e: f32[4,2] = a - d",
            "    f: f32[] = sum(e, axis=(0, 1))",
            "    return (f,)",
        ]
    )


def test_printed_indexing():
    text = str(
        fg.make_graph(lambda z, y: z[1:, ::2][np.arange(2), y])(np.ones((3, 4)), np.zeros(2, int))
    )
    assert "a: f64[2,2] = z[1:3, 0:4:2]" in text
    assert "c: f64[2] = a[b, y]" in text


def test_verifier_rejects_a_mistyped_graph():
    x = Var(Aval((3,), np.dtype(np.float32)))
    wrong = Var(Aval((3,), np.dtype(np.float64)))
    graph = Graph([x], [Node(REGISTRY["exp"], [x], {}, wrong)], [wrong])
    with pytest.raises(TypeError, match="exp should give f32"):
        graph.verify()
    undefined = Var(x.aval)
    with pytest.raises(ValueError, match="before it is defined"):
        Graph([x], [Node(REGISTRY["exp"], [undefined], {}, Var(x.aval))], []).verify()
    # Without types (a trace's check unless config.check_graphs): the wiring only.
    assert graph.verify(types=False) is graph
    with pytest.raises(ValueError, match="before it is defined"):
        Graph([x], [Node(REGISTRY["exp"], [undefined], {}, Var(x.aval))], []).verify(False)
    twice = Node(REGISTRY["exp"], [x], {}, x)
    with pytest.raises(ValueError, match="defined twice"):
        Graph([x], [twice], [x]).verify(types=False)
    with pytest.raises(ValueError, match="not defined"):
        Graph([x], [], [undefined]).verify(types=False)


def test_a_trace_checks_types_only_when_asked(monkeypatch):
    """A trace type-checks its graph under config.check_graphs (the tests' setting), and
    checks only its wiring otherwise: a type rule that disagrees with the one the tracer
    bound by shows up only in the former."""
    from fastgrad.core import ir

    calls = []
    original = ir.Graph.verify

    def spy(self, types=True):
        calls.append(types)
        return original(self, types)

    monkeypatch.setattr(ir.Graph, "verify", spy)
    assert fg.config.check_graphs  # conftest sets FASTGRAD_CHECK_GRAPHS=1
    fg.make_graph(lambda v: fnp.exp(v))(np.ones(2))
    monkeypatch.setattr(fg.config, "check_graphs", False)
    fg.make_graph(lambda v: fnp.exp(v))(np.ones(2))
    assert calls == [True, False]


def test_tracers_have_the_array_methods_numpy_code_calls():
    x = np.arange(6.0).reshape(2, 3)

    def methods(x):
        return (
            x.var(),
            x.std(axis=0),
            x.var(1, ddof=1),
            x.dot(x.T),
            x.clip(1.0, 4.0),
            x.swapaxes(0, 1),
            x.copy(),
        )

    for got, want in zip(fg.jit(methods)(x), methods(x), strict=True):
        np.testing.assert_allclose(got, want)


def test_inlining_a_graph_gives_the_graph_the_node_by_node_path_gives():
    """eval_graph inlines on tracers of the recorded avals var by var (no tracer per value):
    the graph it gives prints like the one bind gives node by node (types run again),
    effects in order with fresh tokens, constants folded alike."""
    from fastgrad.core.interpreter import eval_graph, eval_nodes

    def f(x, n):
        fg.debug.print("x {}", x)
        y = fnp.exp(x) * (1.0 / 3.0) + fnp.sum(x) / x.shape[0]
        fg.debug.print("y {}", y)
        return y @ np.ones((3, 2), np.float32), n * 2

    inner = fg.make_graph(f)(np.ones((4, 3), np.float32), np.int64(3))

    def by_vars(x, n):
        return eval_graph(inner, [x, n])

    def by_nodes(x, n):
        env = eval_nodes(inner, [x, n])
        return [env[id(v)] for v in inner.outputs]

    args = (np.ones((4, 3), np.float32), np.int64(3))
    fast, slow = fg.make_graph(by_vars)(*args), fg.make_graph(by_nodes)(*args)
    assert str(fast) == str(slow) == str(inner)
    assert [n.op.name for n in fast.nodes].count("debug_print") == 2
