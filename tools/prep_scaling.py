"""Time each preparation phase of an unrolled RNN's `jit(value_and_grad)`, no kernels built.

    python tools/prep_scaling.py [--repeat N] [T ...]  # the table (T = 100 200 400 800)
    python tools/prep_scaling.py --profile 400         # cProfile the preparation at T=400
    python tools/prep_scaling.py --lines [T ...]       # Python lines run, per phase

Phases: trace (the forward trace, its reverse-mode graph and the re-trace of that graph
into the jitted function's graph), simplify, partition, plan (the Executable: slots, loop
sources and the buffer arena; kernels compile only when a plan first runs, so none here).
`trace_warm` is the trace when the reverse-mode graph is on disk (the forward trace, its
key, reading it and the re-trace), `cached` what replaces simplify, partition and plan when
the plan is on disk (its key, a digest of the traced graph; reading it; the Executable
from it), `stored` what a new process with a filled cache does instead (the executable
built from the steps stored with the plan, runtime.stored_plan, the plan itself not
read: `Traced.compiled`), `warm` the trace and that: what such a process spends.
Times are CPU seconds of this process, the best of N runs (the machine may be shared).
`--lines` counts the Python lines each phase runs instead: the same on every machine and
at any load, so growth faster than T is work, not the memory hierarchy or a neighbour;
it names the functions whose lines grow fastest between the last two lengths.
"""

from __future__ import annotations

import contextlib
import cProfile
import pstats
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import plan_cache
from fastgrad.compiler.codegen import memo
from fastgrad.compiler.fusion import partition
from fastgrad.compiler.passes import simplify
from fastgrad.core.collector import no_full_collections
from fastgrad.core.config import config
from fastgrad.runtime.executable import Executable

BATCH, HIDDEN, INPUT = 32, 128, 64


def rnn_loss(wx, wh, b, xs, h0):
    h, total = h0, 0.0
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] @ wx + h @ wh + b)
        total = total + fnp.sum(h * h)
    return total / (xs.shape[0] * BATCH * HIDDEN)


