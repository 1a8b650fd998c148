"""From process start to the first call that runs fully compiled (time to steady state),
in fresh processes whose cache holds every kernel (warm) or none (cold).

    python tools/steady_timeline.py [--repeat N] [--cold] [--no-pyc] [--dtype D] [--all]
                                    [--against SRC] [WORKLOAD[:SIZE] ...]
        # default: W1 W4 M1 M2, float64, warm, bytecode cached

Each process times, from the first line of its script: `import fastgrad`, the inputs,
`fg.jit(f)` (which loads the compiler and runtime layers), the first call (on NumPy while
the compile thread imports Numba and loads or compiles the kernels), then `fg.warmup`
(waits for the kernels and the plan interpreter and makes one more call, now compiled:
its end is the steady state; where the plan cuts matrix products across the cores, also
when the worker that cuts them serves, which may be later). Meanwhile it notes when Numba,
SciPy and scipy.linalg were imported (and on which thread), Numba's first load of its
typing and lowering registries, and each job of the compile thread (kernels, adapters,
the interpreter, the product worker). Times are wall ms from the script's start
(Python's own start-up, ~20 ms, is before it), each with the CPU ms its thread spent in
it (summed over jobs of a kind); "process CPU" is the process's CPU time at the steady
state. Rows are the process whose steady state came
first of N (the machine may be shared); `--all` prints every process. `--against SRC`
runs every other process on the fastgrad package found in SRC (another checkout's `src`,
on a cache of its own), so that two versions are compared on the same machine state.

The processes keep fastgrad's bytecode (PYTHONPYCACHEPREFIX, as an installed package
does; this machine sets PYTHONDONTWRITEBYTECODE) unless `--no-pyc`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import time
T0 = time.perf_counter()
import importlib.abc, importlib.machinery, sys, threading
EVENTS = []  # (what, thread, start ms, end ms, CPU ms of its thread)
WATCH = {"numba", "scipy", "scipy.linalg", "numba.np.arraymath"}

def ms(t):
    return round((t - T0) * 1e3, 1)

def cpu_ms(t):
    return round((time.thread_time() - t) * 1e3, 1)

class Timed(importlib.abc.MetaPathFinder):
    # Times the import of the modules in WATCH; AFTER's run once theirs has run.
    def find_spec(self, name, path, target=None):
        if name not in WATCH and name not in AFTER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module, run=run, name=name):
            start, busy = time.perf_counter(), time.thread_time()
            run(module)
            if name in AFTER:
                AFTER[name](module)
                return
            EVENTS.append(("import " + name, threading.current_thread().name,
                           ms(start), ms(time.perf_counter()), cpu_ms(busy)))
        spec.loader.exec_module = exec_module
        return spec

def timed_run(cls):
    run = cls.run

    def wrapped(self):
        start, busy = time.perf_counter(), time.thread_time()
        run(self)
        EVENTS.append((self.label, threading.current_thread().name, ms(start),
                       ms(time.perf_counter()), cpu_ms(busy)))
    cls.run = wrapped

def timed_load(module):
    load = module.load

    def wrapped(*args):
        start, busy = time.perf_counter(), time.thread_time()
        fresh = not module._done
        load(*args)
        if fresh:
            EVENTS.append(("Numba's import and registries", threading.current_thread().name,
                           ms(start), ms(time.perf_counter()), cpu_ms(busy)))
    module.load = wrapped

AFTER = {
    "fastgrad.runtime.numba_load": timed_load,
    "fastgrad.runtime.background": lambda module: timed_run(module.Job),
    "fastgrad.runtime.adapters": lambda module: timed_run(module.CompileJob),
}

sys.meta_path.insert(0, Timed())
import fastgrad as fg
phases = {"import": ms(time.perf_counter())}
sys.path.insert(0, ROOT)
import numpy as np
from bench import systems, workloads

workload = workloads.find(KEY)
system = systems.Fastgrad()
system.setup(2)
args = system.inputs(workload, SIZE or workload.default_size, np.dtype(DTYPE))
phases["inputs"] = ms(time.perf_counter())
fn = system.build(workload)
phases["jit"] = ms(time.perf_counter())
cpu = time.thread_time()
fn(*args)
phases["first call"] = ms(time.perf_counter())
phases["first call cpu"] = round((time.thread_time() - cpu) * 1e3, 1)
fg.warmup(fn, *args)
phases["steady"] = ms(time.perf_counter())
phases["cpu"] = round(time.process_time() * 1e3, 1)
split = sys.modules.get("fastgrad.runtime.gemm_split")
state = None if split is None else split.state()
if state is not None:  # a plan cuts products: when the worker serves (it may come later)
    while not state[split.READY] and time.perf_counter() - T0 < 300:
        time.sleep(0.001)
    phases["cut"] = ms(time.perf_counter())
print(json.dumps({"phases": phases, "events": EVENTS}))
"""


