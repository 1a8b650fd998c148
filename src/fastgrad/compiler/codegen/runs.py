"""float32 sums whose accumulator is a scalar (a row's, a chunk's) taken in runs of `RUN`
terms: each run summed in float32 (vectorized: 32-64 partial sums of 16-32 terms each,
then a tree), its total added to the float64 accumulator (source.accumulator_dtype).

Widening every term instead costs a conversion and a float64 add per element: a float32
row sum took 1.9x as long from the L1/L2 cache (1.3x from L3); in runs it took the time
of the float32 sum. A run's float32 total is exact whenever its terms are integers and
it stays below 2^24 (tests/test_reduction_accuracy.py relies on it); in general its
error is that of a sum of a few dozen terms, and the runs add without further error.
"""

from __future__ import annotations

from fastgrad.compiler.codegen.source import (
    Writer,
    accumulator_dtype,
    chunk_loop,
    reduction_init,
    trips,
    widen,
)
from fastgrad.core.ir import Node

# Terms per run: long enough that the vector loop's partial sums and their tree cost
# ~2% (1024 measured as fast as one float32 accumulator from L1 on AVX-512), short
# enough that a run's float32 total rounds a few dozen times at most.
RUN = 1024
# Rows per run where each position of a row has a sum of its own (codegen.columns): the
# run is a chain of this many float32 additions per position, and folding the tile into
# the float64 partials costs ~1/64 of the run.
COLUMN_RUN = 64


def in_runs(n: Node) -> bool:
    """Whether reduction `n` accumulates in runs (a float32 sum)."""
    return accumulator_dtype(n) != n.out.aval.dtype


def open_runs(w: Writer, i: str, lo: str, hi: str, accs: list[tuple[str, Node]]) -> None:
    """Open the loop `for {i} in range({lo}, {hi})` cut into runs of RUN; each
    accumulator `acc` of `accs` gets a float32 run total `{acc}r`. Whole runs have a
    constant trip count and the rest a loop of its own, the same body (close_runs copies
    it): a run loop from a start to an end, `range(b, e)` in a while loop, made a row's
    logsumexp 10-14% slower than one float32 accumulator; so it is 3-4% faster."""
    u = "np.uint64"
    w(f"l{i} = {lo}")
    w(f"h{i} = {hi}")
    w(f"for q{i} in range((h{i} - l{i}) // {u}({RUN})):")
    w.indent()
    for acc, n in accs:
        w(f"{acc}r = {reduction_init(n.op.name, n.out.aval.dtype)}")
    w(f"for j{i} in range({u}({RUN})):")
    w.indent()
    w(f"{i} = l{i} + q{i} * {u}({RUN}) + j{i}")
    w.run_marks.append(len(w.lines))


def close_runs(w: Writer, i: str, accs: list[tuple[str, Node]]) -> None:
    """Close what open_runs opened: each run total added to its accumulator, then the
    terms after the last whole run, as one more run."""
    body = w.lines[w.run_marks.pop() :]
    w.dedent()
    fold = [f"{acc} = radd({acc}, {widen(n, f'{acc}r')})" for acc, n in accs]
    for line in fold:
        w(line)
    w.dedent()
    for acc, n in accs:
        w(f"{acc}r = {reduction_init(n.op.name, n.out.aval.dtype)}")
    w(f"for {i} in range(h{i} - (h{i} - l{i}) % np.uint64({RUN}), h{i}):")
    w.lines.extend(line[4:] for line in body)  # one level out: no loop over j
    for line in fold:
        w(line)


def open_outer(
    w: Writer, shape: tuple[int, ...], outer: list[int], accs: list[tuple[str, Node]]
) -> list[tuple[str, Node]]:
    """Open a row kernel's loops over its outer axes (chunk c's part of the first), the
    last one in runs for the full sums `accs` where it is longer than 1; the accumulators
    summed in runs (none, or `accs`)."""
    first, last = outer[0], outer[-1]
    accs = accs if shape[last] != 1 else []
    if accs and last == first:
        w(f"clo = np.uint64((c * n{first}) // nchunks)")
        w(f"chi = np.uint64(((c + 1) * n{first}) // nchunks)")
    else:
        w(chunk_loop(first))
        w.indent()
    for a in outer[1 : -1 if accs else None]:
        w(f"for i{a} in range({trips(shape, a)}):")
        w.indent()
    if accs:
        whole = ("np.uint64(0)", f"np.uint64(n{last})")
        open_runs(w, f"i{last}", *(("clo", "chi") if last == first else whole), accs)
    return accs
