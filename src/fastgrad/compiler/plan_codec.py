"""A prepared plan as plain data, and what planning reads of a graph's ops' records.

`encode_plan` turns what preparation gives (the simplified graph, its partition into loops
and calls, the kernel sources generated for the loops) into tuples of ints, strings and
bytes, values named by their index; the nodes fusion made for a loop (copies of cheap work
and the readers it rewires to them, fusion._copy_cheap_outputs) are stored with the loop.
Stored nodes name their params by number in a table of the distinct ones (`_Params`),
which a reader decodes once each (a long unrolled loop repeats a few hundred).
`decode_plan` rebuilds it against the traced graph, whose inputs and constants it reuses;
`encode_graph` and `decode_graph` do the same for a whole graph of its own. A param value
of a type not listed in `encode_value` (a user's function in a custom rule, a loop body), an op
record holding a function fastgrad does not define, or an attribute of a loop the codec
does not know makes the graph `Uncacheable`: such a plan is built in every process, never
guessed at.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.source import KernelSource
from fastgrad.compiler.fusion import Call, Loop, Step
from fastgrad.core.interpreter import DeferredGraph
from fastgrad.core.ir import Aval, Graph, Node, Var
from fastgrad.core.primitive import REGISTRY

_PLAIN = (int, float, bool, str, type(None), bytes)
_INTS = frozenset((int,))  # (a set's check of the types, not a generator: every digest)


class Uncacheable(Exception):
    """The graph holds something that has no faithful plain-data form."""


def encode_value(value: Any, array: Any) -> Any:
    """`value` as nested tuples of plain values, each container tagged by its type.
    `array(a)` gives an ndarray's form (its bytes, or a reference to a known one)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is tuple:
        if _INTS.issuperset(map(type, value)):  # a shape or axes: most params
            return ("t", *value)
        return ("t", *(encode_value(v, array) for v in value))
    if kind is list:
        return ("l", *(encode_value(v, array) for v in value))
    if kind is np.ndarray:
        return ("a", array(value))
    if isinstance(value, np.dtype):
        return ("d", value.str)
    if isinstance(value, np.generic):
        return ("s", value.dtype.str, value.tobytes())
    if kind is slice:
        return ("sl", *(encode_value(v, array) for v in (value.start, value.stop, value.step)))
    raise Uncacheable(f"a param of type {kind.__name__}")


def decode_value(value: Any, array: Any) -> Any:
    if type(value) is not tuple:
        return value
    tag, rest = value[0], value[1:]
    if tag == "t":
        if all(type(v) is not tuple for v in rest):  # plain values (a shape, axes)
            return rest
        return tuple(decode_value(v, array) for v in rest)
    if tag == "l":
        return [decode_value(v, array) for v in rest]
    if tag == "a":
        return array(rest[0])
    if tag == "d":
        return np.dtype(rest[0])
    if tag == "s":
        return np.frombuffer(rest[1], np.dtype(rest[0]))[0]
    if tag == "sl":
        return slice(*(decode_value(v, array) for v in rest))
    raise ValueError(f"unknown tag {tag!r}")


def array_bytes(a: np.ndarray) -> tuple[Any, ...]:
    """dtype, shape, bytes in C order, and whether the array was in Fortran order (a BLAS
    call may take another path, and sum in another order, for one than for the other)."""
    fortran = a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous
    return a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes(), fortran


def array_from(form: tuple[Any, ...]) -> np.ndarray:
    dtype, shape, data, fortran = form
    a = np.frombuffer(data, np.dtype(dtype)).reshape(shape)
    return np.asfortranarray(a) if fortran else a.copy()


def _aval(a: Aval) -> tuple[tuple[int, ...], str, bool]:
    return a.shape, a.dtype.str, a.weak


def _params(node: Node, array: Any) -> tuple[Any, ...]:
    # In the params' own order, which the printed graph shows.
    return tuple(
        [(k, v if type(v) in _PLAIN else encode_value(v, array)) for k, v in node.params.items()]
    )


class _Avals:
    """Numbers for the distinct avals of a graph (most values share a few), and back."""

    def __init__(self) -> None:
        self.number: dict[Aval, int] = {}

    def __call__(self, aval: Aval) -> int:
        k = self.number.get(aval)
        if k is None:
            k = self.number[aval] = len(self.number)
        return k

    def table(self) -> tuple[Any, ...]:
        return tuple(_aval(a) for a in self.number)