def child(key: str, size: int | None, dtype: str, env: dict[str, str]) -> dict:
    code = "import json\n" + CHILD.replace("KEY", repr(key)).replace("SIZE", repr(size))
    code = code.replace("DTYPE", repr(dtype)).replace("ROOT", repr(str(ROOT)))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def show(label: str, result: dict) -> None:
    phases = result["phases"]
    print(
        f"{label}: import {phases['import']:.0f}, inputs {phases['inputs']:.0f}, jit "
        f"{phases['jit']:.0f}, first call {phases['first call']:.0f} "
        f"(main thread CPU {phases['first call cpu']:.0f}), steady {phases['steady']:.0f} "
        f"(process CPU {phases['cpu']:.0f})"
        + (f", products cut from {phases['cut']:.0f}" if "cut" in phases else "")
    )
    events = sorted(result["events"], key=lambda e: e[2])
    merged: dict[str, list] = {}  # an unrolled loop's kernels: summed per kind of job
    for what, thread, start, end, busy in events:
        kind = what.split(" (")[0] if what.startswith(("serial", "parallel")) else what
        kind = "kernel adapter" if kind.startswith("kernel adapter") else kind
        kind = "entry" if kind.startswith("entry of") else kind
        if kind.startswith(("serial", "parallel")):
            kind = kind.split(" kernel")[0] + " kernels"
        row = merged.setdefault(kind, [thread, start, end, 0.0, 0])
        row[2], row[3], row[4] = max(row[2], end), row[3] + busy, row[4] + 1
    for kind, (thread, start, end, busy, count) in merged.items():
        many = f" x{count}" if count > 1 else ""
        print(f"    {start:7.0f} -> {end:7.0f} (CPU {busy:4.0f})  {kind[:56]}{many}  [{thread}]")


def main(argv: list[str]) -> None:
    repeat, cold, pyc, every, dtype, against = 3, False, True, False, "float64", None
    while argv and argv[0].startswith("--"):
        flag, argv = argv[0], argv[1:]
        if flag == "--repeat":
            repeat, argv = int(argv[0]), argv[1:]
        elif flag == "--dtype":
            dtype, argv = argv[0], argv[1:]
        elif flag == "--against":
            against, argv = argv[0], argv[1:]
        else:
            cold = cold or flag == "--cold"
            pyc = pyc and flag != "--no-pyc"
            every = every or flag == "--all"
    env = dict(os.environ, FASTGRAD_COMPILE_NOTICE="0")
    if pyc:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "fastgrad-pyc"))
    paths = {"this": os.environ.get("PYTHONPATH", "")}
    if against:
        paths["against"] = os.pathsep.join([against, paths["this"]])
    for spec in argv or ["W1", "W4", "M1", "M2"]:
        key, _, size_text = spec.partition(":")
        size = int(size_text) if size_text else None
        results: dict[str, list] = {version: [] for version in paths}
        versions: dict[str, dict[str, str]] = {}
        with tempfile.TemporaryDirectory(prefix="fastgrad-timeline-") as tmp:
            for version, path in paths.items():  # a cache and a bytecode folder each
                cache = Path(tmp) / version
                cache.mkdir()
                run_env = {**env, "PYTHONPATH": path, "FASTGRAD_CACHE_DIR": str(cache)}
                if pyc:
                    run_env["PYTHONPYCACHEPREFIX"] = env["PYTHONPYCACHEPREFIX"] + "-" + version
                versions[version] = run_env
                if not cold:  # sync mode builds the final variants; a background run
                    # then the serial ones a warm process asks for first
                    child(key, size, dtype, {**run_env, "FASTGRAD_COMPILE": "sync"})
                    child(key, size, dtype, run_env)
            for _ in range(repeat):  # in turn: both see the same machine
                for version, run_env in versions.items():
                    if cold:
                        for entry in Path(run_env["FASTGRAD_CACHE_DIR"]).iterdir():
                            shutil.rmtree(entry)
                    results[version].append(child(key, size, dtype, run_env))
        for version, runs in results.items():
            runs.sort(key=lambda r: r["phases"]["steady"])
            label = f"{spec} {dtype} {'cold' if cold else 'warm'}, bytecode "
            label += f"{'cached' if pyc else 'not cached'}" + (f" ({version})" if against else "")
            for i, result in enumerate(runs if every else runs[:1]):
                show(label + (f" #{i}" if every else f", best of {repeat}"), result)


if __name__ == "__main__":
    main(sys.argv[1:])
