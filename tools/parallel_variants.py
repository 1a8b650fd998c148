"""Per kernel of a workload: the compile CPU of its serial and parallel variants, and the
steady run time of each (the parallel one at 1 and 2 threads), in one fresh process.

    python tools/parallel_variants.py [--order serial|parallel] [--dtype D] [--size N]
                                      [--repeat R] [--short-rows] WORKLOAD

The first call of the workload runs on NumPy with the compile thread held back; its
kernel steps' arguments are copied as it goes. Then, on the main thread, every serial
variant compiles (CPU seconds of this thread), then every parallel one (`--order
parallel`: the other way round; the first kernels compiled pay for the vector-math
helpers they share), and each variant runs R times over the copied arguments: best wall
and process CPU ms. Run it with an empty FASTGRAD_CACHE_DIR (it says which it loaded).
`--short-rows`: loops reducing short rows get a parallel variant too, as they did before
runtime.executable.short_rows.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> None:
    order, dtype, size, repeat = "serial", "float64", None, 7
    from fastgrad.runtime import background, executable

    while argv and argv[0].startswith("--"):
        if argv[0] == "--short-rows":
            executable.short_rows = lambda loop: False
            argv = argv[1:]
            continue
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--order":
            order = value
        elif flag == "--dtype":
            dtype = value
        elif flag == "--size":
            size = int(value)
        elif flag == "--repeat":
            repeat = int(value)
    sys.path.insert(0, str(ROOT))
    from bench import systems, workloads

    captured = []  # (tier, step, copied arguments)
    answer = background.KernelTier.answer

    def spy(self, step, env):
        if step.parallel and not any(t is self for t, _, _ in captured):
            args = [np.array(a) if isinstance(a, np.ndarray) else a for a in step.arguments(env)]
            captured.append((self, step, args))
        return answer(self, step, env)

    background.KernelTier.answer = spy
    background._WORKER.hold(1)  # the compile thread starts nothing meanwhile
    workload = workloads.find(argv[0])
    system = systems.Fastgrad()
    system.setup(2)
    inputs = system.inputs(workload, size or workload.default_size, np.dtype(dtype))
    system.build(workload)(*inputs)

    import numba

    from fastgrad.compiler.kernel_cache import compile_kernel

    numba.njit(lambda x: x + 1)(1)  # Numba's own first-compile set-up, apart
    variants = ["serial", "parallel"] if order == "serial" else ["parallel", "serial"]
    compiled: dict[tuple[int, str], tuple[object, float, bool]] = {}
    for kind in variants:
        for k, (tier, _, args) in enumerate(captured):
            source = tier.variants[0 if kind == "serial" else -1]
            cpu = time.thread_time()
            dispatcher, built = compile_kernel(
                source.source, source.name, tuple(numba.typeof(a) for a in args)
            )
            compiled[k, kind] = (dispatcher, time.thread_time() - cpu, built)
    print(f"{argv[0]} {dtype} (load {os.getloadavg()[0]:.1f}), compiled {order} first:")
    runs = (("serial", 1), ("parallel", 1), ("parallel", 2))
    for k, (_, step, args) in enumerate(captured):
        line = [f"  kernel {k} {tuple(step.loop.shape)} ops {len(step.loop.nodes)}"]
        walls = {run: [] for run in runs}
        cpus = {run: [] for run in runs}
        for _ in range(repeat):  # in turn: each sees the same machine
            for kind, threads in runs:
                numba.set_num_threads(threads)
                dispatcher = compiled[k, kind][0]
                wall, cpu = time.perf_counter(), time.process_time()
                dispatcher(*args)
                walls[kind, threads].append(time.perf_counter() - wall)
                cpus[kind, threads].append(time.process_time() - cpu)
        results = {run: min(walls[run]) for run in runs}
        for kind, threads in runs:
            _, seconds, built = compiled[k, kind]
            compile_text = f"compile {seconds:.2f} s{'' if built else ' (loaded)'}, "
            if kind == "parallel" and threads == 2:
                compile_text = ""
            line.append(
                f"{kind}@{threads}: {compile_text}run {results[kind, threads] * 1e3:.2f} ms "
                f"(median {np.median(walls[kind, threads]) * 1e3:.2f}, "
                f"CPU {min(cpus[kind, threads]) * 1e3:.2f})"
            )
        gain = results["serial", 1] / results["parallel", 2]
        print("\n    ".join(line) + f"\n    parallel@2 gain over serial: {gain:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