def arguments(steps: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    f32 = np.float32
    return (
        rng.standard_normal((INPUT, HIDDEN)).astype(f32) * 0.1,
        rng.standard_normal((HIDDEN, HIDDEN)).astype(f32) * 0.1,
        np.zeros(HIDDEN, f32),
        rng.standard_normal((steps, BATCH, INPUT)).astype(f32),
        np.zeros((BATCH, HIDDEN), f32),
    )


def jitted() -> Any:
    return fg.jit(fg.value_and_grad(rnn_loss, argnums=(0, 1, 2)))


class _Seconds:
    """Meters a phase in CPU seconds of this process."""

    def __init__(self) -> None:
        self.out: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.process_time()
        yield
        self.out[phase] = time.process_time() - start


class _Lines(_Seconds):
    """Meters a phase in Python lines run (this thread), and keeps them per function."""

    def __init__(self) -> None:
        super().__init__()
        self.per_function: dict[str, Counter[str]] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        counts: Counter[Any] = Counter()

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line":
                counts[frame.f_code] += 1
            return local

        def enter(frame: Any, event: str, arg: Any) -> Any:
            counts[frame.f_code] += 1
            return local

        sys.settrace(enter)
        try:
            yield
        finally:
            sys.settrace(None)
        self.out[phase] = sum(counts.values())
        self.per_function[phase] = Counter(
            {
                f"{c.co_filename.split('/')[-1]}:{c.co_firstlineno} {c.co_name}": n
                for c, n in counts.items()
            }
        )


def phases(steps: int, meter: _Seconds | None = None) -> dict[str, float]:
    """Seconds (or what `meter` counts) spent in each phase for T = `steps`, and the node
    counts."""
    args = arguments(steps)
    measure = meter or _Seconds()
    config.update("plan_cache", False)  # all of preparation, as in a new process
    memo.clear()  # (no loop source generated yet, either)
    try:
        with measure("trace"):
            traced, _ = jitted()._trace(args, {})
    finally:
        config.update("plan_cache", True)
    jitted()._trace(args, {})  # stores the reverse-mode graph
    with measure("trace_warm"):
        jitted()._trace(args, {})  # traces with the stored one, as a warm process does
    with no_full_collections():  # as Traced.compiled runs these phases
        with measure("simplify"):
            graph = simplify(traced.graph)
        with measure("partition"):
            steps_ = partition(graph)
        with measure("plan"):
            executable = Executable(graph, steps_)
        key = plan_cache.plan_key(traced.graph)
        assert key is not None
        plan_cache.save(key, traced.graph, (graph, steps_, executable.generated))
        with measure("cached"):
            loaded = plan_cache.load(plan_cache.plan_key(traced.graph) or "", traced.graph)
            assert loaded is not None
            Executable(loaded[0], loaded[1], generated=loaded[2])
    jitted()._trace(args, {})[0].compiled()  # the executable's steps stored with the plan
    fresh, _ = jitted()._trace(args, {})
    loaded_before = plan_cache.COUNTERS.loaded
    with no_full_collections(), measure("stored"):
        fresh.compiled()  # (a Traced of its own: built from the stored steps, as warm)
    assert plan_cache.COUNTERS.loaded > loaded_before, "the stored steps were not read"
    out = dict(measure.out)
    out["total"] = sum(out[k] for k in ("trace", "simplify", "partition", "plan"))
    out["warm"] = out["trace_warm"] + out["stored"]
    out["nodes"] = len(traced.graph.nodes)
    out["simplified"] = len(graph.nodes)
    out["steps"] = len(steps_)
    return out


def lines(lengths: list[int]) -> str:
    """Python lines each phase runs at each length, the ratios per step of length, and the
    functions whose lines grow fastest between the last two lengths."""
    cols = ["trace", "simplify", "partition", "plan", "trace_warm", "cached", "stored"]
    runs = []
    for steps in lengths:
        meter = _Lines()
        runs.append((phases(steps, meter), meter.per_function))
    text = [f"{'T':>5} " + " ".join(f"{c:>11}" for c in cols)]
    for steps, (row, _) in zip(lengths, runs, strict=True):
        text.append(f"{steps:>5} " + " ".join(f"{int(row[c]):>11}" for c in cols))
    for (a, _), (b, _), steps in zip(runs, runs[1:], lengths[1:], strict=False):
        text.append(f"{'x':>4}{steps} " + " ".join(f"{b[c] / a[c]:>10.3f}x" for c in cols))
    if len(runs) >= 2:
        (_, before), (_, after) = runs[-2], runs[-1]
        scale = lengths[-1] / lengths[-2]
        for phase in cols:
            grown = sorted(
                ((n - scale * before[phase][f], f) for f, n in after[phase].items()), reverse=True
            )
            for extra, function in grown[:3]:
                if extra > 0.001 * sum(after[phase].values()):
                    old, new = before[phase][function], after[phase][function]
                    text.append(f"  {phase}: {function} {old} -> {new} lines")
    return "\n".join(text)


def best_of(repeat: int, steps: int) -> dict[str, float]:
    """Each phase's fastest of `repeat` runs: the least disturbed by other processes."""
    runs = [phases(steps) for _ in range(repeat)]
    return {key: min(run[key] for run in runs) for key in runs[0]}


def table(lengths: list[int], repeat: int = 3) -> str:
    cols = ["trace", "simplify", "partition", "plan", "total"]
    cols += ["trace_warm", "cached", "stored", "warm"]
    lines = [f"{'T':>5} {'nodes':>6} " + " ".join(f"{c:>9}" for c in cols) + "  ratios"]
    previous = None
    for steps in lengths:
        row = best_of(repeat, steps)
        row["total"] = sum(row[c] for c in cols[:4])
        row["warm"] = row["trace_warm"] + row["stored"]
        ratio = ""
        if previous:
            ratio = " ".join(f"{row[k] / previous[k]:5.2f}x" for k in ("total", "warm"))
        previous = row
        lines.append(
            f"{steps:>5} {int(row['nodes']):>6} "
            + " ".join(f"{row[c]:9.3f}" for c in cols)
            + f"  {ratio}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    plan_cache.MIN_NODES = 0  # the cache at every length, the warm-up's too
    phases(5)  # imports and first-use costs out of the way
    if argv[:1] == ["--profile"]:
        steps = int(argv[1]) if len(argv) > 1 else 400
        profile = cProfile.Profile()
        profile.runcall(phases, steps)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    if argv[:1] == ["--lines"]:
        print(lines([int(a) for a in argv[1:]] or [100, 200, 400]))
        return
    repeat = 3
    if argv[:1] == ["--repeat"]:
        repeat, argv = int(argv[1]), argv[2:]
    print(table([int(a) for a in argv] or [100, 200, 400, 800], repeat))


if __name__ == "__main__":
    main(sys.argv[1:])
