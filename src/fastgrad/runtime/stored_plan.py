"""An executable stored as data: its plan steps, kernels' sources and NumPy tiers, built
again in another process without the graph they came from.

Stored tables (runtime.build_tables) spared a warm process the executable's passes over
the plan, but not the plan itself: its 6,600 nodes read from disk and made into a graph
(the T=200 RNN: ~19 ms), then walked to make each step (~16 ms), for an executable that
reads of them only slots, shapes, dtypes, op names and params. `describe` keeps what the
executable's steps hold, as plain data, beside the tables: per step its kind and slots; a
kernel step's sizes, chunks, scalars and source (one row per distinct source: an unrolled
loop's 599 kernel steps share a handful); its NumPy tier's ops by name, params (a table
of the distinct ones) and dtype; views' arguments, library calls' ops. `build` makes the
executable from them alone (`StoredExecutable`); its graph, partition and kernel sources
are read from the plan only when something asks for them (a test, `explain`).

What it does not describe (a plan running loops, a param with no plain form, an op not
the registry's) leaves the tables without it: such plans are built from the plan read
from disk, as before. A NumPy tier run by blocks (runtime.numpy_blocks) is stored with
the plan's slots in its kind, a kind of one step. Data that does not fit
(`build_tables.Stale`) is dropped and built again, never trusted.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.source import KernelSource
from fastgrad.compiler.plan_codec import (
    Numbered,
    Uncacheable,
    array_of,
    decode_value,
    encode_value,
)
from fastgrad.core.ir import Aval, Var
from fastgrad.core.primitive import REGISTRY
from fastgrad.runtime.arena import Arena, Buffer
from fastgrad.runtime.background import KernelTier
from fastgrad.runtime.build_tables import Stale, Tables
from fastgrad.runtime.matmul import MatmulStep
from fastgrad.runtime.numpy_blocks import BlockedLoop
from fastgrad.runtime.numpy_reductions import tier_impl
from fastgrad.runtime.numpy_tier import NumpyLoop
from fastgrad.runtime.plan_steps import PlanStep, _CallStep, _KernelStep, _ViewStep

KERNEL, MATMUL, VIEW, CALL = 0, 1, 2, 3


def describe(
    executable: Any, kept: list[Any], graph_steps: list[Any], at: dict[int, int]
) -> tuple[Any, ...] | None:
    """The executable's steps (`kept`, after the fold of matmul sums) as plain data,
    arrays left as themselves (build_tables.encode_arrays makes them data); None where
    some step has no stored form. `graph_steps`: the partition it was built from, `at`:
    a plan step's id -> its index there.

    Each step is a row of ints: its kind of step, the row of its kind in `kinds` (what
    steps alike share: an unrolled loop's 599 kernel steps have a handful), then its own
    slots; a kernel step also its index in the partition (`StoredExecutable.steps`)."""
    arrays: list[np.ndarray] = []
    by_id: dict[int, int] = {}

    def array(a: np.ndarray) -> int:
        k = by_id.get(id(a))
        if k is None:
            k = by_id[id(a)] = len(arrays)
            arrays.append(a)
        return k

    def encoded(params: dict[str, Any]) -> int:
        return params_table(tuple([(k, encode_value(v, array)) for k, v in params.items()]))

    params_table, sources, avals, kinds = Numbered(), Numbered(), Numbered(), Numbered()

    def aval(v: Var) -> int:
        return avals((v.aval.shape, v.aval.dtype.str, v.aval.weak))

    def source_row(s: KernelSource) -> int:
        ins, outs = tuple(map(aval, s.inputs)), tuple(map(aval, s.outputs))
        ops, recomputed = tuple(s.ops), tuple(s.recomputed)
        return sources((s.name, s.source, ins, outs, s.flat, s.column, ops, recomputed))

    rows: list[Any] = []
    try:
        for step in kept:
            kind = type(step)
            if kind is _KernelStep:
                tier = step.tier
                numpy = None if tier is None else tier.numpy_loop
                base = len(step.ins) + len(step.outs)
                if numpy is None or numpy.slots[:base] != [*step.ins, *step.outs]:
                    return None  # (a tier built otherwise)
                if any(REGISTRY.get(n.op.name) is not n.op for n in step.loop.nodes):
                    return None  # an op that is not the registry's
                ops = tuple(
                    (n.op.name, encoded(n.params), op[3].str)
                    for n, op in zip(step.loop.nodes, numpy.ops, strict=True)
                )
                scalars = tuple(encode_value(s, array) for s in step.scalars)
                form = (
                    KERNEL,
                    tuple(map(source_row, tier.stored)),
                    step.sizes,
                    step.nchunks,
                    step.parallel,
                    scalars,
                    (ops, numpy.program(), tuple(tier.shape)),
                    (len(step.ins), len(step.outs), len(step.checks), len(numpy.slots) - base),
                    None if numpy.blocked is None else _blocked_form(numpy.blocked),
                )
                own = (*step.ins, *step.outs, *step.checks, *numpy.slots[base:])
                rows.append((KERNEL, kinds(form), at[id(step)], *own))
            elif kind is MatmulStep:
                form = (MATMUL, step.shape, step.dtype.str, step.accumulate)
                rows.append((MATMUL, kinds(form), *step.ins, step.out))
            elif kind is _ViewStep:
                form = (VIEW, step.op, encode_value(step.arg, array))
                rows.append((VIEW, kinds(form), step.ins[0], step.out))
            elif kind is _CallStep:
                node = graph_steps[at[id(step)]].node
                if REGISTRY.get(node.op.name) is not node.op or node.op.impl is not step.impl:
                    return None  # an op that is not the registry's
                form = (CALL, node.op.name, encoded(step.params), step.dtype.str, len(step.ins))
                rows.append((CALL, kinds(form), *step.ins, step.out))
            else:
                return None  # a loop: its bodies are plans of their own
    except Uncacheable:
        return None
    template = executable.template
    consts = tuple((k, array(v)) for k, v in enumerate(template) if v is not None)
    inputs = tuple(map(aval, executable.graph.inputs))
    return (
        inputs,
        len(template),
        consts,
        tuple(avals.rows),
        tuple(sources.rows),
        tuple(params_table.rows),
        tuple(kinds.rows),
        tuple(rows),
        arrays,
    )


class StoredExecutable:
    """Mixed into runtime.executable.Executable by `build`: the graph, the partition and
    the kernel sources read from the stored plan when first asked for (`plan()`)."""

    _plan: Callable[[], Any]

    @functools.cached_property
    def _stored(self) -> Any:
        return self._plan()

    @functools.cached_property
    def graph(self) -> Any:
        return self._stored[0]

    @functools.cached_property
    def steps(self) -> list[Any]:
        steps = self._stored[1]
        for step, index in zip(self.plan, self._indices, strict=True):
            if index is not None and getattr(step, "loop", True) is None:
                step.loop = steps[index]  # (runtime.explain pairs them)
        return steps

    @functools.cached_property
    def generated(self) -> dict[Any, Any]:
        return self._stored[2]


def build(
    cls: type, tables: Tables, traced: Any, consts: Callable[[], Any], read_plan: Callable[[], Any]
) -> Any:
    """The executable (of class `cls`, an Executable with StoredExecutable mixed in) that
    `tables.steps` describes, for the graph `traced` (whose inputs it checks);
    `consts()`: the traced graph's constants (for stored references), `read_plan()`: the
    stored plan (graph, partition, kernel sources), read when something asks for them.
    Raises Stale where the data does not fit."""
    inputs, slots, const_rows, aval_rows, source_rows, param_rows, kind_rows, rows, forms = (
        tables.steps
    )
    arrays: list[Any] = list(forms)
    listed = functools.cache(consts)  # (asked at the first reference to a constant)

    def array(k: int) -> np.ndarray:
        form = arrays[k]
        if type(form) is tuple:
            form = arrays[k] = array_of(form, listed)
        return form

    dtypes: dict[str, np.dtype] = {}

    def dtype(name: str) -> np.dtype:
        d = dtypes.get(name)
        if d is None:
            d = dtypes[name] = np.dtype(name)
        return d

    avals = [Aval(tuple(shape), dtype(d), weak) for shape, d, weak in aval_rows]
    if [avals[k] for k in inputs] != [v.aval for v in traced.inputs]:
        raise Stale("the stored steps are for other inputs")
    params = [{k: decode_value(v, array) for k, v in row} for row in param_rows]
    sources = [
        KernelSource(
            name=name,
            source=text,
            inputs=[Var(avals[a]) for a in ins],
            scalars=[],
            outputs=[Var(avals[a]) for a in outs],
            flat=flat,
            ops=list(ops),
            recomputed=list(recomputed),
            column=column,
        )
        for name, text, ins, outs, flat, column, ops, recomputed in source_rows
    ]
    kinds = [_kind(row, sources, params, dtype, array, slots) for row in kind_rows]
    # Every int of every row below `slots` (a row's kind and a kernel's index in the
    # partition are too, where the plan has more values than steps): no row's slot then
    # needs a look of its own (~0.7 us a row, 2,399 rows in the T=200 RNN).
    low, high = min(map(min, rows), default=0), max(map(max, rows), default=0)
    if low < 0:
        raise Stale("a step with a negative slot")
    plan: list[Any] = []
    indices: list[int | None] = []
    for row in rows:
        kind = kinds[row[1]]
        if kind[0] != row[0] or len(row) != kind[-1]:
            raise Stale("a step that does not fit its kind")
        if high >= slots:
            own = row[3:] if row[0] == KERNEL else row[2:]  # (a kernel's index in the partition)
            if max(own, default=0) >= slots:
                raise Stale("a step that reads a slot past the last")
        plan.append(kind[1](row))
        indices.append(row[2] if row[0] == KERNEL else None)
    template: list[Any] = [None] * slots
    for k, a in const_rows:
        template[k] = array(a)
    executable = cls.__new__(cls)
    executable._plan = plan_loader(read_plan)
    executable._indices = indices
    executable.finish_stored(plan, template, len(inputs), tables)
    if any(type(s) is _KernelStep and s._buffers is None for s in plan):
        raise Stale("a kernel step the arena's tables do not bind")
    return executable


def _kind(
    row: tuple[Any, ...],
    sources: list[Any],
    params: list[Any],
    dtype: Any,
    array: Any,
    slots: int,
) -> tuple[int, Callable[[tuple[int, ...]], Any], int]:
    """A kind of step: (its code, a function making a step of it from a step's row, the
    length of such rows)."""
    code = row[0]
    if code == KERNEL:
        _, variants, sizes, nchunks, parallel, scalars, numpy, counts, blocks = row
        ops, program, shape = numpy
        n_ins, n_outs, n_checks, n_extra = counts
        numpy_ops = [(_impl(name), params[p], dtype(d)) for name, p, d in ops]
        base = n_ins + n_outs
        tier = NumpyLoop.stored(numpy_ops, program, base + n_extra)
        if blocks is not None:  # (its slots in its row: a kind of one step)
            tier.blocked = _blocked(blocks, ops, numpy_ops, shape, slots)
        final = sources[variants[-1]]
        values = tuple(decode_value(s, array) for s in scalars)
        model = _KernelStep(None, final, [0] * n_ins, [0] * n_outs, tuple(sizes), nchunks,
                            parallel, values)  # fmt: skip
        shared = {**model.__dict__, "_buffers": None, "_fresh": None}
        stored = [sources[k] for k in variants]
        checks_end = 3 + base + n_checks

        def kernel(r: tuple[int, ...]) -> _KernelStep:
            step = _KernelStep.__new__(_KernelStep)
            step.__dict__.update(shared)
            step.ins, step.outs = list(r[3 : 3 + n_ins]), list(r[3 + n_ins : 3 + base])
            step.checks = r[3 + base : checks_end]
            slots = [*step.ins, *step.outs, *r[checks_end:]]
            step.tier = KernelTier(NumpyLoop.like(tier, slots), stored, shape)
            return step

        return code, kernel, checks_end + n_extra
    if code == MATMUL:
        _, shape, d, accumulate = row
        shape, d = tuple(shape), dtype(d)

        def matmul(r: tuple[int, ...]) -> MatmulStep:
            return MatmulStep([r[2], r[3]], r[4], shape, d, accumulate=accumulate)

        return code, matmul, 5
    if code == VIEW:
        _, op, arg = row
        value = decode_value(arg, array)
        return code, lambda r: _ViewStep(op, value, [r[2]], r[3]), 4
    if code == CALL:
        _, name, p, d, count = row
        impl, kwargs, d = REGISTRY[name].impl, params[p], dtype(d)
        return code, lambda r: _CallStep(impl, kwargs, list(r[2:-1]), r[-1], d), 3 + count
    raise Stale(f"a step of kind {code!r}")


def _blocked_form(blocked: BlockedLoop) -> tuple[Any, ...]:
    """What a NumPy tier run by blocks holds besides its ops' names, params and dtypes
    (the tier's own): its inputs (with the plan's slots), kinds, rows a block, output
    shapes, outputs and shared buffers."""
    ins = tuple(tuple(op[2]) for op in blocked.ops)
    shapes = tuple(blocked.out_shapes)
    outputs, buffers = tuple(blocked.outputs), tuple(blocked.buffers)
    return ins, tuple(blocked.kinds), blocked.rows, shapes, outputs, buffers


def _blocked(
    form: tuple[Any, ...], names: Any, ops: list[Any], shape: tuple[int, ...], slots: int
) -> BlockedLoop:
    """The BlockedLoop `_blocked_form` describes, its ops (impl, params, dtype) `ops`, in
    a plan of `slots` slots."""
    ins, kinds, rows, shapes, outputs, buffers = form
    if not len(ins) == len(kinds) == len(shapes) == len(buffers) == len(ops):
        raise Stale("a tier run by blocks for another loop")
    read = [k for op_ins in ins for is_slot, k, _ in op_ins if is_slot]
    if max([*read, *(slot for _, slot in outputs)], default=0) >= slots:
        raise Stale("a tier run by blocks reads slots past the plan's")
    loop = BlockedLoop.__new__(BlockedLoop)
    loop.shape, loop.kinds, loop.rows = tuple(shape), list(kinds), rows
    rows_of = zip(names, ops, ins, kinds, strict=True)
    loop.ops = [
        (impl, params, list(op_ins), kind, name)
        for (name, _, _), (impl, params, _), op_ins, kind in rows_of
    ]
    loop.ufuncs = [REGISTRY[name].ufunc for name, _, _ in names]
    loop.dtypes = [dtype for _, _, dtype in ops]
    loop.out_shapes = [tuple(s) for s in shapes]
    loop.outputs, loop.buffers = [tuple(o) for o in outputs], list(buffers)
    return loop


@functools.cache
def _impl(name: str) -> Any:
    """What the NumPy tier calls for op `name`."""
    return tier_impl(name, REGISTRY[name].impl)


def layout_tables(plan: list[PlanStep], arena: Arena) -> tuple[Any, ...]:
    """An arena's layout as plain data, its steps named by their place in `plan`."""
    views = set(map(id, arena.static_views))
    offsets, end = arena.layout()
    # The buffers as one run of ints, 5 each (slot, kind, graph-shaped view's slot, span),
    # their kinds (shape, dtype, graph shape) apart: ~2,000 buffers of the T=200 RNN are
    # a few kinds, unpickled as 2,000 tuples of strings and shapes before.
    kinds = Numbered()
    buffers: list[int] = []
    for b in arena.buffers:
        kind = kinds((b.shape, b.dtype.str, b.view_shape))
        buffers += (b.slot, kind, b.view_slot, b.first, b.last)
    return (
        len(plan),
        len(arena.base),
        tuple(
            (p, tuple(s._buffers), tuple(s.ins), tuple(s.outs))
            for p, s in enumerate(plan)
            if isinstance(s, _KernelStep)
        ),
        tuple((p, s.buffer) for p, s in enumerate(plan) if isinstance(s, MatmulStep)),
        tuple(p for p, s in enumerate(plan) if id(s) in views),
        (tuple(kinds.rows), tuple(buffers)),
        tuple(offsets),
        end,
        tuple(sorted(arena.static)),
        tuple(arena.copied),
    )


def stored_arena(
    plan: list[PlanStep], template: list[Any], outputs: list[int], lower: Any, data: Any
) -> Arena:
    """The arena `layout_tables` describes, its steps `plan`'s (build_tables.Stale where
    the two do not fit)."""
    count, slots, binds, matmuls, views, buffers, offsets, end, static, copied = data
    if count != len(plan) or slots < len(template):
        raise Stale("the arena's tables are for another plan")
    for p, bound, ins, outs in binds:  # (a step of another kernel variant: Stale)
        step = plan[p]
        if not isinstance(step, _KernelStep) or (ins, outs) != (tuple(step.ins), tuple(step.outs)):
            raise Stale("the arena's tables bind another step")
        step.bind(list(bound))
    for p, buffer in matmuls:
        step = plan[p]
        if not isinstance(step, MatmulStep):
            raise Stale("the arena's tables bind another step")
        step.buffer = buffer
    kinds = [(tuple(shape), np.dtype(d), tuple(view)) for shape, d, view in buffers[0]]
    flat = buffers[1]
    if len(flat) % 5:
        raise Stale("the arena's buffers are cut short")
    columns = (flat[k::5] for k in (2, 3, 4))  # (of one length: checked above)
    fields = zip(flat[0::5], map(kinds.__getitem__, flat[1::5]), *columns, strict=True)
    made = [
        Buffer(slot, shape, dtype, view_slot, view, first, last)
        for slot, (shape, dtype, view), view_slot, first, last in fields
    ]
    at = set(views)
    arena = Arena(
        [*template, *[None] * (slots - len(template))],
        made,
        [plan[p] for p in views],
        [s for p, s in enumerate(plan) if p not in at],
        outputs,
        static,
        lower,
        copied,
    )
    arena.layout_offsets = (list(offsets), end)
    return arena


def plan_loader(load: Callable[[], Any]) -> Callable[[], Any]:
    """`load()` once, under a lock: threads asking for the graph at once read it once."""
    lock = threading.Lock()
    done: list[Any] = []

    def once() -> Any:
        with lock:
            if not done:
                done.append(load())
            return done[0]

    return once
