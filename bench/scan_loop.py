"""S1 (the scanned RNN's value_and_grad) with its scans run by the interpreter's LOOP, by
their Python loop (runtime.loop_table.ENABLED off), and by JAX's lax.scan; at T = 50 also
S2, the same loop unrolled in Python; at T a multiple of 10 also S5, the same loop as a
scan of scans of 10 steps (fastgrad's and JAX's). Interleaved in one process, best of N rounds of
wall-clock and process CPU time per call:

    PYTHONPATH=src:. python -m bench.scan_loop [T,T,...] [rounds]

(JAX from the environment that has it.)
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from .systems import Fastgrad, Jax
from .workloads import LOOPS


def _timed(fn: Any, args: Any, sync: Any, calls: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        out = fn(*args)
    sync(out)
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def main(sizes: list[int], rounds: int) -> None:
    from fastgrad.runtime import loop_table

    s1, s2, s5 = LOOPS[0], LOOPS[1], LOOPS[4]
    ours, jax = Fastgrad(), Jax()
    ours.setup(2)
    jax.setup(2)
    for steps in sizes:
        inputs = s1.make_inputs(steps, np.dtype(np.float32), np.random.default_rng(0))
        runs = {"LOOP": ours.build(s1)}
        runs["Python loop"] = runs["LOOP"]
        if steps <= 50:
            runs["unrolled (S2)"] = ours.build(s2)
        if steps % 10 == 0:
            runs["nested (S5)"] = ours.build(s5)
        for fn in {id(f): f for f in runs.values()}.values():
            ours.settle(fn, inputs)
            for _ in range(3):
                fn(*inputs)
        jax_args = jax.convert(s1, inputs)
        theirs = {"JAX": jax.build(s1)}
        if steps % 10 == 0:
            theirs["JAX nested"] = jax.build(s5)
        for fn in theirs.values():
            jax.sync(fn(*jax_args))
        calls = max(1, 2000 // steps)
        best = {key: (np.inf, np.inf) for key in [*runs, *theirs]}
        for _ in range(rounds):
            for key in best:
                loop_table.ENABLED = key != "Python loop"
                if key in theirs:
                    wall, cpu = _timed(theirs[key], jax_args, jax.sync, calls)
                else:
                    wall, cpu = _timed(runs[key], inputs, lambda out: None, calls)
                best[key] = (min(best[key][0], wall), min(best[key][1], cpu))
        loop_table.ENABLED = True
        print(f"S1 T={steps}: best of {rounds} rounds of {calls} calls (ms per call)")
        base = best["LOOP"]
        for key, (wall, cpu) in best.items():
            ratio = f"{wall / base[0]:.2f}x / {cpu / base[1]:.2f}x of LOOP"
            print(f"  {key:14s} wall {wall * 1e3:8.3f}  cpu {cpu * 1e3:8.3f}  ({ratio})")


if __name__ == "__main__":
    main(
        [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [50, 1000],
        int(sys.argv[2]) if len(sys.argv) > 2 else 9,
    )
