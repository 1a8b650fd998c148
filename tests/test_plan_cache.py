"""Prepared plans on disk (compiler.plan_cache): a plan loaded in place of a fresh one is
the same plan (graph, loops with the nodes fusion made for them, kernel sources) and gives
the same bits, and so is a traced function whose reverse-mode graph was read from disk; a
file that is truncated, damaged, of another format or version, or moved under another key
is rebuilt, never trusted; graphs with no plain-data form are prepared every time; two
processes writing one plan at once both answer and leave a whole file; the key holds the
graph's values (not how its objects are shared), what planning reads of its ops' records
and NumPy's version; the codec stores every field of a loop or refuses the plan.

Cost: ~25 s with the kernels on disk on a loaded 2-core machine (~95 s cold), most of it
the kernels of the random programs (compiled once each, shared by the fresh and the loaded
plan) and the two child processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import graph_key, plan_cache, plan_codec
from fastgrad.compiler.codegen.source import KernelSource
from fastgrad.compiler.fusion import Call, Loop
from fastgrad.core.config import config
from fastgrad.core.ir import Graph, Node
from fastgrad.testing import strategies as fst


def _prepared(f: Any, *args: Any) -> Any:
    """A new jitted `f`'s lowered form for `args`: traced and prepared afresh in this
    process, as a new process would (the plan read from disk if it is there)."""
    return fg.jit(f).lower(*args)


def _three_ways(plans: Path, f: Any, xs: Any) -> tuple[Any, Any, Any]:
    """`f` prepared afresh with the plan cache off, then twice with it on: the plan is
    stored by the first, and loaded by the second (which traces with the reverse-mode
    graph read back: its key must be the first's)."""
    for path in plans.glob("*.plan"):
        path.unlink()
    config.update("plan_cache", False)
    fresh = _prepared(f, *xs)
    config.update("plan_cache", True)
    counters = plan_cache.COUNTERS
    before = counters.saved, counters.loaded
    saved = _prepared(f, *xs)
    loaded = _prepared(f, *xs)
    assert (counters.saved, counters.loaded) == (before[0] + 1, before[1] + 1)
    return fresh, saved, loaded


def _same_bits(a: Any, b: Any) -> None:
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True), (x, y)


def _random_program(data: Any, dtype: Any) -> tuple[Any, tuple[np.ndarray, ...]]:
    """A random program of a few steps (fastgrad.testing.strategies) and its inputs."""
    program = data.draw(fst.programs(max_steps=4))
    xs = data.draw(st.tuples(*(fst.arrays(s, dtype, "real") for s in program.shapes)))
    return program, xs


def _value_and_grads(program: Any) -> Any:
    """A function returning `program`'s outputs, the value of their sum and its gradient
    in every argument."""

    def f(*args: Any) -> Any:
        argnums = tuple(range(len(args)))
        value, grads = fg.value_and_grad(lambda *a: fnp.sum(program(*a)), argnums)(*args)
        return (program(*args), value, *grads)

    return f


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_loaded_plan_is_the_fresh_plan(plans: Path, dtype: Any, data: Any) -> None:
    program, xs = _random_program(data, dtype)
    f = _value_and_grads(program)
    fresh, saved, loaded = _three_ways(plans, f, xs)
    assert plan_cache.GRAPH_COUNTERS.loaded >= 1  # the reverse-mode graph, read back
    for other in (saved, loaded):
        assert str(other.graph) == str(fresh.graph)  # traced with the stored VJP graph
        assert str(other.executable.graph) == str(fresh.executable.graph)
        assert other.kernels == fresh.kernels
        assert other.explain() == fresh.explain()
    assert _plan_form(loaded.executable) == _plan_form(fresh.executable)
    _same_bits(fresh.executable(list(xs)), loaded.executable(list(xs)))
    _same_bits(fg.jit(f, fuse=False)(*xs), fg.jit(f, fuse=False)(*xs))  # the oracle runs


