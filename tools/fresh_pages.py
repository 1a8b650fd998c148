"""What fresh memory costs a call: page faults and system time of first and steady calls,
each case in a fresh process (kernels on disk), in turn with another tree (`--against`).

    PYTHONPATH=src python tools/fresh_pages.py [--against SRC] [--repeat N] [--calls N]
                                               [CASE ...]

A CASE is a workload and dtype (`W1:f64`, `W2:f32`, `M4:f64`, or with a size,
`W1:f64:1000000`) or a reduction of tools/reduction_table.py over (1e6, 8, 2) on its last
axis (`sum:f64`, `max:f64`, `mean(x*x):f64`, `sum*2+1:f64`, `logsumexp:f64`). Default: W1,
W2 and M4 in both dtypes and the five reductions in float64.

Each process times the first call (wall; user and system CPU and minor page faults of the
process, from getrusage, so the compile thread's too), waits for every kernel
(`fg.warmup`), then makes `--calls` steady calls twice: keeping each result until the next
call returns (`r = f(x)`, as a loop using its results does) and dropping it at once
(`f(x)`). A steady row is the median per call; `peak` is the process's peak resident
memory (ru_maxrss) over what it held before the first call. The first run of a case fills
the kernel cache and is not shown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, statistics, sys, time
SPEC, CALLS, ROOT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, ROOT)
import numpy as np
import fastgrad as fg
import fastgrad.numpy as fnp

def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt

def delta(a, b):
    return [y - x for x, y in zip(a, b)]

parts = SPEC.split(":")
dtype = {"f64": np.float64, "f32": np.float32}[parts[1]]
if parts[0][0] in "WM" and parts[0][1:].isdigit():
    from bench import systems, workloads
    from bench.models import MODELS
    workload = next(w for w in (*workloads.WORKLOADS, *MODELS) if w.key == parts[0])
    system = systems.SYSTEMS["fastgrad"]
    system.setup(2)
    size = int(parts[2]) if len(parts) > 2 else workload.default_size
    args = system.convert(workload, system.inputs(workload, size, np.dtype(dtype)))
    fn = system.build(workload)
else:
    OPS = {
        "sum": lambda x: fnp.sum(x, axis=-1),
        "max": lambda x: fnp.max(x, axis=-1),
        "logsumexp": lambda x: fnp.logsumexp(x, axis=-1),
        "mean(x*x)": lambda x: fnp.mean(x * x, axis=-1),
        "sum*2+1": lambda x: fnp.sum(x, axis=-1) * 2.0 + 1.0,
    }
    args = (np.random.default_rng(0).standard_normal((1_000_000, 8, 2)).astype(dtype),)
    fn = fg.jit(OPS[parts[0]])
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = usage()
r = fn(*args)
first = delta(start, usage())
fg.warmup(fn, *args)
r = fn(*args)
rows = {}
for mode in ("kept", "dropped"):
    per = []
    for _ in range(CALLS):
        start = usage()
        if mode == "kept":
            r = fn(*args)
        else:
            fn(*args)
        per.append(delta(start, usage()))
    if mode == "kept":
        del r
    rows[mode] = [statistics.median(p[k] for p in per) for k in range(4)]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"first": first, **rows, "peak": (peak - base_rss) / 1024}))
"""


def run(spec: str, calls: int, path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, str(ROOT)]))
    env["FASTGRAD_COMPILE_NOTICE"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, spec, str(calls), str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def cell(row: list[float]) -> str:
    wall, user, system, faults = row
    return f"{wall * 1e3:8.1f} {user * 1e3:7.1f} {system * 1e3:7.1f} {faults:7.0f}"


def main(argv: list[str]) -> None:
    repeat, calls, against = 3, 15, None
    while argv and argv[0].startswith("--"):
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--repeat":
            repeat = int(value)
        elif flag == "--calls":
            calls = int(value)
        elif flag == "--against":
            against = value
    specs = argv or [
        *(f"{w}:{d}" for w in ("W1", "W2", "M4") for d in ("f64", "f32")),
        *(f"{op}:f64" for op in ("sum", "max", "mean(x*x)", "sum*2+1", "logsumexp")),
    ]
    trees = {"this": str(ROOT / "src")}
    if against:
        trees["against"] = against
    print("uptime:", os.popen("uptime").read().strip())
    print(f"median of {calls} steady calls; first and steady: wall ms, user ms, sys ms, faults")
    head = f"{'wall':>8} {'user':>7} {'sys':>7} {'faults':>7}"
    print(f"{'case':16} {'tree':8} {'first call':^32} | {'steady, kept':^32} | "
          f"{'steady, dropped':^32} | peak MB")  # fmt: skip
    print(f"{'':25} {head} | {head} | {head} |")
    for spec in specs:
        for path in trees.values():
            run(spec, 2, path)  # fills the kernel cache
        results: dict[str, list[dict]] = {label: [] for label in trees}
        for _ in range(repeat):  # in turn, so that the machine's load falls on both
            for label, path in trees.items():
                results[label].append(run(spec, calls, path))
        for label, runs in results.items():
            best = min(runs, key=lambda r: r["kept"][0])
            print(
                f"{spec:16} {label:8} {cell(best['first'])} | {cell(best['kept'])} | "
                f"{cell(best['dropped'])} | {best['peak']:6.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
