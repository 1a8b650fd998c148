"""Column kernels: loops whose reduced axes all come before the kept ones (a bias gradient
summed over the batch, an (N, 8, 2) array summed over N).

Where every operand spans the reduced axes or none of them (broadcast over the kept axes
as it likes), the arrays are raveled and the kept axes seen as one of K positions.
Operands smaller than the loop are tiled along a row; those spanning the reduced axes but
broadcast over kept ones (x[:, None, :] against an (N, 8, 2) array) are read through a
table of offsets (vector gathers). The array is read in memory order as rows of L = m*K
elements (m rows at once when K is small, so the inner loop is long enough to vectorize),
split into blocks of rows and tiles of positions that depend on the sizes only: each block
keeps its own partial per position, folded in order afterwards, so no result depends on
the thread count. Other column loops keep the nested form: one accumulator per kept
position, the kept positions split into chunks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastgrad.compiler.codegen.runs import COLUMN_RUN, in_runs
from fastgrad.compiler.codegen.schedule import KernelState
from fastgrad.compiler.codegen.source import (
    KernelSource,
    Writer,
    accumulate,
    accumulator_init,
    accumulator_type,
    closure,
    combine,
    narrow,
    reduction_init,
    scalar_type,
    settle,
    tracks_nan,
    trips,
    widen,
)
from fastgrad.core.ir import Node, Var

if TYPE_CHECKING:
    from fastgrad.compiler.codegen.loops import _Generator


def column_run(state: KernelState) -> KernelSource:
    """The loop nest with the reduced (leading) axes outside the kept ones."""
    g, w, nodes, level, outputs = state.g, state.w, state.nodes, state.level, state.outputs
    reduce_phase, scalar_reductions = state.sched.reduce_phase, state.sched.scalar_reductions
    if _flattenable(g, nodes):
        return _flat_run(state)
    o, rest = g.outer[0], g.outer[1:]
    kept = ", ".join(f"n{a}" for a in g.outer)
    position = ", ".join(f"i{a}" for a in g.outer)
    scalar_index = state.sched.scalar_index
    rows = [n for n in nodes if id(n.out) in reduce_phase]
    # Every accumulator array allocated here, each chunk its own part of it, and the chunk
    # loop outlined (codegen.outline): allocated in the loop, LLVM could not tell them apart.
    g.outline = True
    accumulators = [(f"q{k}", n) for k, n in enumerate(scalar_reductions)]
    accumulators += [(f"r{g.index[id(n.out)]}", n) for n in rows]
    for name, n in accumulators:
        w(f"{name} = np.empty(({kept},), {accumulator_type(n)})")
        if tracks_nan(n):
            w(f"{name}n = np.empty(({kept},), np.bool_)")
    g.scalar_acc = lambda k: f"q{k}[{position}]"
    w(f"for c in {'prange' if g.parallel else 'range'}(nchunks):")
    w.indent()
    g.in_chunk = True
    body_begin, g.body_depth = len(w.lines), w.depth
    w(f"lo = np.uint64((c * n{o}) // nchunks)")
    w(f"hi = np.uint64(((c + 1) * n{o}) // nchunks)")
    # Reset here, not before the chunk loop: a chunk that reruns (bounded trig) starts over.
    for name, n in accumulators:
        w(f"{name}[lo:hi] = {accumulator_init(n)}")
        if tracks_nan(n):
            w(f"{name}n[lo:hi] = False")
    for a in g.inner:
        w(f"for i{a} in range({trips(g.shape, a)}):")
        w.indent()
    _kept_loops(g, w, o, rest)
    sums = [n for n in scalar_reductions if g._elem_input(n, level)]
    _element_values(state, rows + sums)
    for n in rows + sums:
        if id(n.out) in reduce_phase:
            k = g.index[id(n.out)]
            acc, flag = f"r{k}[{position}]", f"r{k}n[{position}]"
        else:
            k = scalar_index[id(n.out)]
            acc, flag = f"q{k}[{position}]", f"q{k}n[{position}]"
        for line in accumulate(n, acc, g.reduced(n), flag):
            w(line)
    w.dedent(len(g.inner) + 1 + len(rest))
    _kept_loops(g, w, o, rest)
    for n in nodes:
        if level[id(n.out)] != "row":
            continue
        k = g.index[id(n.out)]
        if id(n.out) in reduce_phase:
            expr = narrow(n, settle(n, f"r{k}[{position}]", f"r{k}n[{position}]"))
        else:
            expr = g.expression(n, "row")
        g.assign(w, f"v{k}", expr)
        g.after_value(w, n, "row", outputs, scalar_index)
    w.dedent(1 + len(rest))
    g.body = (body_begin, len(w.lines))
    g.in_chunk = False
    w.dedent()
    for k, n in enumerate(scalar_reductions):
        acc = f"v{g.index[id(n.out)]}"
        w(f"{acc} = {accumulator_init(n)}")
        w(f"qf{k} = q{k}.reshape(-1)")
        if tracks_nan(n):
            w(f"qf{k}n = q{k}n.reshape(-1)")
        w(f"for j in range(qf{k}.size):")
        w(f"    {acc} = {combine(n.op.name, acc, settle(n, f'qf{k}[j]', f'qf{k}n[j]'))}")
        if narrow(n, acc) != acc:
            w(f"{acc} = {narrow(n, acc)}")
    return g.tail(state, column=True)


def _element_values(state: KernelState, reducers: list[Node]) -> None:
    """The elem values the loop's elementwise outputs and `reducers` need, at the current
    element; the outputs stored."""
    g, w, nodes, level, outputs = state.g, state.w, state.nodes, state.level, state.outputs
    elem_outputs = [n for n in nodes if level[id(n.out)] == "elem" and id(n.out) in outputs]
    needed = closure(elem_outputs + reducers, nodes, level)
    for n in nodes:
        if id(n.out) in needed:
            k = g.index[id(n.out)]
            g.assign(w, f"v{k}", g.expression(n, "elem"))
            if id(n.out) in outputs:
                w(f"{g.address(n.out, g.loop.shape, 'elem')} = v{k}")


def _kept_loops(g: _Generator, w: Writer, o: int, rest: list[int]) -> None:
    w(f"for i{o} in range(lo, hi):")
    w.indent()
    for a in rest:
        w(f"for i{a} in range({trips(g.shape, a)}):")
        w.indent()


# Positions per row of the raveled loop: at least this many (m rows at once when K is
# smaller), so the inner loop vectorizes however few the kept positions are.
_ROW_WIDTH = 64
# The widest vector in elements (16 float32 in an AVX-512 register): rows of L a multiple
# of it.
_LANES = 16
# Positions per tile: a tile's partials (16 KiB in float64) stay in the L1 cache.
_TILE = 2048
# At most this many blocks of rows, each at least this many rows and elements: enough
# chunks for the threads, while the partials and their fold stay a small fraction of the
# work (a small array is one block).
_BLOCKS, _BLOCK_ROWS, _BLOCK_ELEMENTS = 16, 16, 1 << 16
_UNFLATTENABLE = ("gather", "scatter_add")


def _operand_kind(shape: tuple[int, ...], loop_shape: tuple[int, ...], n_reduced: int) -> str:
    """An operand's kind: "whole" (the loop's shape), "one" (a single element), "kept"
    (the kept axes' shape, after leading ones), "small" (broadcast over every reduced axis
    and some kept ones), "table" (spanning the reduced axes, broadcast over some kept ones:
    read through a table of offsets), or "" (broadcast over some reduced axes only: the
    nested form handles it)."""

    def strip(s: tuple[int, ...]) -> tuple[int, ...]:
        return s[next((k for k, d in enumerate(s) if d != 1), len(s)) :]

    if shape == loop_shape:
        return "whole"
    if strip(shape) == ():
        return "one"
    if strip(shape) == strip(loop_shape[n_reduced:]):
        return "kept"
    padded = (1,) * (len(loop_shape) - len(shape)) + shape
    reduced = padded[:n_reduced]
    if all(d == 1 for d in reduced):
        return "small"
    if reduced == loop_shape[:n_reduced]:
        return "table"
    return ""


def _flattenable(g: _Generator, nodes: list[Node]) -> bool:
    """Whether the loop can run raveled: every array it reads or writes is whole,
    kept-shaped or one element (random samples and row picks index by axis)."""
    if any(n.op.name in _UNFLATTENABLE or n.op.extra.get("positional") for n in nodes):
        return False
    operands = [*g.arrays, *g.loop.outputs]
    return all(_operand_kind(v.aval.shape, g.loop.shape, len(g.inner)) for v in operands)


def _flat_run(state: KernelState) -> KernelSource:
    """The raveled column loop: blocks of rows x tiles of positions in parallel, then the
    partials folded and the row values computed per kept position."""
    g, w, nodes, level = state.g, state.w, state.nodes, state.level
    reduce_phase, scalar_reductions = state.sched.reduce_phase, state.sched.scalar_reductions
    shape, n_red = g.loop.shape, len(g.inner)
    kinds = {id(v): _operand_kind(v.aval.shape, shape, n_red) for v in [*g.arrays, *g.loop.outputs]}
    names = {**g.in_name, **g.out_name}

    def address(v: Var, at: str) -> str:
        name, kind = names[id(v)], kinds[id(v)]
        if kind == "one":
            return f"{name}f[0]"
        if kind == "whole":
            # A row value (at j) has the loop's whole shape where every reduced axis has
            # size 1: (1, 8) reduced over axis 0 keeping dims. Read or written at e there,
            # it took the last element's index, and its other positions were never written.
            return f"{name}f[{'e' if at == 'elem' else 'j'}]"
        if kind == "table":
            assert at == "elem", "a row value reads no operand spanning the reduced axes"
            return f"{name}f[{name}o + {name}x[p]]"
        # Small operands are tiled along a row of L, so an element reads it at its position
        # p, and a kept position j (j < K) at j.
        return (
            f"{name}f[j]"
            if kind == "kept" and at != "elem"
            else f"{name}t[{'p' if at == 'elem' else 'j'}]"
        )

    g.flat_columns = address
    # Its partials, one array per reduction, are stored in the loop: with the loop
    # outlined, LLVM needs no run-time check that they do not overlap (14 or more sums ran
    # scalar without).
    g.outline = True
    g.imports.add("fastgrad.compiler.codegen.support:flat")
    for v in [*g.arrays, *g.loop.outputs]:
        w(f"{names[id(v)]}f = flat({names[id(v)]})")
    u = "np.uint64"
    w(f"N = {' * '.join(f'{u}(n{a})' for a in g.inner)}")
    w(f"K = {' * '.join(f'{u}(n{a})' for a in g.outer)}")
    # m rows at once: at least _ROW_WIDTH positions, and a multiple of _LANES, so that no
    # row ends in a scalar remainder loop (K = 3 in rows of 63 ran at half the speed).
    w(f"a = {u}({_LANES})")
    w(f"while a > {u}(1) and K % a != {u}(0):")
    w(f"    a = a // {u}(2)")
    w(f"a = {u}({_LANES}) // a")
    w(f"m = max({u}(1), ({u}({_ROW_WIDTH}) + K - {u}(1)) // max(K, {u}(1)))")
    w(f"m = (m + a - {u}(1)) // a * a")
    w("L = m * K")
    w("NK = N * K")
    w(f"R = (N + m - {u}(1)) // m  # rows of L; the last may be partial")
    w(f"nb = min({u}({_BLOCKS}), R // {u}({_BLOCK_ROWS}), NK // {u}({_BLOCK_ELEMENTS}))")
    w(f"nb = max({u}(1), nb)")
    w(f"nt = (L + {u}({_TILE - 1})) // {u}({_TILE})")
    tables = [v for v in g.arrays if kinds[id(v)] == "table"]
    for v in g.arrays:
        if kinds[id(v)] in ("kept", "small", "table"):
            _offsets(w, names[id(v)], kinds[id(v)], v.aval.shape, shape, g.outer)
    elem_sums = [n for n in scalar_reductions if g._elem_input(n, level)]
    rows = [n for n in nodes if id(n.out) in reduce_phase]
    partials = [(f"r{g.index[id(n.out)]}", n) for n in rows]
    partials += [(f"q{k}", n) for k, n in enumerate(scalar_reductions) if n in elem_sums]
    for name, n in partials:
        w(f"{name} = np.empty((nb, L), {accumulator_type(n)})")
    # float32 sums add COLUMN_RUN rows at a time into a float32 tile, then into their
    # float64 partials (codegen.runs): widened term by term, a sum over axis 0 of
    # 256x512 float32 took 1.3-1.4x as long. A tile per chunk, allocated here: allocated
    # in the chunk loop, the tiles were arrays LLVM could not tell apart (codegen.outline).
    runs = [(name, n) for name, n in partials if in_runs(n)]
    for name, n in runs:
        w(f"{name}T = np.empty((nb * nt, {u}({_TILE})), {scalar_type(n.out.aval.dtype)})")
    w(f"for c in {'prange' if g.parallel else 'range'}(nb * nt):")
    w.indent()
    g.in_chunk = True
    body_begin, g.body_depth = len(w.lines), w.depth
    w(f"b = {u}(c) // nt")
    w(f"plo = ({u}(c) % nt) * {u}({_TILE})")
    w(f"phi = min(L, plo + {u}({_TILE}))")
    # Reset here, not before the chunk loop: a chunk that reruns (bounded trig) starts over.
    for name, n in partials:
        w(f"{name}b = {name}[b]")
        w(f"{name}b[plo:phi] = {accumulator_init(n)}")
    w("slo = (b * R) // nb")
    w(f"shi = ((b + {u}(1)) * R) // nb")
    if runs:
        for name, _ in runs:
            w(f"{name}t = {name}T[c]")
        w(f"for s0 in range(slo, shi, {u}({COLUMN_RUN})):")
        w.indent()
        for name, n in runs:
            w(f"{name}t[: phi - plo] = {reduction_init(n.op.name, n.out.aval.dtype)}")
        w(f"for s in range(s0, min(s0 + {u}({COLUMN_RUN}), shi)):")
    else:
        w("for s in range(slo, shi):")
    w.indent()
    w("base = s * L")
    for v in tables:
        w(f"{names[id(v)]}o = s * m * {_kept_size(v.aval.shape, shape, g.outer)}")
    w("for p in range(plo, min(phi, NK - base)):")
    w.indent()
    w("e = base + p")
    _element_values(state, rows + elem_sums)
    for name, n in partials:
        # Each position has an accumulator of its own, so nothing is carried from one
        # iteration to the next: a NaN-propagating maximum vectorizes as it is, without
        # the NaN flags a scalar accumulator needs (source.tracks_nan).
        if (name, n) in runs:
            tile = f"{name}t[p - plo]"
            w(f"{tile} = {combine(n.op.name, tile, g.reduced(n, native=True))}")
        else:
            w(f"{name}b[p] = {fold_in(g, n, f'{name}b[p]', g.reduced(n))}")
    w.dedent(2)
    if runs:
        w("for p in range(plo, phi):")
        for name, n in runs:
            w(f"    {name}b[p] = radd({name}b[p], {widen(n, f'{name}t[p - plo]')})")
        w.dedent()
    g.body = (body_begin, len(w.lines))
    g.in_chunk = False
    w.dedent()
    # Per kept position: fold its partials (blocks, then the m rows of a row of L), then
    # the row values. Full reductions of row values accumulate here, in order.
    for k, n in enumerate(scalar_reductions):
        if n not in elem_sums:
            w(f"s{k} = {accumulator_init(n)}")
    g.scalar_acc = lambda k: f"s{k}"
    w("for j in range(K):")
    w.indent()
    for n in rows:
        k = g.index[id(n.out)]
        _fold(w, n, f"r{k}", f"{g.index[id(n.out)]}", "for t in range(m):", "t * K + j")
    row_values(state)
    w.dedent()
    for k, n in enumerate(scalar_reductions):
        acc = f"v{g.index[id(n.out)]}"
        if n in elem_sums:
            _fold(w, n, f"q{k}", f"q{k}", "for p in range(L):", "p")
            w(f"{acc} = {narrow(n, f'foldq{k}')}")
        else:
            w(f"{acc} = {narrow(n, f's{k}')}")
    g.flat_columns = None
    return g.tail(state, column=True)


def row_values(state: KernelState) -> None:
    """At a kept position j whose reductions are folded (`fold{k}`): the row values."""
    g, w, level, reduce_phase = state.g, state.w, state.level, state.sched.reduce_phase
    scalar_index = state.sched.scalar_index
    for n in state.nodes:
        if level[id(n.out)] != "row":
            continue
        k = g.index[id(n.out)]
        expr = narrow(n, f"fold{k}") if id(n.out) in reduce_phase else g.expression(n, "row")
        g.assign(w, f"v{k}", expr)
        g.after_value(w, n, "row", state.outputs, scalar_index)


def _padded(shape: tuple[int, ...], loop_shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (len(loop_shape) - len(shape)) + shape


def _kept_size(shape: tuple[int, ...], loop_shape: tuple[int, ...], kept: list[int]) -> str:
    """The number of elements of an operand's kept axes: its stride between loop rows."""
    padded = _padded(shape, loop_shape)
    return " * ".join(["np.uint64(1)", *(f"np.uint64(n{a})" for a in kept if padded[a] != 1)])