def _plan_form(executable: Any) -> list[Any]:
    """A plan's steps with its values numbered in order of appearance: each loop's nodes
    (the graph's, and the copies and rewired readers fusion made), their levels, its
    inputs and outputs. Equal forms are equal plans, whatever objects hold them."""
    number: dict[int, int] = {}

    def n(v: Any) -> int:
        return number.setdefault(id(v), len(number))

    graph = executable.graph
    for v in [*graph.inputs, *(node.out for node in graph.nodes)]:
        n(v)
    form: list[Any] = []
    for step in executable.steps:
        if isinstance(step, Loop):
            nodes = [
                (node.op.name, [n(v) for v in node.inputs], repr(node.params), n(node.out))
                for node in step.nodes
            ]
            levels = sorted((n(v), level) for v, level in _level_items(step))
            form.append(("loop", step.shape, step.reduce_axes, nodes, levels))
            form.append(([n(v) for v in step.inputs], [n(v) for v in step.outputs]))
        else:
            form.append(("call", step.node.op.name, n(step.node.out)))
    return form


def _level_items(loop: Loop) -> list[Any]:
    by_id = {id(node.out): node.out for node in loop.nodes}
    assert set(loop.level) <= set(by_id), "a level for a value the loop does not make"
    return [(by_id[k], level) for k, level in loop.level.items()]


def _made_by_fusion(executable: Any) -> int:
    """How many of the plan's loop nodes are not the graph's (fusion._copy_cheap_outputs)."""
    graph_nodes = {id(node) for node in executable.graph.nodes}
    loops = [s for s in executable.steps if isinstance(s, Loop)]
    return sum(id(node) not in graph_nodes for loop in loops for node in loop.nodes)


@st.composite
def _spread_programs(draw: Any) -> Any:
    """A random program over an outer combination u of two short vectors, times u and over
    a full reduction of u: the backward loops need u, which costs two short reads to
    recompute against n*n to store, so fusion copies its cheap work into them."""
    n = draw(st.integers(4, 5))
    op = draw(st.sampled_from(["add", "subtract", "multiply", "maximum"]))
    program = draw(fst.programs(max_steps=3, shapes=((n, n),)))

    def spread(a: Any, b: Any) -> Any:
        u = getattr(fnp, op)(fnp.reshape(a, (n, 1)), fnp.reshape(b, (1, n)))
        return program(u) * u / (1.0 + fnp.sum(u * u))

    return n, spread


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_loaded_plan_with_fusions_copies_is_the_fresh_plan(
    plans: Path, compiled_first_call: None, data: Any
) -> None:
    """Plans whose loops hold copies of cheap work (and readers rewired to them) are stored
    with those nodes, and come back as the same plan giving the same bits, from the same
    compiled kernels. (~5 s with its kernels on disk, ~40 s cold on a loaded 2-core
    machine: each example compiles a few.)"""
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    n, spread = data.draw(_spread_programs())
    xs = data.draw(st.tuples(fst.arrays((n,), dtype, "real"), fst.arrays((n,), dtype, "real")))
    fresh, _, loaded = _three_ways(plans, _value_and_grads(spread), xs)
    assert _made_by_fusion(fresh.executable) > 0  # the case this test is for
    assert _plan_form(loaded.executable) == _plan_form(fresh.executable)
    assert loaded.kernels == fresh.kernels and loaded.explain() == fresh.explain()
    _same_bits(fresh.executable(list(xs)), loaded.executable(list(xs)))


def _softmax_xent(w: Any, x: Any, labels: Any) -> Any:
    z = x @ w
    z = z - fg.stop_gradient(fnp.max(z, axis=1, keepdims=True))
    rows = np.arange(z.shape[0])
    return fnp.sum(fnp.log(fnp.sum(fnp.exp(z), axis=1)) - z[rows, labels])


def _sampled(scale: Any, key: Any) -> Any:
    return fnp.sum(fnp.tanh(scale * fg.random.normal(key, (5, 3), scale.dtype)))


FIXED = [
    (_softmax_xent, (np.eye(3)[:, :2] * 0.5, np.ones((4, 3)), np.array([0, 1, 1, 0]))),
    (_sampled, (np.full(3, 0.7, np.float32), fg.random.key(1))),
]