class Numbered:
    """Numbers for distinct rows of plain data, told apart exactly: 1, 1.0 and True, or
    0.0 and -0.0, are other rows. `rows` lists them in the order first met."""

    def __init__(self) -> None:
        self.number: dict[Any, int] = {}
        self.rows: list[Any] = []

    def __call__(self, row: Any) -> int:
        key = exact(row)
        k = self.number.get(key)
        if k is None:
            k = self.number[key] = len(self.rows)
            self.rows.append(row)
        return k


class _Params(Numbered):
    """Numbers for the distinct params of a graph's nodes (6,598 nodes of the T=200 RNN's
    backward graph have 410), so that a reader decodes each once."""

    def __init__(self, array: Any) -> None:
        super().__init__()
        self.array = array

    def __call__(self, node: Node) -> int:  # type: ignore[override]
        return super().__call__(_params(node, self.array)) if node.params else -1


def exact(value: Any) -> Any:
    """A key equal only for values of the same types and bits (for `_Params`)."""
    kind = type(value)
    if kind is tuple:
        return tuple(map(exact, value))
    if kind is float:
        return kind, value.hex()
    return kind, value


def _params_from(rows: Any, array: Any) -> list[dict[str, Any]]:
    return [{k: decode_value(v, array) for k, v in row} for row in rows]


def _encode_nodes(graph: Graph, params: _Params) -> tuple[Any, Any, dict[int, int]]:
    """The aval table, the nodes as rows, and each value's index (inputs first); a node's
    params are its number in `params` (-1: none)."""
    index = {id(v): k for k, v in enumerate(graph.inputs)}
    avals = _Avals()
    number = avals.number  # (numbered here, not by a call per node: ~6,600 per graph)
    # Numbers by the aval object first: most values share their input's (an elementwise
    # op's rule gives it), and hashing an Aval is a Python call.
    by_object: dict[int, int] = {}
    at = index.__getitem__
    nodes = []
    for node in graph.nodes:
        out = node.out
        ins = tuple(map(at, map(id, node.inputs)))
        index[id(out)] = len(index)
        aval = out.aval
        k = by_object.get(id(aval))
        if k is None:
            k = number.get(aval)
            if k is None:
                k = number[aval] = len(number)
            by_object[id(aval)] = k
        nodes.append((node.op.name, ins, params(node), k, out.hint))
    return avals, tuple(nodes), index


def _avals_from(data: Any) -> list[Aval]:
    return [Aval(tuple(shape), np.dtype(dtype), weak) for shape, dtype, weak in data]


def _decode_nodes(
    inputs: list[Var],
    avals: list[Aval],
    nodes_data: Any,
    params: list[dict[str, Any]],
    made: dict[int, Var] | None = None,
) -> tuple[list[Var], list[Node]]:
    """The nodes of `_encode_nodes`'s rows, their params `params`' (each node a copy);
    `made`: values made already, by index (a `StoredGraph`'s outputs)."""
    values: list[Var] = list(inputs)
    nodes: list[Node] = []
    for name, ins, k, aval, hint in nodes_data:
        out = made.get(len(values)) if made else None
        if out is None:
            out = Var(avals[aval], hint)
        decoded = params[k].copy() if k >= 0 else {}
        nodes.append(Node(REGISTRY[name], tuple(map(values.__getitem__, ins)), decoded, out))
        values.append(out)
    return values, nodes


def _made(data: Any, values: list[Var], avals: list[Aval], params: list[Any]) -> Node:
    """A node fusion made (encode_plan's `member`), its new value appended to `values`."""
    name, ins, k, aval, hint, out = data
    if out is None:
        values.append(Var(avals[aval], hint))
    var = values[-1] if out is None else values[out]
    return Node(REGISTRY[name], [values[i] for i in ins], params[k].copy() if k >= 0 else {}, var)


