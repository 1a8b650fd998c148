"""A plan's steps one by one: the CPU time of each kernel, matmul and view of a bench
workload's jitted value_and_grad, best of N, and the matmuls' sum (its floor).

    NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 FASTGRAD_CUT_PRODUCTS=0 FASTGRAD_PLAN_CACHE=0 \\
    PYTHONPATH=src:. python tools/plan_profile.py M4 [--size N] [--dtype float32] [--rounds 30]
                                                     [--floors]

The plan runs step by step (config.runtime "steps"); each step's call is timed with the
calling thread's CPU clock (kernels and BLAS run on it with one thread each), so a shared
machine's other processes cost little. `total` is the sum of the steps' best times.

`--floors` sets each fused loop against its floor, measured in the same run: the bytes it
reads and writes (its inputs' and outputs' sizes) over the bandwidth of a copy moving as
many bytes (so a loop whose arrays fit a cache is held to that cache's speed), or its
vector-math calls (one per element of each call's level) at the time per call of a plain
loop of that helper, whichever is longer; loops are listed by their time over the floor.
A plan read from the plan cache has no loops to label (FASTGRAD_PLAN_CACHE=0).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
from bench.models import GROUP
from bench.systems import Fastgrad

import fastgrad as fg
from fastgrad.compiler.codegen import math_names
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


def _best(call: Callable[[], object], rounds: int = 50) -> float:
    call()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        call()
        best = min(best, time.thread_time() - start)
    return best


def _copy_seconds(nbytes: int, cache: dict[int, float]) -> float:
    """Best time of a copy that reads nbytes / 2 and writes as many."""
    if nbytes not in cache:
        src = np.ones(max(nbytes // 16, 1), np.float64)
        dst = np.empty_like(src)
        cache[nbytes] = _best(lambda: np.copyto(dst, src))
    return cache[nbytes]


def _call_seconds(name: str, dtype: np.dtype, cache: dict[tuple[str, str], float]) -> float:
    """Seconds per call of the vector-math helper `name` in a plain loop of 2**16."""
    key = (name, dtype.name)
    if key not in cache:
        from numba import njit

        from fastgrad.compiler.codegen import vecmath
        from fastgrad.compiler.codegen.support import NoAlias

        helper = vecmath.FUNCTIONS[key]
        x = np.linspace(-3, 3, 1 << 16).astype(dtype)
        out = np.empty_like(x)
        if name in math_names.BINARY_NAMES:

            @njit(error_model="numpy", pipeline_class=NoAlias)
            def run(x, out):
                for i in range(x.shape[0]):
                    out[i] = helper(x[i], x[i])
        else:

            @njit(error_model="numpy", pipeline_class=NoAlias)
            def run(x, out):
                for i in range(x.shape[0]):
                    out[i] = helper(x[i])

        cache[key] = _best(lambda: run(x, out)) / x.size
    return cache[key]


def floors(f: Callable, args: tuple, rounds: int) -> list[tuple[str, float, float, str]]:
    """(label, best seconds, floor seconds, what bounds it) per fused loop of `f`'s plan."""
    timed = steps(f, args, rounds)
    executable = f.lower(*args).executable
    copies: dict[int, float] = {}
    calls: dict[tuple[str, str], float] = {}
    rows = []
    for step, (label, seconds) in zip(executable.arena.steps, timed, strict=True):
        loop = getattr(step, "loop", None)
        if not isinstance(loop, Loop):
            continue
        nbytes = sum(v.aval.size * v.aval.dtype.itemsize for v in (*loop.inputs, *loop.outputs))
        memory = _copy_seconds(nbytes, copies)
        math = sum(
            n.out.aval.size * _call_seconds(n.op.name, n.out.aval.dtype, calls)
            for n in loop.nodes
            if (n.op.name, n.out.aval.dtype.name) in math_names.VECTOR_MATH
            and n.op.name != "power"  # an integer power is a few products
        )
        bound = f"{nbytes / 1e6:.2f} MB" if memory >= math else "vector math"
        rows.append((label, seconds, max(memory, math), bound))
    return sorted(rows, key=lambda r: r[2] - r[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("--size", type=int)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--floors", action="store_true", help="fused loops against floors")
    args = parser.parse_args()
    if args.floors:
        workload = next(w for w in GROUP if w.key == args.workload)
        system = Fastgrad()
        system.setup(1)
        f = system.build(workload)
        size = args.size or workload.default_size
        inputs = workload.make_inputs(size, np.dtype(args.dtype), np.random.default_rng(0))
        print("   ms/call  floor ms  over ms  x floor  bound        loop")
        for label, seconds, floor, bound in floors(f, inputs, args.rounds):
            print(
                f"{seconds * 1e3:10.3f} {floor * 1e3:9.3f} {(seconds - floor) * 1e3:8.3f} "
                f"{seconds / floor:8.1f}  {bound:12} {label}"
            )
        return
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