@pytest.mark.parametrize("f, args", FIXED, ids=["labels-pick", "random-normal"])
def test_a_loaded_plan_is_the_fresh_plan_for_picks_and_samples(
    plans: Path, f: Any, args: Any
) -> None:
    """Nodes with several params (a scatter's shape and index), constants that decide
    fusion (the pick's arange), and samplers' positional ops; planning only."""
    vg = fg.value_and_grad(f)
    config.update("plan_cache", False)
    fresh = _prepared(vg, *args)
    config.update("plan_cache", True)
    _prepared(vg, *args)
    loaded = _prepared(vg, *args)
    assert plan_cache.COUNTERS.loaded == 1
    assert str(loaded.executable.graph) == str(fresh.executable.graph)
    assert loaded.kernels == fresh.kernels and loaded.explain() == fresh.explain()


def _rnn(w: Any, xs: Any) -> Any:
    h, total = xs[0] * 0.0, 0.0
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] + h @ w)
        total = total + fnp.sum(h * h)
    return total


RNN_ARGS = (np.eye(3) * 0.5, np.linspace(-1.0, 1.0, 12).reshape(4, 1, 3))


def _expected() -> Any:
    return fg.jit(fg.value_and_grad(_rnn), fuse=False)(*RNN_ARGS)


def _run_new() -> Any:
    """A new jitted value_and_grad of the RNN, run: answers, whatever the disk held."""
    return fg.jit(fg.value_and_grad(_rnn))(*RNN_ARGS)


def _check(got: Any) -> None:
    want = _expected()
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def _one_plan(plans: Path) -> Path:
    (path,) = plans.glob("*.plan")
    return path


def _corrupt_payload(blob: bytes) -> bytes:
    at = len(blob) - 40
    return blob[:at] + bytes([blob[at] ^ 0xFF]) + blob[at + 1 :]