def encode_graph(graph: Graph) -> tuple[Any, ...]:
    """A whole graph as plain data (raises Uncacheable); an array that several nodes hold
    is stored once and comes back as one array."""
    arrays: dict[int, int] = {}
    table: list[Any] = []

    def array(a: np.ndarray) -> int:
        k = arrays.get(id(a))
        if k is None:
            k = arrays[id(a)] = len(table)
            table.append(array_bytes(a))
        return k

    avals = _Avals()
    inputs = tuple((avals(v.aval), v.hint) for v in graph.inputs)
    params = _Params(array)
    node_avals, nodes, index = _encode_nodes(graph, params)
    outputs = tuple(index[id(v)] for v in graph.outputs)
    rows = tuple(params.rows)
    # The nodes as one run of int32 (name, params, aval, hint, input count, inputs): their
    # 6,600 tuples (the T=200 RNN's) unpickled took ~2 ms of a warm trace, which reads none.
    names, hints = Numbered(), Numbered()
    packed: list[int] = []
    for name, ins, k, aval, hint in nodes:
        packed += (names(name), k, aval, hints(hint), len(ins), *ins)
    n = len(inputs)
    made = tuple((nodes[k - n][3], hints(nodes[k - n][4])) for k in outputs if k >= n)
    runs = np.asarray(packed, np.int32).tobytes()
    head = (tuple(names.rows), tuple(hints.rows), runs, len(nodes), made)
    return avals.table(), inputs, node_avals.table(), head, outputs, tuple(table), rows


def decode_graph(data: tuple[Any, ...]) -> Graph:
    """`encode_graph`'s data as a graph of new values (a `StoredGraph`)."""
    return StoredGraph(data)


class StoredGraph(Graph):
    """A graph read from disk (`encode_graph`'s data) whose nodes are made when first
    asked for. Inlined into a trace on tracers of its inputs' avals (core.interpreter),
    its rows go into the trace as they are (`inline_rows`): the nodes of
    jit(value_and_grad(f))'s stored reverse-mode graph (6,600 at T=200) are not made
    twice, once here and once in the trace."""

    def __init__(self, data: tuple[Any, ...]) -> None:
        input_avals, inputs_data, avals_data, head, outputs, table, rows = data
        kinds = _avals_from(input_avals)
        self.inputs = [Var(kinds[aval], hint) for aval, hint in inputs_data]
        self._table, self._param_rows = table, rows  # (decoded when its rows are read)
        self._avals = _avals_from(avals_data)
        self._names, self._hints, self._runs, self._count, made = head
        # The outputs' values, made now (the nodes made later define them); where in the
        # values (inputs, then nodes' outputs) each is.
        self.output_places = list(outputs)
        count = len(self.inputs)
        places = [k for k in outputs if k >= count]
        if len(made) != len(places) or any(not count <= k < count + self._count for k in places):
            raise ValueError("the stored graph's outputs are not its values")
        self._made = {
            k: Var(self._avals[aval], self._hints[hint])
            for k, (aval, hint) in zip(places, made, strict=True)
        }
        self.outputs = [self.inputs[k] if k < count else self._made[k] for k in outputs]
        self._nodes: list[Node] | None = None

    @functools.cached_property
    def _rows(self) -> list[tuple[Any, ...]]:
        """Its nodes' rows, read from their run of ints (`encode_graph`) when first asked."""
        flat, names, hints = np.frombuffer(self._runs, np.int32).tolist(), self._names, self._hints
        rows, at = [], 0
        for _ in range(self._count):
            name, k, aval, hint, n = flat[at : at + 5]
            rows.append((names[name], tuple(flat[at + 5 : at + 5 + n]), k, aval, hints[hint]))
            at += 5 + n
        if at != len(flat):
            raise ValueError("the stored graph's nodes do not fill their run")
        return rows

    @functools.cached_property
    def _params(self) -> list[dict[str, Any]]:
        """The params of its rows, decoded when first read: a warm process whose traced
        graph is held back (core.interpreter.DeferredGraph) reads none."""
        arrays = [array_from(form) for form in self._table]
        return _params_from(self._param_rows, arrays.__getitem__)

    @property  # type: ignore[override]
    def nodes(self) -> list[Node]:
        if self._nodes is None:
            _, self._nodes = _decode_nodes(
                self.inputs, self._avals, self._rows, self._params, self._made
            )
        return self._nodes

    @nodes.setter
    def nodes(self, nodes: list[Node]) -> None:
        self._nodes = list(nodes)

    def node_count(self) -> int:
        """How many nodes it has (its rows, while its nodes are not made)."""
        return self._count if self._nodes is None else len(self._nodes)

    def inline_rows(self) -> Iterator[tuple[Any, tuple[int, ...], dict[str, Any], Aval]] | None:
        """Each node as (op, the places of its inputs among the values, params, aval), or
        None once the nodes are made (a caller may have changed them)."""
        if self._nodes is not None:
            return None
        params, avals = self._params, self._avals
        return (
            (REGISTRY[name], ins, params[k].copy() if k >= 0 else {}, avals[aval])
            for name, ins, k, aval, _ in self._rows
        )