def _offsets(
    w: Writer,
    name: str,
    kind: str,
    shape: tuple[int, ...],
    loop_shape: tuple[int, ...],
    kept: list[int],
) -> None:
    """For an operand broadcast over some kept axes: where each position q of a row of L
    (m loop rows of K positions) reads it. A "table" operand (one spanning the reduced
    axes) gets `{name}x`, its offsets from the row's start: the loop reads it through them
    (gathers). Others are small (at most K elements): `{name}t` holds their values tiled
    along the row, so the loop reads them in order."""
    padded = _padded(shape, loop_shape)
    if kind == "table":
        w(f"{name}x = np.empty(L, np.uint64)")
    else:
        w(f"{name}t = np.empty(L, {name}f.dtype)")
    w("for q in range(L):")
    w("    r = q % K")
    w(
        f"    off = (q // K) * {_kept_size(shape, loop_shape, kept)}"
        if kind == "table"
        else "    off = np.uint64(0)"
    )
    stride = "np.uint64(1)"
    for a in reversed(kept):
        if padded[a] != 1:
            w(f"    off += (r % np.uint64(n{a})) * {stride}")
            stride = f"{stride} * np.uint64(n{a})"
        w(f"    r = r // np.uint64(n{a})")
    w(f"    {name}x[q] = off" if kind == "table" else f"    {name}t[q] = {name}f[off]")


def fold_in(g: _Generator, n: Node, acc: str, x: str) -> str:
    """`x` combined into a per-position accumulator `acc`."""
    if tracks_nan(n):
        name = f"n{n.op.name}"
        g.imports.add(f"fastgrad.compiler.codegen.support:{name}")
        return f"{name}({acc}, {x})"
    return combine(n.op.name, acc, x)


def _fold(w: Writer, n: Node, partial: str, tag: str, positions: str, at: str) -> None:
    """`fold{tag}` = the partials of `partial` at the positions `positions` walks, block
    after block, combined in order. (Not `f{tag}`: node 32's or 64's would be `f32` or
    `f64`, the dtypes support.py gives every kernel: Numba refused the kernel.)"""
    acc = f"fold{tag}"
    w(f"{acc} = {accumulator_init(n)}")
    w("for b in range(nb):")
    w(f"    {positions}")
    w(f"        {acc} = {combine(n.op.name, acc, f'{partial}[b, {at}]')}")
