"""The first call in a new process whose cache holds every kernel (and, with the plan
cache on, every plan), phase by phase, with the plan cache off and on side by side.

    python tools/warm_start.py [--repeat N] [--sync] [--dtype D] [--quick] [WORKLOAD[:SIZE] ...]
        # default: W1 W2 W3 W4 rnn:200, each in fresh processes

Each row is the best of N fresh processes (the machine may be shared): importing fastgrad,
jitting the function (which loads the compiler and runtime layers), tracing (the user's
function, its reverse-mode graph and the jitted function's graph),
preparing (simplify, partition and kernel sources, or the plan read from disk; then the
executable, whose build is also shown alone: what the plan cache does not keep), the first
run (NumPy while the kernels load in the background; with --sync,
Numba imported and the kernels loaded first), and the first call end to end (trace +
prepare + run, wall time), against a steady call. Tracing and preparing are CPU seconds of
the calling thread.

The processes keep Python's bytecode of fastgrad (in a folder of their own,
PYTHONPYCACHEPREFIX, even where PYTHONDONTWRITEBYTECODE is set), as an installed package
does: compiling fastgrad's source again in every process cost ~1 s of each import and of
each first call's modules on the loaded development machine.

Where a warm first call's time goes now (CPU ms of the calling thread for every phase,
the first run too; best of 9 fresh processes alternating with db58eb1, load 3.3-3.5,
bytecode cached, everything on disk, background mode, FASTGRAD_NATIVE=0), the T=200
unrolled RNN: trace 19.0 (20.7 in the same run: the stored reverse-mode graph's nodes a
run of ints, left unread), prepare 10.3 (36.8: the executable built from its stored
steps alone, runtime.stored_plan, no plan read; what remains: the tables' read ~3, the
steps ~4, their kinds ~2, the arena ~2), first run 41.1 (48.1: no native_plan.settle
question per kernel step with the native path off; a first call's own work, measured
with the kernels held back, is ~20 of it: the compile jobs' layouts and keys ~5, the
arena's binding ~4 and buffers ~1.5, NumPy's first use of its temporaries ~4); the whole
first call 70.4 against 107.4 (0.66x). With the native path (default): prepare 10.6
(42.1), whole first call 103.9 (145.7). M1 (T=50, FASTGRAD_NATIVE=0, best of 7): prepare
3.5 (10.0), first call 26.3 (33.3); M2 level (prepare 5.1 against 5.8, its first run ~75
of its ~85).

Before that (CPU ms of the calling thread for every phase,
the first run too, which this tool shows as wall time; best of 7 fresh processes
alternating with ade9ab3, load 6.4-6.6, bytecode cached, everything on disk,
background mode), the T=200 unrolled RNN: tracing the user's function 11.2 (12.2); the
whole trace phase 20.9 (38.5 in the same run: the stored backward graph is no longer
inlined, pruned nor checked, core.interpreter.DeferredGraph; what remains besides the
user's function: the forward digest ~5-6.5, the stored graph read ~1.5-2.5); prepare
39.2 (43.0: the NumPy tiers' release lists stored with the tables; the plan read ~19, of
which its nodes ~5 and unpickling ~2, the executable from tables ~16, the tables read
~4); first run 46.0 (48.2: NumPy ufuncs write into the arena's buffers; NumPy loops
~17, matmuls ~11, the tier's per-step questions ~8, of which the jobs' argument layouts
~4); the whole first call 106.0 against 130.0 (0.82x), 5.1x its trace phase and 9.5x
the user's function's trace. jit(grad) of it (its key, too, now follows from the stored
graph's): 105.2 against 131.9 (prepare 37.9 against 49.7, where the digest of its 6,600
nodes went). M1 (T=50): 32.9 against 38.8; M2 81.0 against 80.8 (its first run is ~70);
W4 17.0 against 17.6 (below the plan cache's 200 nodes).

Before that (CPU ms of the calling thread, best of 5 fresh
processes alternating with 66ce865, load 6-7, bytecode cached, everything on disk,
background mode), the T=200 unrolled RNN: trace 40.6 (57.5 in the same run: the user's
function 12.8 against 28.4, ~5.8 us a traced op against ~13, by fast paths for alike
operands, 2-D products and int indexes, promotions kept per dtype tuple and broadcast
shapes in Python; what remains: inlining the stored backward graph ~11, the forward
digest with the sources' stamp ~7, the graphs' wiring checks ~3 and pruning ~3, the
stored graph read ~3.5), prepare 44.6, first run 47.0; the whole first call 132 against
149 (0.89x), 3.3x its trace. M1 (T=50): 37.9 against 43.3; M2 level (its trace ~7).

Before that (CPU ms of the calling thread, best of 7 fresh
processes alternating with 29cb5aa, load 5-9, bytecode cached, everything on disk,
background mode), the T=200 unrolled RNN: trace 60 (78 in the same run: the stored
backward graph goes into the trace from its rows, plan_codec.StoredGraph, ~13; the
planning layers' source digest kept under its files' stats, ~4), prepare 47 (55: params
decoded once per distinct value, ~7; the executable from tables without a Python call
per slot lookup nor passes over the graph, ~5; what remains: the plan read ~15, the
executable ~18, the tables ~3), first run 50 (55: a kernel job keyed without each step's
arguments, background.layout cheaper, one listing of the kernels folder; what remains:
NumPy loops ~14, matmuls ~11, the tier's per-step questions and job keys ~8, the arena's
binding ~4); the whole first call 157 against 192, 2.64x its trace (2.46x: the trace
shrank too). M1 (T=50): 46 against 56. The garbage collector's young collections cost
~13 ms of the whole (measured with it off); holding them off during reading only moved
them into the first run.

Before that (CPU ms of the calling thread, best of 5 fresh
processes alternating with the tree before, load 8-14, bytecode cached, every kernel,
plan and executable's tables on disk, background mode), the T=200 unrolled RNN: trace 77,
prepare 57 (was 93 in the same run: the executable built from the tables stored with the
plan, runtime.build_tables, ~30 left of ~65; the jitted graph named by its stored
backward graph's key instead of digested, ~15; the plan read itself ~25), first run 54
(55: NumPy loops ~17, their tier's jobs and checks ~15, matmuls ~11); the whole first
call 192 against 232, 2.51x its trace (2.94x before). M1 (T=50): 51 against 57, once a
full collection that fell in its first run every other process (~20 ms) was held off
until after the call, as during preparation (core.collector).

Before that (CPU ms of the calling thread, best of 5 fresh processes alternating with the
tree before, load 6-7, bytecode cached, every kernel and plan on disk, background mode),
the T=200 unrolled RNN: trace 68 (was 90 in the same
run: the type check left to config.check_graphs, the graphs inlined var by var), prepare
65 (was 76: the two digests ~14 in all, the plan read ~20, the executable ~40), first run
48 (was 58: NumPy loops ~17, the compile thread's jobs ~11, the arena ~5); the whole
first call 181 against 227, 2.66x its trace (2.52x before: the trace shrank more than the
rest). M1 (T=50): 57 against 67.

Where it went before (CPU ms of the calling thread, best of 3, 2-core
machine at load 7, every kernel and plan on disk, background mode), the T=200 unrolled RNN
(jit(value_and_grad), 6,600 traced nodes): trace 107 (of which Graph.verify 27, the
reverse-mode graph read from disk 17, and the user's function traced and its forward and
backward graphs inlined into the jitted one), prepare 92 (the plan key's digest ~14, the
plan read 24, the executable built 51), first run 70 (arena fill 6, binding 5, the compile
thread's jobs 13, 599 loops on NumPy 17, 999 matmuls and the rest ~29); jit(f) 19 (the
compiler and runtime layers' import). The first run took 166-195 ms before the arena
placed buffers by its gap list, held off full collections and rebound only unsettled
steps, and the compile thread's jobs shared their stand-ins (a full garbage collection
~60, the offsets ~90, a stand-in per kernel argument ~40, every step rebound). W1 (10^7
elements) waits for its kernel: Numba's import (~0.45 s), then its first registry load
(0.7-1.0 s, of which SciPy's linalg package 0.36-0.54 s: Numba's BLAS check imports
`scipy.linalg.cython_blas`), then the load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
start = time.perf_counter()
import fastgrad as fg
imported = time.perf_counter() - start
sys.path.insert(0, {root!r})
import numpy as np
from bench import systems, workloads
from fastgrad.compiler import plan_cache

workload = workloads.find({key!r})
system = systems.Fastgrad()
system.setup(2)
size = {size!r} or workload.default_size
args = system.inputs(workload, size, np.dtype({dtype!r}))
jitted = time.perf_counter()
fn = system.build(workload)  # jit(f) loads the compiler and runtime layers
jitted = time.perf_counter() - jitted
import fastgrad.runtime.executable as executable_module
built = [0.0]  # CPU seconds of the executable's build, part of "prepare"
Executable = executable_module.Executable

def timed_build(*args, **kwargs):
    start = time.thread_time()
    try:
        return Executable(*args, **kwargs)
    finally:
        built[0] += time.thread_time() - start

executable_module.Executable = timed_build  # api.trace imports it at a first call
out = {{"import": imported, "jit": jitted}}
wall = time.perf_counter()
cpu = time.thread_time()
traced, _ = fn._trace(args, {{}})
out["trace"] = time.thread_time() - cpu
cpu = time.thread_time()
traced.compiled()
out["prepare"] = time.thread_time() - cpu
out["build"] = built[0]
run = time.perf_counter()
fn(*args)
out["run"] = time.perf_counter() - run
out["first"] = time.perf_counter() - wall
out["numba"] = "numba" in sys.modules
fg.warmup(fn, *args)
steady = []
for _ in range(5):
    t = time.perf_counter()
    fn(*args)
    steady.append(time.perf_counter() - t)
out["steady"] = min(steady)
out["plans"] = [plan_cache.COUNTERS.loaded, plan_cache.COUNTERS.saved]
print(json.dumps(out))
"""


