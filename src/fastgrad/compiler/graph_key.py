"""A traced graph's structural digest: what names its stored plan (compiler.plan_cache).

`graph_digest` hashes a graph by structure: each node's op, the places of its inputs among
the values (inputs first, then nodes' outputs), its params, its output's aval and name;
the graph's inputs and outputs; the bytes of its constants; and what planning reads of
its ops' records (plan_codec.op_facts). Two traces of the same program give the same
digest, in any process; two graphs that differ in any of these give another.

The nodes go in as columns (names, input counts, the inputs' places as one run, params,
avals by number, names of outputs), built by comprehensions with no Python work on the
params: the columns are pickled whole (without pickle's memo: equal values give equal
bytes however they are shared), and a param of a type pickle does not write by value
itself (a dtype, an array, a NumPy scalar, a slice) is written by `_Rows.reducer_override`
as a tagged tuple of plain values; any other object makes the graph Uncacheable. Pickle
writes 1, 1.0 and True, and 0.0 and -0.0, apart. (Each node's params encoded in Python
first, as the plan codec stores them, and a row per node: ~1.7 us a node, ~4.5 ms of the
T=200 RNN's warm trace; ~3x less so.)
"""

from __future__ import annotations

import hashlib
import io
import pickle
from itertools import chain
from typing import Any

import numpy as np

from fastgrad.compiler.plan_codec import Uncacheable, array_bytes, op_facts
from fastgrad.core.ir import Graph

# Arrays up to this many elements are hashed with their bytes in the rows; larger ones by
# a digest of their bytes of their own.
_SMALL_ARRAY = 64


def _tagged(*values: Any) -> tuple[Any, ...]:
    """What a param `_Rows` writes by its tag stands for (never called: the rows are
    hashed, not read back)."""
    return values


class _Rows(pickle.Pickler):
    """Pickles a digest's rows: the types pickle writes by value as they are, the others a
    graph's params hold as tagged plain values, anything else refused (Uncacheable)."""

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is np.ndarray:
            return _tagged, ("a", _array(obj))
        if isinstance(obj, np.dtype):
            return _tagged, ("d", obj.str)
        if isinstance(obj, np.generic):
            return _tagged, ("s", obj.dtype.str, obj.tobytes())
        if kind is slice:
            return _tagged, ("sl", obj.start, obj.stop, obj.step)
        if obj is _tagged:
            return NotImplemented  # (written by name: the tag)
        raise Uncacheable(f"a param of type {kind.__name__}")


def _array(a: np.ndarray) -> tuple[Any, ...]:
    if a.size <= _SMALL_ARRAY:
        return array_bytes(a)
    data = hashlib.blake2b(np.ascontiguousarray(a).data, digest_size=20).digest()
    return a.dtype.str, a.shape, data


def graph_digest(graph: Graph) -> str:
    """A digest of `graph`'s structure and constants (raises Uncacheable)."""
    nodes = graph.nodes
    outs = [node.out for node in nodes]
    # Each value's place: the inputs', then the nodes' outputs' in order.
    index = {id(v): k for k, v in enumerate(graph.inputs)}
    first = len(index)
    index.update(zip(map(id, outs), range(first, first + len(outs)), strict=True))
    ins = [node.inputs for node in nodes]
    try:
        places = list(map(index.__getitem__, map(id, chain.from_iterable(ins))))
        outputs = tuple(index[id(v)] for v in graph.outputs)
    except KeyError:
        raise Uncacheable("a node reads a value the graph does not define") from None
    # Avals numbered by value in the order first met (keyed by a tuple: an Aval's hash is
    # a Python call).
    number: dict[tuple[Any, ...], int] = {}
    avals = [
        number.setdefault((a.shape, a.dtype, a.weak), len(number)) for a in [o.aval for o in outs]
    ]
    table = tuple((shape, dtype.str, weak) for shape, dtype, weak in number)
    inputs = tuple(((v.aval.shape, v.aval.dtype.str, v.aval.weak), v.hint) for v in graph.inputs)
    # Column by column, the nodes' inputs one run split by their counts.
    columns = (
        [node.op.name for node in nodes],
        list(map(len, ins)),
        places,
        [node.params for node in nodes],
        avals,
        [o.hint for o in outs],
    )
    buffer = io.BytesIO()
    pickler = _Rows(buffer, protocol=5)
    pickler.fast = True
    pickler.dump((inputs, columns, outputs, table, op_facts(graph)))
    return hashlib.blake2b(buffer.getbuffer(), digest_size=20).hexdigest()
