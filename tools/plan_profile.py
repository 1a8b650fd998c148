"""A plan's steps one by one: the CPU time of each kernel, matmul and view of a bench
workload's jitted value_and_grad, best of N, and the matmuls' sum (its floor).

    NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 FASTGRAD_CUT_PRODUCTS=0 \\
    PYTHONPATH=src:. python tools/plan_profile.py M4 [--size N] [--dtype float32] [--rounds 30]

The plan runs step by step (config.runtime "steps"); each step's call is timed with the
calling thread's CPU clock (kernels and BLAS run on it with one thread each), so a shared
machine's other processes cost little. `total` is the sum of the steps' best times.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
from bench.models import GROUP
from bench.systems import Fastgrad

import fastgrad as fg
from fastgrad.compiler.fusion import Loop
from fastgrad.core.config import config


def _label(step: object) -> str:
    loop = getattr(step, "loop", None)
    if isinstance(loop, Loop):
        axes = f" reduce {loop.reduce_axes}" if loop.reduce_axes else ""
        ops = ",".join(dict.fromkeys(n.op.name for n in loop.nodes if n.op.name != "broadcast_to"))
        return f"loop {loop.shape}{axes}: {ops}"[:110]
    return type(step).__name__.strip("_")


def profile(key: str, size: int | None, dtype: str, rounds: int) -> list[tuple[str, float]]:
    """(label, best CPU seconds) per step of the workload's plan."""
    workload = next(w for w in GROUP if w.key == key)
    system = Fastgrad()
    system.setup(1)
    f = system.build(workload)
    args = workload.make_inputs(
        size or workload.default_size, np.dtype(dtype), np.random.default_rng(0)
    )
    return steps(f, args, rounds)


def steps(f: Callable, args: tuple, rounds: int) -> list[tuple[str, float]]:
    """(label, best CPU seconds) per step of jitted `f` called on `args`."""
    config.update("runtime", "steps")
    fg.warmup(f, *args)
    f(*args)
    executable = f.lower(*args).executable
    arena = executable.arena
    best = [float("inf")] * len(arena.calls)

    def timed(k: int, call: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            start = time.thread_time()
            call()
            best[k] = min(best[k], time.thread_time() - start)

        return run

    arena.calls = [timed(k, c) for k, c in enumerate(arena.calls)]
    for _ in range(rounds):
        f(*args)
    return [(_label(s), t) for s, t in zip(arena.steps, best, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("--size", type=int)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    rows = profile(args.workload, args.size, args.dtype, args.rounds)
    for label, t in rows:
        print(f"{t * 1e3:9.3f} ms  {label}")
    matmuls = sum(t for label, t in rows if label == "MatmulStep")
    total = sum(t for _, t in rows)
    print(
        f"{total * 1e3:9.3f} ms  total; matmuls {matmuls * 1e3:.3f} ms ({total / matmuls:.2f}x)"
        if matmuls
        else f"{total * 1e3:9.3f} ms  total"
    )


if __name__ == "__main__":
    main()