DTYPE = ["float32"]  # the inputs' dtype (`--dtype`)


def child(key: str, size: int | None, env: dict[str, str]) -> dict[str, float]:
    code = CHILD.format(root=str(ROOT), key=key, size=size, dtype=DTYPE[0])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(key: str, size: int | None, repeat: int, mode: str) -> list[str]:
    env = dict(os.environ, FASTGRAD_COMPILE_NOTICE="0")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "fastgrad-pyc"))
    child(key, size, {**env, "FASTGRAD_COMPILE": "sync"})  # the final kernels and plans
    child(key, size, env)  # the serial variants of parallel kernels, which run first
    env["FASTGRAD_COMPILE"] = mode
    runs: dict[str, list[dict[str, float]]] = {"0": [], "1": []}
    for _ in range(repeat):  # off and on in turn: both see the same machine
        for flag in runs:
            runs[flag].append(child(key, size, {**env, "FASTGRAD_PLAN_CACHE": flag}))
    lines = []
    for flag, results in runs.items():
        phases = ("import", "jit", "trace", "prepare", "build", "run")
        best = {k: min(r[k] for r in results) for k in phases}
        best["first"] = min(r["first"] for r in results)
        best["steady"] = min(r["steady"] for r in results)
        dtype = "" if DTYPE[0] == "float32" else " f64" if DTYPE[0] == "float64" else DTYPE[0]
        label = (
            f"{key}{':' + str(size) if size else ''}{dtype} plans {'on' if flag == '1' else 'off'}"
        )
        lines.append(
            f"{label:<22}"
            + "".join(
                f"{best[k] * 1e3:9.1f}"
                for k in ("import", "jit", "trace", "prepare", "build", "run", "first", "steady")
            )
        )
    return lines


def main(argv: list[str]) -> None:
    repeat = 3
    if argv[:1] == ["--repeat"]:
        repeat, argv = int(argv[1]), argv[2:]
    mode = "background"
    if argv[:1] == ["--sync"]:  # the first run loads the kernels (and Numba) before it runs
        mode, argv = "sync", argv[1:]
    if argv[:1] == ["--dtype"]:
        DTYPE[0], argv = argv[1], argv[2:]
    quick = argv[:1] == ["--quick"]
    argv = argv[1:] if quick else argv
    print(
        f"{'ms (best of ' + str(repeat) + ')':<22}"
        + "".join(
            f"{c:>9}"
            for c in ("import", "jit()", "trace", "prepare", "build", "run", "1st call", "steady")
        )
    )
    for spec in argv or ["W1", "W2", "W3", "W4", "rnn:200"]:
        key, _, size = spec.partition(":")
        if quick and not size:
            sys.path.insert(0, str(ROOT))
            from bench import workloads

            size = str(workloads.find(key).quick_size)
        start = time.perf_counter()
        for line in measure(key, int(size) if size else None, repeat, mode):
            print(line, flush=True)
        print(f"  ({time.perf_counter() - start:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