def _truncate(blob: bytes) -> bytes:
    return blob[: len(blob) // 2]


def _other_format(blob: bytes) -> bytes:
    return b"fastgrad-plan-0\n" + blob[len(plan_cache.FORMAT) :]


def _empty(blob: bytes) -> bytes:
    return b""


def _check_damage_rebuilt(plans: Path, kind: str, counters: Any, damage: Any) -> None:
    """The RNN's file of `kind` ("plan", "tables"), damaged, is dropped (`counters` say so),
    rebuilt and stored again as it was, then read by the next new function."""
    _check(_run_new())
    (path,) = plans.glob(f"*.{kind}")
    whole = path.read_bytes()
    path.write_bytes(damage(whole))
    if kind == "plan":  # (read where no executable is stored: runtime.stored_plan)
        for tables in plans.glob("*.tables"):
            tables.unlink()
    _check(_run_new())
    assert (counters.dropped, counters.loaded, counters.saved) == (1, 0, 2)
    assert path.read_bytes() == whole  # rebuilt and stored again
    _check(_run_new())
    assert counters.loaded == 1


def _check_other_version_unused(
    plans: Path, kind: str, counters: Any, version: tuple[Any, str], monkeypatch: Any
) -> None:
    """The RNN's file of `kind`, written by another version (`version`: the module and the
    name of the function saying which), is neither read nor replaced: a file of its own."""
    _check(_run_new())
    (old,) = plans.glob(f"*.{kind}")
    monkeypatch.setattr(*version, lambda: "another version")
    _check(_run_new())
    assert (counters.loaded, counters.saved) == (0, 2)
    assert len(list(plans.glob(f"*.{kind}"))) == 2 and old.exists()


@pytest.mark.parametrize("damage", [_corrupt_payload, _truncate, _other_format, _empty])
def test_a_damaged_plan_is_rebuilt_not_trusted(plans: Path, damage: Any) -> None:
    _check_damage_rebuilt(plans, "plan", plan_cache.COUNTERS, damage)


@pytest.mark.parametrize("damage", [_corrupt_payload, _truncate])
def test_a_damaged_reverse_mode_graph_is_rebuilt(plans: Path, damage: Any) -> None:
    _check(_run_new())
    (path,) = plans.glob("*.graph")
    whole = path.read_bytes()
    path.write_bytes(damage(whole))
    _check(_run_new())
    counters = plan_cache.GRAPH_COUNTERS  # the oracle's traces (fuse=False) read it too
    assert (counters.dropped, counters.saved) == (1, 2)
    assert plan_cache.COUNTERS.loaded == 1  # the graph rebuilt is the one planned before
    assert path.read_bytes() == whole


def test_a_replaced_rule_is_neither_stored_nor_read(
    plans: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VJP rule set at run time is not in the key: its graph must not go to disk, and a
    graph stored with the real rule must not stand in for it."""
    from fastgrad.core.primitive import REGISTRY

    right = _run_new()
    _check(right)
    assert plan_cache.GRAPH_COUNTERS.saved == 1
    monkeypatch.setattr(REGISTRY["tanh"], "vjp", lambda g, out, x: (g * 2.0,))
    value, grad = _run_new()
    assert not np.allclose(grad, right[1])  # the replaced rule ran
    assert plan_cache.GRAPH_COUNTERS.saved == 1 and len(list(plans.glob("*.graph"))) == 1


def test_small_graphs_are_prepared_afresh(plans: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_cache, "MIN_NODES", 10**6)
    _check(_run_new())
    assert not list(plans.iterdir())


def test_eager_gradients_write_nothing(plans: Path) -> None:
    w, xs = RNN_ARGS
    value, _ = fg.value_and_grad(_rnn)(w, xs)
    assert not list(plans.iterdir())
    np.testing.assert_allclose(value, _expected()[0], rtol=1e-12)


def test_a_plan_moved_under_another_key_is_not_trusted(plans: Path) -> None:
    """A whole, valid file stored under another graph's key (its digest binds the key)."""
    _check(_run_new())
    rnn_plan = _one_plan(plans)
    other = fg.jit(fg.value_and_grad(lambda w, xs: fnp.sum(fnp.exp(fnp.tanh(xs @ w)))))
    other(*RNN_ARGS)
    (other_plan,) = set(plans.glob("*.plan")) - {rnn_plan}
    other_plan.write_bytes(rnn_plan.read_bytes())
    for tables in plans.glob("*.tables"):  # (read where no executable is stored)
        tables.unlink()
    got = fg.jit(fg.value_and_grad(lambda w, xs: fnp.sum(fnp.exp(fnp.tanh(xs @ w)))))(*RNN_ARGS)
    assert plan_cache.COUNTERS.dropped == 1
    w, xs = RNN_ARGS
    np.testing.assert_allclose(got[0], np.sum(np.exp(np.tanh(xs @ w))), rtol=1e-12)


def test_a_plan_of_another_version_is_not_used(
    plans: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = (plan_cache, "source_version")
    _check_other_version_unused(plans, "plan", plan_cache.COUNTERS, version, monkeypatch)


def test_the_switch_keeps_plans_off_the_disk(plans: Path) -> None:
    config.update("plan_cache", False)
    try:
        _check(_run_new())
    finally:
        config.update("plan_cache", True)
    assert not list(plans.glob("*.plan"))


def test_graphs_without_a_plain_form_are_prepared_every_time(plans: Path) -> None:
    """A scan's params hold its body's graph and rules: no plan is stored for it."""

    def f(x: Any) -> Any:
        carry, _ = fg.scan(lambda c, t: (c * 0.5 + fnp.sin(t), None), x[0], x)
        return fnp.sum(carry)

    x = np.linspace(0.0, 1.0, 6).reshape(3, 2)
    got = fg.jit(fg.grad(f))(x)
    np.testing.assert_allclose(got, fg.jit(fg.grad(f), fuse=False)(x), rtol=1e-12)
    assert plan_cache.COUNTERS.uncacheable >= 1 and not list(plans.glob("*.plan"))


def _tanh_chain(w: Any, x: Any) -> Any:
    h = x
    for _ in range(30):
        h = fnp.tanh(h @ w + 0.5)
    return fnp.sum(h * h)


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    import fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.compiler import plan_cache

    plan_cache.path_of = lambda key, kind="plan": Path(sys.argv[1]) / f"{key}.{kind}"
    plan_cache.MIN_NODES = 0

    def _tanh_chain(w, x):
        h = x
        for _ in range(30):
            h = fnp.tanh(h @ w + 0.5)
        return fnp.sum(h * h)

    w = np.eye(4) * 0.3
    x = np.linspace(-1.0, 1.0, 8).reshape(2, 4)
    value, grad = fg.jit(fg.value_and_grad(_tanh_chain))(w, x)
    print(repr(float(value)), plan_cache.COUNTERS.saved, plan_cache.COUNTERS.loaded)
    """
)


def test_two_processes_writing_one_plan(plans: Path) -> None:
    """Both answer, and leave one whole file, which this process then loads. Kernels go to
    the session's cache (compiled by the first run only)."""
    env = dict(os.environ, FASTGRAD_COMPILE_NOTICE="0")
    run = [sys.executable, "-c", WRITER, str(plans)]
    procs = [subprocess.Popen(run, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    w, x = np.eye(4) * 0.3, np.linspace(-1.0, 1.0, 8).reshape(2, 4)
    want = fg.jit(fg.value_and_grad(_tanh_chain), fuse=False)(w, x)
    for value, saved, loaded in outs:
        np.testing.assert_allclose(float(value), want[0], rtol=1e-12)
        assert (saved, loaded) in (("1", "0"), ("0", "1"))  # the second may find the file
    # The plan, its executable's tables and the reverse-mode graph, whole (and the digests
    # of the planning and runtime layers' source): no temporary file left behind.
    suffixes = sorted(path.suffix for path in plans.iterdir())
    assert suffixes == [".graph", ".plan", ".sources", ".sources", ".tables"]
    got = fg.jit(fg.value_and_grad(_tanh_chain))(w, x)
    assert (plan_cache.COUNTERS.loaded, plan_cache.COUNTERS.dropped) == (1, 0)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


# ---------------------------------------------------------------- what a plan's key holds


def test_a_second_trace_loads_the_plan_the_first_saved(plans: Path) -> None:
    """The second trace reads the reverse-mode graph from disk: its graph is equal to the
    first's, though its values share tuples differently, and its key is the same (a digest
    that pickled the rows saw the sharing: the plan was saved twice and never loaded)."""
    _check(_run_new())
    _check(_run_new())
    assert (plan_cache.COUNTERS.saved, plan_cache.COUNTERS.loaded) == (1, 1)
    graph = fg.jit(fg.value_and_grad(_rnn)).lower(*RNN_ARGS).graph
    # Param names from the disk are equal strings, not the interned ones tracing uses: in
    # the second half of the nodes, as in a graph re-traced from a stored backward pass.
    half = len(graph.nodes) // 2
    nodes = graph.nodes[:half] + [
        Node(n.op, n.inputs, {k.encode().decode(): v for k, v in n.params.items()}, n.out)
        for n in graph.nodes[half:]
    ]
    mixed = Graph(graph.inputs, nodes, graph.outputs)
    assert graph_key.graph_digest(mixed) == graph_key.graph_digest(graph)


def test_a_changed_op_record_is_another_key(plans: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning reads an op's kind, loop expression and extra entries: a record changed at
    run time (or a primitive of the user's under a known name) is not the stored plan's."""
    from fastgrad.core.primitive import REGISTRY

    graph = fg.jit(fg.value_and_grad(_rnn)).lower(*RNN_ARGS).graph
    before = plan_cache.plan_key(graph)
    monkeypatch.setattr(REGISTRY["add"], "loop", "{1} + {0}")
    assert plan_cache.plan_key(graph) not in (before, None)
    monkeypatch.setattr(REGISTRY["add"], "extra", {"why": lambda: None})  # not fastgrad's
    assert plan_cache.plan_key(graph) is None  # nothing to say what that function does
    assert plan_cache.COUNTERS.uncacheable == 1


def test_another_numpy_is_another_key(plans: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = fg.jit(fg.value_and_grad(_rnn)).lower(*RNN_ARGS).graph
    before = plan_cache.plan_key(graph)
    monkeypatch.setattr(np, "__version__", np.__version__ + "+other")
    assert plan_cache.plan_key(graph) not in (before, None)


def test_the_codec_knows_every_field(plans: Path) -> None:
    """Every field of a loop, a call and a kernel source is stored (a field added to one
    must be added to plan_codec); an attribute it does not know makes the plan
    Uncacheable rather than lost on the way to disk."""
    assert {f.name for f in fields(Loop)} == plan_codec._LOOP_FIELDS
    assert {f.name for f in fields(Call)} == plan_codec._CALL_FIELDS
    assert {f.name for f in fields(KernelSource)} == plan_codec._SOURCE_FIELDS
    lowered = fg.jit(fg.value_and_grad(_rnn)).lower(*RNN_ARGS)
    executable = lowered.executable
    plan = (executable.graph, executable.steps, executable.generated)
    plan_codec.encode_plan(lowered.graph, *plan)  # stored as it is
    loop = next(s for s in executable.steps if isinstance(s, Loop))
    loop.unroll = 4  # type: ignore[attr-defined]
    with pytest.raises(plan_codec.Uncacheable, match="unroll"):
        plan_codec.encode_plan(lowered.graph, *plan)


def test_a_stored_constant_keeps_its_order() -> None:
    """A constant that is not the traced graph's is stored by value: one in Fortran order
    comes back in Fortran order (a matmul may sum in another order for one than for the
    other), and equal."""
    a = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    for x in (a, np.ascontiguousarray(a), a.T, np.float32(2.5) * np.ones((2, 2, 2))):
        back = plan_codec.array_from(plan_codec.array_bytes(x))
        assert back.dtype == x.dtype and np.array_equal(back, x)
        assert back.flags.f_contiguous == x.flags.f_contiguous
        assert back.flags.c_contiguous == x.flags.c_contiguous


def test_params_stored_once_come_back_exactly_and_apart() -> None:
    """Nodes' params are stored once per distinct value and decoded once: values that
    compare equal but differ (1, 1.0, True; 0.0 and -0.0) stay apart, and each node gets
    a dict of its own."""
    from fastgrad.core.ir import Aval, Var
    from fastgrad.core.primitive import REGISTRY

    x = Var(Aval((2,), np.dtype(np.float64)))
    kinds = [1, 1.0, True, 0.0, -0.0, (1, 2), (1.0, 2), (True, 2), 1, (1, 2), np.float32(1)]
    nodes, value = [], x
    for v in kinds:
        out = Var(x.aval)
        nodes.append(Node(REGISTRY["negative"], (value,), {"p": v}, out))
        value = out
    graph = Graph([x], nodes, [value])
    data = plan_codec.encode_graph(graph)
    assert len(data[-1]) == len(kinds) - 2  # the second 1 and (1, 2) are the first's
    back = plan_codec.decode_graph(data)
    for node, v in zip(back.nodes, kinds, strict=True):
        got = node.params["p"]
        assert repr(got) == repr(v) and type(got) is type(v)
        assert all(map(type.__eq__, map(type, got), map(type, v))) if type(v) is tuple else True
    back.nodes[0].params["p"] = 5
    assert back.nodes[-3].params["p"] == 1  # the same stored params, not the same dict


def test_the_sources_digest_follows_the_files(plans: Path, tmp_path: Path) -> None:
    """The planning layers' digest is kept under a key of their files' paths, sizes and
    modification times: an edit is another digest, and a damaged record is worked out
    again, never taken (sources_digest)."""
    package = tmp_path / "package"
    (package / "layer" / "inner").mkdir(parents=True)
    (package / "layer" / "a.py").write_text("a = 1\n")
    (package / "layer" / "inner" / "b.py").write_text("b = 2\n")
    (package / "layer" / "notes.txt").write_text("not source\n")
    first = plan_cache.sources_digest(package, ("layer",))
    (record,) = plans.glob("*.sources")
    assert plan_cache.sources_digest(package, ("layer",)) == first
    assert plan_cache.sources_digest(package, ("layer",), recursive=False) != first
    record.write_text("damaged")
    assert plan_cache.sources_digest(package, ("layer",)) == first
    assert record.read_text() == first  # written again
    (package / "layer" / "notes.txt").write_text("still not source\n")
    assert plan_cache.sources_digest(package, ("layer",)) == first
    source = package / "layer" / "inner" / "b.py"
    source.write_text("b = 3\n")  # the same size
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    edited = plan_cache.sources_digest(package, ("layer",))
    source.write_text("b = 2\n")
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 2 * 10**9))
    assert edited != first == plan_cache.sources_digest(package, ("layer",))