def op_facts(graph: Graph, extra: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """What planning reads of the records of `graph`'s ops and of the ops `extra` (raises
    Uncacheable); a StoredGraph's ops are read from its rows (its nodes not made)."""
    if isinstance(graph, StoredGraph) and graph._nodes is None:
        ops = {id(op): op for op in map(REGISTRY.__getitem__, graph._names)}
    else:
        ops = {id(n.op): n.op for n in graph.nodes}
    ops.update((id(op), op) for op in extra)
    return tuple(sorted(_op_facts(op) for op in ops.values()))


def _op_facts(op: Any) -> tuple[Any, ...]:
    """What planning reads of an op's record besides its name: its kind, loop expression,
    effect and extra entries (a function by where fastgrad defines it). So a record changed
    at run time (a loop expression patched by a test) or a primitive registered by the
    user is another key; one holding a function fastgrad does not define is Uncacheable
    (its name says nothing of its code)."""

    def fact(value: Any) -> Any:
        if type(value) in _PLAIN:
            return value
        if type(value) in (tuple, list):
            return tuple(map(fact, value))
        if type(value) is dict:
            return tuple(sorted((k, fact(v)) for k, v in value.items()))
        if callable(value):
            module = getattr(value, "__module__", None) or ""
            if not module.startswith("fastgrad."):
                raise Uncacheable(f"{op.name} holds a function fastgrad does not define")
            return module, getattr(value, "__qualname__", "")
        raise Uncacheable(f"{op.name} holds a {type(value).__name__} in its record")

    extra = tuple(sorted((k, fact(v)) for k, v in op.extra.items()))
    return op.name, op.kind, op.loop, op.effect, extra


# What encode_plan stores of a loop, a call and a kernel source: an attribute it does not
# know (a field added to Loop, say) makes the plan Uncacheable rather than lost on the way
# (tests/test_plan_cache.py::test_the_codec_knows_every_field pins these lists).
_LOOP_FIELDS = frozenset(
    ("shape", "position", "reduce_axes", "nodes", "level", "inputs", "outputs")
)
_CALL_FIELDS = frozenset(("node", "position"))
_SOURCE_FIELDS = frozenset(
    ("name", "source", "inputs", "scalars", "outputs", "flat", "ops", "recomputed", "imports")
    + ("index_checks", "column")
)


def _check_known(thing: Any, known: frozenset[str]) -> None:
    unknown = set(vars(thing)) - known
    if unknown:
        raise Uncacheable(f"{type(thing).__name__} has {sorted(unknown)}, which are not stored")


def encode_plan(
    traced: Graph,
    graph: Graph,
    steps: list[Step],
    sources: dict[tuple[int, bool], KernelSource],
) -> tuple[Any, ...]:
    """The plan as plain data (raises Uncacheable). Constants that are the traced graph's
    are referred to by their place among its constant nodes; others are stored."""
    if len(graph.inputs) != len(traced.inputs) or any(
        a is not b for a, b in zip(graph.inputs, traced.inputs, strict=True)
    ):
        raise Uncacheable("the plan's inputs are not the traced graph's")
    array = functools.partial(array_form, places=constant_places(traced))

    for step in steps:
        _check_known(step, _LOOP_FIELDS if isinstance(step, Loop) else _CALL_FIELDS)
    for source in sources.values():
        _check_known(source, _SOURCE_FIELDS)

    params = _Params(array)
    avals, nodes, index = _encode_nodes(graph, params)
    node_at = {id(n): k for k, n in enumerate(graph.nodes)}

    def var(v: Var) -> int:
        try:
            return index[id(v)]
        except KeyError:
            raise Uncacheable("a step refers to a value not in the plan") from None

    def member(n: Node) -> Any:
        """A loop's node: its place in the graph, or, for a node fusion made (a copy of
        cheap work, fusion._paste, or a reader rewired to read the copy), the node itself,
        its output the value of the graph it stands for or a new one numbered here."""
        k = node_at.get(id(n))
        if k is not None:
            return k
        ins = tuple(map(var, n.inputs))  # made before: by the graph or an earlier copy
        out = index.get(id(n.out))
        if out is None:
            index[id(n.out)] = len(index)
        return (n.op.name, ins, params(n), avals(n.out.aval), n.out.hint, out)

    encoded_steps: list[Any] = []
    for step in steps:
        if isinstance(step, Call):
            if id(step.node) not in node_at:
                raise Uncacheable("a call runs a node that is not the graph's")
            encoded_steps.append(("call", node_at[id(step.node)], step.position))
            continue
        members = tuple(map(member, step.nodes))
        encoded_steps.append(
            (
                "loop",
                step.shape,
                step.position,
                step.reduce_axes,
                members,
                # The level of each node's value, in the nodes' order (None: it has none).
                tuple(step.level.get(id(n.out)) for n in step.nodes),
                tuple(map(var, step.inputs)),
                tuple(map(var, step.outputs)),
            )
        )
    texts: dict[str, int] = {}  # an unrolled loop's steps share a few distinct sources
    encoded_sources = []
    for (at, parallel), s in sorted(sources.items()):
        encoded_sources.append(
            (
                at,
                parallel,
                s.name,
                texts.setdefault(s.source, len(texts)),
                tuple(map(var, s.inputs)),
                tuple(map(var, s.scalars)),
                tuple(map(var, s.outputs)),
                s.flat,
                tuple(s.ops),
                tuple(s.recomputed),
                tuple(sorted(s.imports)),
                tuple(map(var, s.index_checks)),
                s.column,
            )
        )
    outputs = tuple(var(v) for v in graph.outputs)
    return (
        avals.table(),
        nodes,
        outputs,
        tuple(encoded_steps),
        tuple(texts),
        tuple(encoded_sources),
        tuple(params.rows),
    )


def array_form(a: np.ndarray, places: dict[int, int]) -> tuple[Any, ...]:
    """An array as stored: a traced graph's constant by place (`constant_places`), or bytes."""
    k = places.get(id(a))
    return ("ref", k) if k is not None else ("data", *array_bytes(a))


def array_of(form: tuple[Any, ...], consts: Callable[[], list[np.ndarray]]) -> np.ndarray:
    """The array `array_form` stored (`consts()`, the `constants`: asked for a reference)."""
    return consts()[form[1]] if form[0] == "ref" else array_from(form[1:])


def constant_places(traced: Graph) -> dict[int, int]:
    """Where each constant of `traced` is among its constants, by the id of its value (what
    stored data refers to); empty for a graph held back (core.interpreter.DeferredGraph):
    its constants are stored, as reading them would make its nodes."""
    if isinstance(traced, DeferredGraph):
        return {}
    return {id(value): k for k, value in enumerate(constants(traced))}


def constants(traced: Graph) -> list[np.ndarray]:
    """The values of `traced`'s constants, in its order (`constant_places`)."""
    return [n.params["value"] for n in traced.nodes if n.op.name == "const"]


def decode_plan(
    traced: Graph, data: tuple[Any, ...]
) -> tuple[Graph, list[Step], dict[tuple[int, bool], KernelSource]]:
    """`encode_plan`'s data rebuilt for `traced` (raises on anything that does not fit)."""
    avals_data, nodes_data, outputs, steps_data, texts, sources_data, rows = data
    listed = functools.cache(functools.partial(constants, traced))  # (at a first reference)
    array = functools.partial(array_of, consts=listed)

    avals = _avals_from(avals_data)
    params = _params_from(rows, array)
    values, nodes = _decode_nodes(traced.inputs, avals, nodes_data, params)
    graph = Graph(traced.inputs, nodes, [values[i] for i in outputs])
    steps: list[Step] = []
    for entry in steps_data:
        if entry[0] == "call":
            steps.append(Call(nodes[entry[1]], entry[2]))
            continue
        _, shape, position, axes, members, levels, ins, outs = entry
        loop = Loop(tuple(shape), position, tuple(axes))
        loop.nodes = [
            nodes[m] if type(m) is int else _made(m, values, avals, params) for m in members
        ]
        loop.level = {
            id(n.out): level
            for n, level in zip(loop.nodes, levels, strict=True)
            if level is not None
        }
        loop.inputs = [values[k] for k in ins]
        loop.outputs = [values[k] for k in outs]
        steps.append(loop)
    sources = {}
    for entry in sources_data:
        at, parallel, name, text, ins, scalars, outs, flat, ops, recomputed = entry[:10]
        imports, checks, column = entry[10:]
        sources[at, parallel] = KernelSource(
            name=name,
            source=texts[text],
            inputs=[values[k] for k in ins],
            scalars=[values[k] for k in scalars],
            outputs=[values[k] for k in outs],
            flat=flat,
            ops=list(ops),
            recomputed=list(recomputed),
            imports=set(imports),
            index_checks=[values[k] for k in checks],
            column=column,
        )
    # Not verified node by node: the file's digest vouches that this is the data written
    # for a graph of this digest, and that graph was built and checked by the passes.
    return graph, steps, sources
