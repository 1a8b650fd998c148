"""Generate the Numba source of one fused loop.

The source depends on the loop's structure only (ops, dtypes, ranks, which axes are
broadcast), never on sizes: sizes are arguments. So it doubles as the kernel's cache key,
and a new batch size compiles nothing.

Shape of a kernel: a (p)range over chunks of the first outer axis; inside, loops over
the other outer axes; per outer index, one pass over the inner (reduced) axes per phase;
then the row values. Full reductions keep one partial per chunk, combined in order after
the parallel loop, so results do not depend on the thread count. (A loop reading a
matrix once for two products, compiler.readonce's, is codegen.products'.)"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet

import numpy as np

from fastgrad.compiler.codegen.lanecolumns import column_kernel
from fastgrad.compiler.codegen.math_names import BOUNDED_TRIG as BOUNDED
from fastgrad.compiler.codegen.merge import merge, relabel
from fastgrad.compiler.codegen.outline import row_buffers
from fastgrad.compiler.codegen.pairs import pair_steps
from fastgrad.compiler.codegen.powers import known_values, power_expression, reducible
from fastgrad.compiler.codegen.products import products_kernel
from fastgrad.compiler.codegen.recompute import op_cost
from fastgrad.compiler.codegen.rowblocks import SHORT_ROW, block_run, column_blockable, row_blocks
from fastgrad.compiler.codegen.runs import close_runs, in_runs, open_outer, open_runs
from fastgrad.compiler.codegen.schedule import KernelState, schedule
from fastgrad.compiler.codegen.source import (
    KernelSource,
    Writer,
    accumulate,
    accumulator_dtype,
    accumulator_init,
    accumulator_type,
    closure,
    combine,
    init_scalars,
    module_text,
    narrow,
    sample_call,
    scalar_type,
    settle,
    tracks_nan,
    trips,
    widen,
    wrapped,
)
from fastgrad.compiler.fusion import REDUCTIONS, Loop
from fastgrad.compiler.readonce import form
from fastgrad.core.ir import Node, Var

# Math functions with a NumPy scalar spelling Numba knows (where vecmath has no dtype's).
_NUMPY_FALLBACK = {"abs": "np.abs"}


def _is_flat(loop: Loop) -> bool:
    if loop.reduce_axes:
        return False
    keys = {id(n.inputs[0]) for n in loop.nodes if n.op.extra.get("positional")}  # read whole
    operands = list(loop.inputs) + list(loop.outputs)
    return all(v.aval.shape == loop.shape or v.aval.size == 1 or id(v) in keys for v in operands)


def generate(
    loop: Loop,
    parallel: bool,
    vector_math: AbstractSet[tuple[str, str]],
    constants: dict[int, np.ndarray],
) -> KernelSource:
    """The Numba source for `loop`. `vector_math` lists the (function, dtype) pairs
    vecmath implements; `constants` maps id(var) to the value of the graph's constants:
    one-element ones are passed as typed scalar arguments."""
    if (parts := form(loop)) is not None:
        return products_kernel(loop, parts, parallel, vector_math, constants, generate)
    merged = None if _is_flat(loop) else merge(loop, constants)
    if merged is not None and _merge_pays(merged[0], parallel, vector_math, merged[3]):
        inner, back, dims_of, known = merged
        return relabel(generate(inner, parallel, vector_math, known), back, dims_of, loop)
    bounded = int(np.prod(loop.shape)) >= BOUNDED_MIN_SIZE
    fast = _Generator(loop, parallel, vector_math, constants, bounded_trig=bounded)
    source = fast.run()
    if not fast.bounded_used:
        return source
    # sin/cos/tan reduce their argument cheaply below 2^30 and need table lookups (gathers,
    # ~3x the cost) only beyond: each chunk runs the cheap version, notes any NaN it made,
    # and reruns itself with the exact version if so. Chunks write only their own elements
    # and partials, so a rerun is safe (test_fused.py::test_huge_trig_arguments).
    exact = _Generator(loop, parallel, vector_math, constants)
    exact.run()
    depth = "    " * fast.body_depth
    begin, end = fast.body
    rerun = ["    " + line for line in exact.lines[exact.body[0] : exact.body[1]]]
    lines = (
        fast.lines[:begin]
        + [f"{depth}bad = False"]
        + fast.lines[begin:end]
        + [f"{depth}if bad:"]
        + rerun
        + fast.lines[end:]
    )
    imports = fast.imports | exact.imports
    source.imports = imports
    source.source = module_text(
        fast.signature, pair_steps(lines, fast.pairs | exact.pairs), imports, parallel, fast.outline
    )
    return source


def _merge_pays(
    merged: Loop,
    parallel: bool,
    vector_math: AbstractSet[tuple[str, str]],
    constants: dict[int, np.ndarray],
) -> bool:
    """Whether a loop runs its merged form (codegen.merge): full reductions (raveled),
    reductions in several passes or over a short last axis (in blocks of rows or columns;
    a sum over the last axis of (1e6, 8, 2) float32 took 11.8 -> 4.2 ms of CPU). Loops
    without a reduction keep their axes: they gain nothing from fewer, and merged ones
    had a kernel whose signature differed from its call (a (1, 1, 1) loop, (1,) operand)."""
    if not merged.reduce_axes:
        return False
    if len(merged.shape) == 2 and merged.reduce_axes == (1,) and merged.shape[1] < SHORT_ROW:
        return True
    g = _Generator(merged, parallel, vector_math, constants)
    level = {id(n.out): merged.level[id(n.out)] for n in merged.nodes}
    return schedule(g, merged.nodes, level).n_phases > 1


_TRIG = ("sin", "cos", "tan")
# Loops this large or larger use the cheap-then-rerun trig scheme: one element gains
# nothing from it (a 0-d loop of it once hung LLVM, before one-element inputs were read
# ahead of the loop: `tail`).
BOUNDED_MIN_SIZE = 2
# Exactly commutative in IEEE arithmetic (not maximum/minimum: they differ on -0.0 vs 0.0).
_COMMUTATIVE = frozenset({"add", "multiply", "equal", "not_equal", "logical_and",
                          "logical_or"})  # fmt: skip


class _Generator:
    def __init__(
        self,
        loop: Loop,
        parallel: bool,
        vector_math: AbstractSet[tuple[str, str]],
        constants: dict[int, np.ndarray],
        bounded_trig: bool = False,
    ):
        self.loop = loop
        self.bounded_trig = bounded_trig
        self.bounded_used = False
        self.check_pending = False
        self.in_chunk = False
        # Single-element constants are passed as scalar arguments, not written as literals:
        # their values often depend on sizes (1/n in a mean), and the source must not.
        self.scalars = [v for v in loop.inputs if id(v) in constants and constants[id(v)].size == 1]
        self.consts = {id(v): f"k{j}" for j, v in enumerate(self.scalars)}
        # Values computed from those alone: constant exponents are strength-reduced, and
        # constant conditions (`y == 0` in power's derivative) written as literals.
        self.known = known_values(loop, constants)
        self.arrays = [v for v in loop.inputs if id(v) not in self.consts]
        self.parallel = parallel
        self.vector_math = vector_math
        self.flat = _is_flat(loop) or loop.shape == ()
        self.shape = (int(np.prod(loop.shape)),) if self.flat else loop.shape
        ndim = len(self.shape)
        self.inner = [] if self.flat else list(loop.reduce_axes)
        self.outer = [a for a in range(ndim) if a not in self.inner]
        self.in_name = {id(v): f"a{k}" for k, v in enumerate(self.arrays)}
        self.out_name = {id(v): f"o{k}" for k, v in enumerate(loop.outputs)}
        self.index = {id(n.out): k for k, n in enumerate(loop.nodes)}
        self.imports: set[str] = set()
        # Element calls of samplers that make two elements at once -> their pair call.
        self.pairs: dict[str, tuple[str, str]] = {}
        self.recomputed: list[str] = []
        # While recomputing an elem value at another point (a row pick), index variables
        # are substituted and value names suffixed.
        self.subst: dict[int, str] = {}
        self.suffix = ""
        self.index_checks: list[Var] = []
        # One-element inputs, read once before the chunk loop: name -> `array[0]`.
        self.preloads: dict[str, str] = {}
        # expression -> (the value that holds it, the blocks open where it was computed)
        self.memo: dict[str, tuple[str, tuple[int, ...]]] = {}
        # Where a full reduction accumulates: one scalar per chunk (column kernels: one
        # per kept position).
        self.scalar_acc = lambda k: f"s{k}"
        # Column kernels over raveled operands (codegen.columns) address them themselves.
        self.flat_columns: Callable[[Var, str], str] | None = None
        # Operands a block of short rows reads and writes transposed (codegen.rowblocks).
        self.transposed: dict[int, str] = {}
        # The chunk loop in a function of its own, the arrays it allocates arguments there
        # (codegen.outline): set by forms whose loops store into several such arrays.
        self.outline = False

    # ---- addressing
    def _row_map(self, shape: tuple[int, ...]) -> list[int]:
        """S axes addressed by the dims of a value of `shape` at row level."""
        keep, _ = self.loop.row_shapes()
        return list(range(len(self.loop.shape))) if shape == keep else self.outer

    def address(self, v: Var, target: tuple[int, ...], level: str) -> str:
        """`array[index]` reading or writing `v` (an array of its own shape) at a point of a
        value of shape `target` at `level` (NumPy broadcasting from v's shape)."""
        name = self.in_name.get(id(v)) or self.out_name[id(v)]
        shape = v.aval.shape
        if self.flat_columns is not None and level != "scalar":
            return self.flat_columns(v, level)
        if id(v) in self.transposed:  # codegen.rowblocks
            return self.transposed[id(v)]
        if shape == () or level == "scalar" or self.flat and v.aval.size == 1:
            if id(v) in self.in_name and v.aval.size == 1:
                self.preloads[f"{name}_0"] = f"{name}[0]"
                return f"{name}_0"
            return f"{name}[0]"
        if self.flat:
            return f"{name}[i0]"
        if level == "elem":
            target = self.loop.shape
        axes = list(range(len(self.loop.shape))) if level == "elem" else self._row_map(target)
        lead = len(target) - len(shape)
        idx = [
            "0" if d == 1 else self.subst.get(axes[lead + j], f"i{axes[lead + j]}")
            for j, d in enumerate(shape)
        ]
        return f"{name}[{', '.join(idx)}]"

    def value(self, v: Var, node: Node, level: str, target: tuple[int, ...] | None = None) -> str:
        """The expression for operand `v` of `node` evaluated at `level` (at a point of a
        value of shape `target`, by default the node's output)."""
        k = self.index.get(id(v))
        if k is not None:
            return f"v{k}{self.suffix if self.loop.level[id(v)] == 'elem' else ''}"
        if id(v) in self.consts:
            return self.consts[id(v)]
        return self.address(v, target or node.out.aval.shape, level)

    # ---- expressions
    def expression(self, node: Node, level: str) -> str:
        op = node.op
        if op.name in ("broadcast_to", "reshape") or op.name in REDUCTIONS:  # no-op here
            return self.value(node.inputs[0], node, level)
        out_dtype = node.out.aval.dtype
        if op.name == "scatter_add":  # the row pick's VJP: g[i] in column labels[i]
            g = self.value(node.inputs[0], node, "row", node.inputs[0].aval.shape)
            col = self.column(node.inputs[2], node.params["shape"][1])
            return f"({g} if {col} == np.int64(i1) else {scalar_type(out_dtype)}(0))"
        known = self.known.get(id(node.out))
        if known is not None and out_dtype == np.bool_:
            return str(bool(known))
        if self.strength_reduced(node):
            base = self.value(node.inputs[0], node, level)
            if node.inputs[0].aval.dtype != out_dtype:
                base = f"{scalar_type(out_dtype)}({base})"
            exponent = float(self.known[id(node.inputs[1])])
            return power_expression(base, exponent, scalar_type(out_dtype))
        template = op.loop
        assert template is not None, op.name
        if op.extra.get("positional"):
            return self.positional(node)
        args = [self.value(v, node, level) for v in node.inputs]
        if op.name == "power" and (op.name, out_dtype.name) in self.vector_math:
            # Any other exponent: vecmath's power. A pow call in a vectorized loop becomes
            # one scalar libm call per lane; float32's power (computed in float64) measured
            # 2.8-3.8x faster than powf in AVX-512 code, 1.9x in AVX2 code (1e6 elements).
            t = scalar_type(out_dtype)
            x, y = (
                a if v.aval.dtype == out_dtype else f"{t}({a})"
                for a, v in zip(args, node.inputs, strict=True)
            )
            return f"{self.function(op.name, out_dtype)}({x}, {y})"
        if op.name in _COMMUTATIVE:  # one spelling for a*b and b*a: computed once
            args.sort()
        if template.startswith("call:"):
            fn = template[5:]
            if out_dtype.kind == "f" and any(v.aval.dtype != out_dtype for v in node.inputs):
                args = [f"{scalar_type(out_dtype)}({a})" for a in args]
            return f"{self.function(fn, out_dtype)}({', '.join(args)})"
        return wrapped("(" + template.format(*args, T=scalar_type(out_dtype)) + ")", out_dtype)

    def strength_reduced(self, node: Node) -> bool:
        """Whether `node` is a float power with a constant exponent written as multiplies."""
        if node.op.name != "power" or node.out.aval.dtype.kind != "f":
            return False
        exponent = self.known.get(id(node.inputs[1]))
        return exponent is not None and reducible(float(exponent))

    def cost(self, node: Node) -> int:
        return op_cost(node, self.strength_reduced(node))

    def positional(self, node: Node) -> str:
        """A random sample, a function of its key and its element's flat index (fusion
        places it only at elem level in a loop over its own shape)."""
        axes = [self.subst.get(a, f"i{a}") for a in range(1 if self.flat else len(self.shape))]
        args = [self.value(v, node, "elem") for v in node.inputs[1:]]
        key = self.in_name[id(node.inputs[0])]
        text, imports = sample_call(node, key, axes, args)
        self.imports |= imports
        pair = (node.op.extra.get("pairs") or {}).get(node.out.aval.dtype.name)
        if pair and axes == ["i0"] and len(self.shape) == 1 and not self.inner:
            (pair_fn, element_fn), module = pair, node.op.extra["imports"][0]
            called = text.replace(f"{element_fn}(", f"{element_fn}_call(", 1)
            self.pairs[text] = (f"{pair_fn}(np.uint64({key}[0]), np.uint64({key}[1]), q0)", called)
            self.imports |= {f"{module}:{pair_fn}", f"{module}:{element_fn}_call"}
        return text

    def column(self, labels: Var, k: int) -> str:
        """The column a row pick reads: labels[i0], wrapped like a NumPy index."""
        j = self.address(labels, labels.aval.shape, "row")
        if labels not in self.index_checks:
            self.index_checks.append(labels)  # the runtime checks bounds before the call
        return f"({j} + n1 if {j} < 0 else {j})"

    def pick(self, w: Writer, node: Node, level: dict[int, str]) -> str:
        """Emit code computing `x[i0, labels[i0]]` for a row-pick gather; its expression."""
        x = node.inputs[0]
        k = self.index[id(node.out)]
        w(f"j{k} = {self.column(node.inputs[2], x.aval.shape[1])}")
        saved = self.subst, self.suffix
        self.subst, self.suffix = {1: f"j{k}"}, f"_at{k}"
        try:
            if id(x) not in level:
                return self.address(x, self.loop.shape, "elem")
            needed = closure([self.by_id[id(x)]], self.loop.nodes, level)
            for n in self.loop.nodes:
                if id(n.out) in needed:
                    self.recomputed.append(f"{n.op.name} (at the picked column)")
                    self.assign(
                        w, f"v{self.index[id(n.out)]}{self.suffix}", self.expression(n, "elem")
                    )
            return f"v{self.index[id(x)]}{self.suffix}"
        finally:
            self.subst, self.suffix = saved

    def assign(self, w: Writer, name: str, expr: str) -> None:
        # The same expression in the same block (or a block inside it) is computed once.
        scope = tuple(w.opened)
        earlier = self.memo.get(expr)
        if earlier is not None and scope[: len(earlier[1])] == earlier[1]:
            w(f"{name} = {earlier[0]}")
            self.check_pending = False  # checked where it was computed
            return
        self.memo[expr] = (name, scope)
        w(f"{name} = {expr}")
        if self.check_pending:  # a bounded trig function gives NaN beyond its range
            w(f"bad = bad | ({name} != {name})")
            self.check_pending = False

    def function(self, fn: str, dtype: np.dtype) -> str:
        if self.bounded_trig and self.in_chunk and fn in _TRIG and (fn, dtype.name) in BOUNDED:
            name = f"{fn}_bounded_{scalar_type(dtype)}"
            self.imports.add(name)
            self.bounded_used = self.check_pending = True
            return name
        if (fn, dtype.name) in self.vector_math:
            name = f"{fn}_{scalar_type(dtype)}"
            self.imports.add(name)
            return name
        if fn in ("maximum", "minimum"):
            return fn
        return _NUMPY_FALLBACK.get(fn, f"np.{fn}")

    # ---- schedule
    def run(self) -> KernelSource:
        loop = self.loop
        nodes = loop.nodes
        level = {id(n.out): loop.level[id(n.out)] for n in nodes}
        self.by_id = {id(n.out): n for n in nodes}
        outputs = {id(v) for v in loop.outputs}
        sched = schedule(self, nodes, level)
        phase, avail, reduce_phase = sched.phase, sched.avail, sched.reduce_phase
        scalar_reductions, n_phases = sched.scalar_reductions, sched.n_phases
        w = Writer()
        sizes = [f"n{a}" for a in range(len(self.shape))]
        args = sizes + ["nchunks"] + list(self.consts.values())
        args += [self.in_name[id(v)] for v in self.arrays]
        args += [self.out_name[id(v)] for v in loop.outputs]
        for k, n in enumerate(scalar_reductions):
            w(f"p{k} = np.empty(nchunks, {accumulator_type(n)})")
        first = self.outer[0] if self.outer else None
        # Reducing leading axes (column sums, a bias gradient): read along rows instead of
        # down columns, with one accumulator per column of the chunk.
        column = (
            n_phases == 1
            and bool(self.outer)
            and bool(self.inner)
            and max(self.inner) < min(self.outer)
            and not any(
                level.get(id(v)) == "row"
                for n in nodes
                if level[id(n.out)] == "elem"
                for v in n.inputs
            )
        )
        state = KernelState(self, w, args, nodes, level, outputs, sched)
        if column:
            return column_kernel(state)
        if row_blocks(self, w, nodes, sched):
            return block_run(state)
        if column_blockable(self, nodes, sched):
            source = block_run(state, transpose=False)
            source.column = True  # each column's result is the same whatever the chunks
            return source
        # Values a pass stores for later ones: a row's buffer, allocated here and the chunk
        # loop outlined (codegen.outline), or LLVM cannot tell the buffers apart (24 ran
        # scalar, 11x 16's time). A parallel loop's chunks take a row per thread, and
        # its prange's body, a function of Numba's, has them as arguments (not outlined).
        stored = sorted(self.index[i] for i in sched.stored)
        rows = [
            (f"t{k}", f"n{self.inner[0]}", scalar_type(nodes[k].out.aval.dtype)) for k in stored
        ]
        scratch, per_chunk = row_buffers(rows, self.parallel, self.imports)
        self.outline = bool(scratch) and not self.parallel
        for line in scratch:
            w(line)
        w(f"for c in {'prange' if self.parallel else 'range'}(nchunks):")
        w.indent()
        self.in_chunk = True
        body_begin, self.body_depth = len(w.lines), w.depth
        init_scalars(w, scalar_reductions)
        scratch_at, scratch_depth = len(w.lines), w.depth  # row buffers, once per chunk
        scalar_index = {id(n.out): k for k, n in enumerate(scalar_reductions)}
        # Without reduced axes, float32 full sums add up along the last axis in runs.
        flat_runs = [
            (f"s{scalar_index[id(n.out)]}", n)
            for n in scalar_reductions
            if in_runs(n) and self._elem_input(n, level) and not self.inner
        ]
        if first is not None:
            flat_runs = open_outer(w, self.shape, self.outer, flat_runs)
        done: set[int] = set()

        def emit_rows(up_to: int) -> None:
            for n in nodes:
                if level[id(n.out)] != "row" or id(n.out) in done or avail[id(n.out)] > up_to:
                    continue
                if id(n.out) in reduce_phase:
                    continue  # assigned after its phase loop
                done.add(id(n.out))
                if n.op.name == "gather":
                    expr = self.pick(w, n, level)
                else:
                    expr = self.expression(n, "row")
                self.assign(w, f"v{self.index[id(n.out)]}", expr)
                self.after_value(w, n, "row", outputs, scalar_index)

        plan, stored = sched.plan, sched.stored
        w.lines[scratch_at:scratch_at] = ["    " * scratch_depth + t for t in per_chunk]

        for p in range(n_phases):
            emit_rows(p)
            sinks, reducers, needed = plan[p]
            for n in reducers:
                if id(n.out) in reduce_phase:
                    w(f"r{self.index[id(n.out)]} = {accumulator_init(n)}")
                    if tracks_nan(n):
                        w(f"r{self.index[id(n.out)]}n = False")
            accs = {
                id(n.out): f"r{self.index[id(n.out)]}"
                if id(n.out) in reduce_phase
                else f"s{scalar_index[id(n.out)]}"
                for n in reducers
            }
            # The innermost axis's float32 sums add up in runs (codegen.runs).
            runs = [
                (accs[id(n.out)], n)
                for n in reducers
                if in_runs(n) and self.inner and self.shape[self.inner[-1]] != 1
            ]
            for a in self.inner[: -1 if runs else None]:
                w(f"for i{a} in range({trips(self.shape, a)}):")
                w.indent()
            if runs:
                last = self.inner[-1]
                open_runs(w, f"i{last}", "np.uint64(0)", f"np.uint64(n{last})", runs)
            for n in nodes:
                if id(n.out) not in needed:
                    continue
                k = self.index[id(n.out)]
                if id(n.out) in stored and phase[id(n.out)] < p:
                    w(f"v{k} = t{k}[i{self.inner[0]}]")
                    continue
                if phase[id(n.out)] < p:
                    self.recomputed.append(f"{n.op.name} (phase {p})")
                self.assign(w, f"v{k}", self.expression(n, "elem"))
                if id(n.out) in stored:
                    w(f"t{k}[i{self.inner[0]}] = v{k}")
                if id(n.out) in outputs and phase[id(n.out)] == p:
                    w(f"{self.address(n.out, loop.shape, 'elem')} = v{self.index[id(n.out)]}")
            summed_in_runs = {id(n.out) for _, n in runs + flat_runs}
            for n in reducers:
                acc = accs[id(n.out)]
                if id(n.out) in summed_in_runs:
                    acc, operand = f"{acc}r", self.reduced(n, native=True)
                else:
                    operand = self.reduced(n)
                for line in accumulate(n, acc, operand):
                    w(line)
            if runs:
                close_runs(w, f"i{self.inner[-1]}", runs)
            w.dedent(len(self.inner) - (1 if runs else 0))
            for n in reducers:
                if id(n.out) in reduce_phase:
                    done.add(id(n.out))
                    k = self.index[id(n.out)]
                    w(f"v{k} = {narrow(n, settle(n, f'r{k}'))}")
                    self.after_value(w, n, "row", outputs, scalar_index)
        emit_rows(n_phases + 1)
        if first is not None and flat_runs:
            close_runs(w, f"i{self.outer[-1]}", flat_runs)
            w.dedent(len(self.outer) - 1)
        elif first is not None:
            w.dedent(len(self.outer))
        self.body = (body_begin, len(w.lines))
        self.in_chunk = False
        return self._finish(state)

    def _finish(self, state: KernelState) -> KernelSource:
        """Close the chunk loop: combine the partials, then the scalar-level work."""
        w, scalar_reductions = state.w, state.sched.scalar_reductions
        for k, n in enumerate(scalar_reductions):
            w(f"p{k}[c] = {settle(n, f's{k}')}")
        w.dedent()
        for k, n in enumerate(scalar_reductions):
            acc = f"v{self.index[id(n.out)]}"
            w(f"{acc} = {accumulator_init(n)}")
            w("for c in range(nchunks):")
            w(f"    {acc} = {combine(n.op.name, acc, f'p{k}[c]')}")
            if narrow(n, acc) != acc:
                w(f"{acc} = {narrow(n, acc)}")
        return self.tail(state)

    def tail(self, state: KernelState, column: bool = False) -> KernelSource:
        """After the chunk loop and the full reductions: the scalar-level work."""
        loop, w, nodes, level, outputs = self.loop, state.w, state.nodes, state.level, state.outputs
        scalar_index = state.sched.scalar_index
        for n in nodes:
            if level[id(n.out)] == "scalar" and id(n.out) not in scalar_index:
                w(f"v{self.index[id(n.out)]} = {self.expression(n, 'scalar')}")
        for n in nodes:
            if level[id(n.out)] == "scalar" and id(n.out) in outputs:
                w(f"{self.out_name[id(n.out)]}[0] = v{self.index[id(n.out)]}")

        if self.preloads:
            # Read before the chunk loop, so that LLVM hoists what is computed from them
            # alone. Read in the loop, they may alias an output (a store in the loop), and
            # the loop-invariant body stays; the vectorizer's unrolling (VPlan unrollByUF,
            # LLVM 20) walks such a body's values as a tree, in time exponential in its
            # depth: tanh feeding bounded sin and cos (the NaN-check reduction makes the
            # loop vectorizable) took minutes (test_fused_hang.py).
            w.lines[0:0] = [f"    {k} = {e}" for k, e in self.preloads.items()]
            self.body = (self.body[0] + len(self.preloads), self.body[1] + len(self.preloads))
        name = "kernel"
        self.lines = w.lines
        self.signature = f"def {name}({', '.join(state.args)}):"
        return KernelSource(
            name=name,
            source=module_text(
                self.signature,
                pair_steps(w.lines, self.pairs),
                self.imports,
                self.parallel,
                self.outline,
            ),
            inputs=self.arrays,
            scalars=self.scalars,
            outputs=list(loop.outputs),
            flat=self.flat,
            ops=[n.op.name for n in nodes],
            recomputed=self.recomputed,
            imports=self.imports,
            index_checks=self.index_checks,
            column=column,
        )

    def reduced(self, n: Node, native: bool = False) -> str:
        """A reduction's operand at the current point, in its accumulator's dtype (its
        result's, `native`: a float32 run total's, codegen.runs)."""
        operand = self.value(n.inputs[0], n, "elem")
        dtype = n.out.aval.dtype if native else accumulator_dtype(n)
        if n.inputs[0].aval.dtype != dtype:
            operand = f"{scalar_type(dtype)}({operand})"
        return operand

    def _elem_input(self, n: Node, level: dict[int, str]) -> bool:
        x = n.inputs[0]
        return level.get(id(x), "elem" if x.aval.shape == self.loop.shape else "row") == "elem"

    def after_value(
        self, w: Writer, n: Node, level: str, outputs: set[int], scalar_index: dict[int, int]
    ) -> None:
        k = self.index[id(n.out)]
        if id(n.out) in outputs:
            w(f"{self.address(n.out, n.out.aval.shape, level)} = v{k}")
        for s in self.loop.nodes:
            if id(s.out) in scalar_index and s.inputs[0] is n.out:
                acc = self.scalar_acc(scalar_index[id(s.out)])  # once per row: NaN-propagating
                w(f"{acc} = {combine(s.op.name, acc, widen(s, f'v{k}'))}")
