"""Reductions against the better of their two limits, one table, measured in one run.

    NUMBA_NUM_THREADS=1 PYTHONPATH=src python tools/reduction_table.py \
        [--dtype float32] [filter ...]

sum, max, logsumexp, mean of squares (elementwise work before) and sum * 2 + 1 (after)
over axis 0, axis -1 and all axes, for the shapes issue 13 names and M4's (N, 8). The
memory limit is the bytes a reduction must read and write over the bandwidth of a
one-thread triad (a = b + s*c into a touched array) measured at the start of the run;
the compute limit, for logsumexp, is the time of a fused exp over the same array (its
writes make it an upper bound). `eff` is the larger limit over the reduction's best
time (25 rounds, run in turn with the exp map). Every time is the calling thread's CPU
time (the kernels' with NUMBA_NUM_THREADS=1): the issue's goal is >= 70%. Arrays that
fit in the caches read faster than the triad: above 100%.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from reduction_bandwidth import interleaved  # noqa: E402

import fastgrad as fg  # noqa: E402
import fastgrad.numpy as fnp  # noqa: E402
from fastgrad.runtime import background  # noqa: E402

SHAPES = ((4096, 1024), (256, 512), (1_000_000, 8), (1_000_000, 8, 2), (1_000_000, 100))
OPS: dict[str, Callable] = {
    "sum": lambda x, a: fnp.sum(x, axis=a),
    "max": lambda x, a: fnp.max(x, axis=a),
    "logsumexp": lambda x, a: fnp.logsumexp(x, axis=a),
    "mean(x*x)": lambda x, a: fnp.mean(x * x, axis=a),
    "sum*2+1": lambda x, a: fnp.sum(x, axis=a) * 2.0 + 1.0,
}
AXES = {"0": 0, "-1": -1, "all": None}


def row(op: str, axis: str, x: np.ndarray, gbps: float) -> str:
    reduce = fg.jit(lambda x: OPS[op](x, AXES[axis]))
    fns: list[Callable[[], object]] = [lambda: reduce(x)]
    if op == "logsumexp":
        mapped = fg.jit(fnp.exp)
        fns.append(lambda: mapped(x))
    for f in fns:
        f()
    # Large loops get a parallel kernel compiled after the first: timed while it
    # compiles, a row measured the compile.
    background.wait_idle()
    times = interleaved(fns, clock=time.thread_time)
    out = np.asarray(reduce(x))
    memory = (x.nbytes + out.nbytes) / (gbps * 1e9)
    limit = max([memory, *times[1:]])
    kind = "exp" if limit > memory else "mem"
    return (
        f"{op:10s} {axis:>4s} {str(x.shape):18s} {times[0] * 1e3:9.3f} ms "
        f"{x.nbytes / times[0] / 1e9:7.1f} GB/s  limit {limit * 1e3:8.3f} ms ({kind})  "
        f"eff {100 * limit / times[0]:4.0f}%"
    )


def triad_gbps(n: int = 20_000_000, rounds: int = 10) -> float:
    """GB/s of a one-thread triad a = b + s*c into a touched output, three arrays
    counted, best of `rounds` by the thread's CPU time (a loaded machine's wall time
    counts the waits for a core)."""
    import numba

    @numba.njit
    def kernel(a, b, c, s):  # pragma: no cover - compiled
        for i in range(a.shape[0]):
            a[i] = b[i] + s * c[i]

    a, b, c = np.full(n, 0.0), np.full(n, 1.0), np.full(n, 2.0)
    best = interleaved([lambda: kernel(a, b, c, 3.0)], rounds, time.thread_time)[0]
    return 3 * a.nbytes / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("filter", nargs="*", help="only rows containing all these words")
    args = parser.parse_args()
    print("uptime:", os.popen("uptime").read().strip())
    gbps = triad_gbps()
    print(f"triad bandwidth {gbps:.1f} GB/s; {args.dtype}")
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(args.dtype)
        for op in OPS:
            for axis in AXES:
                label = f"{op} {axis} {shape}"
                if all(word in label for word in args.filter):
                    print(row(op, axis, x, gbps), flush=True)


if __name__ == "__main__":
    main()
