"""Warm first calls side by side: fastgrad (this tree, and another with `--against`) and
JAX, each in fresh processes whose caches hold everything (fastgrad's kernels and plans;
JAX's persistent compilation cache, which it keeps only where told to), in turn.

    python tools/warm_first_call.py [--repeat N] [--dtype D] [--against SRC] [--second 1]
                                    [WORKLOAD[:SIZE] ...]   # default: W1 W2 W3 W4 M1 M2

Run it with an interpreter that has JAX (the peers' environment) and PYTHONPATH holding
this tree's `src`; JAX is left out where it is not installed. Each process times, as the
bench does: `import` of the system, the inputs, building the function (fg.jit, jax.jit),
the first call (wall, and CPU of the calling thread), then the steady state (fastgrad:
`fg.warmup`, which waits for the kernels and the plan interpreter; JAX's first call is
already compiled), all from the start of the script (Python's own start-up, ~20-30 ms,
is before it). With `--second 1`, a second call is timed right after the first (wall:
what a loop calling it at once sees while the compile thread works), before the steady
state. Rows are best of N by steady state; fastgrad's bytecode is cached
(PYTHONPYCACHEPREFIX), as an installed package's is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (8, 9, 7, 8, 8, 9, 9)
SECOND = ["0"]  # "1": time a second call before the steady state (`--second 1`)

CHILD = r"""
import time
T0 = time.perf_counter()
import json, sys
SYSTEM, KEY, SIZE, DTYPE, ROOT, SECOND = sys.argv[1:7]
SECOND = SECOND == "1"
sys.path.insert(0, ROOT)
import numpy as np
from bench import systems, workloads
if SYSTEM == "jax":
    import jax
    jax.config.update("jax_compilation_cache_dir", sys.argv[7])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
system = systems.SYSTEMS[SYSTEM]
system.setup(2)
out = {"import": time.perf_counter() - T0}
workload = workloads.find(KEY)
inputs = system.inputs(workload, int(SIZE) if SIZE != "-" else workload.default_size,
                       np.dtype(DTYPE))
args = system.convert(workload, inputs)
out["inputs"] = time.perf_counter() - T0
fn = system.build(workload)
out["build"] = time.perf_counter() - T0
cpu = time.thread_time()
system.sync(fn(*args))
out["first"] = time.perf_counter() - T0
out["first cpu"] = time.thread_time() - cpu
if SECOND:
    second = time.perf_counter()
    system.sync(fn(*args))
    out["second"] = [time.perf_counter() - second]
system.settle(fn, args)
system.sync(fn(*args))
out["steady"] = time.perf_counter() - T0
out["process cpu"] = time.process_time()
print(json.dumps(out))
"""


def child(system: str, key: str, size: str, dtype: str, env: dict[str, str], extra: list[str]):
    run = [sys.executable, "-c", CHILD, system, key, size, dtype, str(ROOT), SECOND[0], *extra]
    done = subprocess.run(run, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    repeat, dtype, against = 3, "float64", None
    while argv and argv[0].startswith("--"):
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--repeat":
            repeat = int(value)
        elif flag == "--dtype":
            dtype = value
        elif flag == "--against":
            against = value
        elif flag == "--second":
            SECOND[0] = value
    env = dict(os.environ, FASTGRAD_COMPILE_NOTICE="0")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    pyc = env.get("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "fastgrad-pyc"))
    here = env.get("PYTHONPATH", "")
    versions = {"fastgrad": here}
    if against:
        versions["fastgrad (against)"] = os.pathsep.join([against, here])
    jax = importlib.util.find_spec("jax") is not None
    print(f"ms from script start, best of {repeat} by steady state, {dtype}, warm caches")
    print("import, steady: from the script's start; 1st call, to steady: from its build")
    heads = ("import", "1st call", "(CPU)", "steady", "to st.", "proc CPU", "2nd call")
    heads = heads if SECOND[0] == "1" else heads[:-1]
    print(f"{'':26}" + "".join(f"{h:>{w}}" for h, w in zip(heads, WIDTHS, strict=False)))
    for spec in argv or ["W1", "W2", "W3", "W4", "M1", "M2"]:
        key, _, size = spec.partition(":")
        size = size or "-"
        with tempfile.TemporaryDirectory(prefix="fastgrad-warm-") as tmp:
            runs: dict[str, tuple[str, dict[str, str], list[str], list[dict]]] = {}
            for label, path in versions.items():
                folder = Path(tmp) / label.replace(" ", "-")
                run_env = {**env, "PYTHONPATH": path, "FASTGRAD_CACHE_DIR": str(folder)}
                run_env["PYTHONPYCACHEPREFIX"] = pyc + "-" + label.replace(" ", "-")
                sync = {**run_env, "FASTGRAD_COMPILE": "sync"}
                # Cold in background mode first, as a user's first run: the serial
                # variants, then the final ones (a sync run first stored the final ones
                # only, and a warm process never builds a serial variant after them)
                child("fastgrad", key, size, dtype, run_env, [])
                child("fastgrad", key, size, dtype, sync, [])  # the plans, all settled
                runs[label] = ("fastgrad", run_env, [], [])
            if jax:
                jax_cache = [str(Path(tmp) / "jax")]
                child("jax", key, size, dtype, env, jax_cache)  # fills JAX's cache
                runs["jax (persistent cache)"] = ("jax", env, jax_cache, [])
            for _ in range(repeat):  # in turn: all see the same machine
                for system, run_env, extra, results in runs.values():
                    results.append(child(system, key, size, dtype, run_env, extra))
        for label, (_, _, _, results) in runs.items():
            r = min(results, key=lambda r: r["steady"])
            cells = [r["import"], r["first"] - r["build"], r["first cpu"], r["steady"]]
            cells += [r["steady"] - r["build"], r["process cpu"], *r.get("second", [])]
            row = "".join(f"{c * 1e3:{w}.0f}" for c, w in zip(cells, WIDTHS, strict=False))
            print(f"{key + ' ' + label:<26}{row}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
