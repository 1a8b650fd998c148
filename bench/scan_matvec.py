"""The unbatched RNN (`h = tanh(W @ h + U @ x_t + b)`, h of shape (H,)): its loop a scan
in fastgrad (LOOP, and its Python loop with runtime.loop_table.ENABLED off), JAX's
lax.scan, and fastgrad's same program unrolled in Python; value and value_and_grad,
interleaved in one process, best of N rounds of process CPU time per call:

    PYTHONPATH=src:. python -m bench.scan_matvec [H,H,...] [T,T,...] [dtype] [rounds] [who]

(JAX from the environment that has it.) Also prints whether each scan ran as a LOOP.
`who`: "fastgrad" or "jax" times only that one (JAX not imported for "fastgrad"), for runs
in separate processes: interleaved, each slows the other (H = 16, float32, best of 7 at
load 6-7: fastgrad's value at T = 1000 0.41 ms interleaved, 0.18 alone, its calling
thread's CPU time the same as the process's; JAX's 0.27 and 0.17).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

UNROLL_LIMIT = 200  # longer unrolled programs take minutes to compile


def _loss(ops: Any, scan: Any, unrolled: bool) -> Any:
    def loss(w, u, b, xs, h0):
        def step(h, x):
            h = ops.tanh(w @ h + u @ x + b)
            return h, h

        if unrolled:
            h, total = h0, 0.0
            for t in range(xs.shape[0]):
                h, _ = step(h, xs[t])
                total = total + ops.sum(h * h)
            return total / xs.shape[0]
        _, hs = scan(step, h0, xs)
        return ops.sum(hs * hs) / xs.shape[0]

    return loss


def _inputs(hidden: int, steps: int, dtype: Any) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    d = max(1, hidden // 2)
    return (
        (rng.standard_normal((hidden, hidden)) * hidden**-0.5).astype(dtype),
        (rng.standard_normal((hidden, d)) * d**-0.5).astype(dtype),
        np.zeros(hidden, dtype),
        rng.standard_normal((steps, d)).astype(dtype),
        np.zeros(hidden, dtype),
    )


def _cpu(fn: Any, args: Any, sync: Any, calls: int) -> float:
    cpu = time.process_time()
    for _ in range(calls):
        out = fn(*args)
    sync(out)
    return (time.process_time() - cpu) / calls


def _looped(fn: Any, args: Any) -> list[bool]:
    """Whether each scan of jitted `fn`'s last plan ran as a LOOP row (a program built)."""
    from fastgrad.runtime.control_flow import LoopStep

    found: list[bool] = []

    def visit(plan: Any) -> None:
        for step in plan:
            if isinstance(step, LoopStep):
                found.append(step.looped is not None and step.looped.program is not None)
                for body in step.bodies:
                    visit(body.plan)

    visit(fn.lower(*args).executable.plan)
    return found


def main(hiddens: list[int], lengths: list[int], dtype: Any, rounds: int, who: str) -> None:
    import fastgrad as fg
    import fastgrad.numpy as fnp
    from fastgrad.runtime import loop_table

    if who != "fastgrad":
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
    print(f"unbatched RNN, {np.dtype(dtype).name}, CPU ms per call, best of {rounds} rounds")
    for hidden in hiddens:
        for steps in lengths:
            args = _inputs(hidden, steps, dtype)
            for grad in (False, True):
                runs: dict[str, tuple[Any, Any, Any]] = {}
                for name, unrolled in (("scan", False), ("unrolled", True)):
                    if who == "jax" or unrolled and steps > UNROLL_LIMIT:
                        continue
                    f = _loss(fnp, fg.scan, unrolled)
                    f = fg.value_and_grad(f, argnums=(0, 1, 2)) if grad else f
                    runs[name] = (fg.jit(f), args, lambda out: None)
                if who != "jax":
                    runs["python loop"] = runs["scan"]
                if who != "fastgrad":
                    jf = _loss(jnp, jax.lax.scan, False)
                    jf = jax.value_and_grad(jf, argnums=(0, 1, 2)) if grad else jf
                    jargs = tuple(jax.device_put(a) for a in args)
                    runs["jax"] = (jax.jit(jf), jargs, jax.block_until_ready)
                for key, (fn, a, sync) in runs.items():
                    if key == "scan" or key == "unrolled":
                        fg.warmup(fn, *a)
                    for _ in range(3):
                        sync(fn(*a))
                looped = _looped(runs["scan"][0], args) if "scan" in runs else []
                calls = max(1, 2000 // steps)
                best = dict.fromkeys(runs, np.inf)
                for _ in range(rounds):
                    for key, (fn, a, sync) in runs.items():
                        loop_table.ENABLED = key != "python loop"
                        best[key] = min(best[key], _cpu(fn, a, sync, calls))
                loop_table.ENABLED = True
                base = best["scan"] if "scan" in best else best["jax"]
                cells = "  ".join(f"{k} {v * 1e3:7.3f} ({v / base:.2f}x)" for k, v in best.items())
                kind = "value_and_grad" if grad else "value"
                print(f"H={hidden:4d} T={steps:5d} {kind:14s} LOOPs {looped}: {cells}")


if __name__ == "__main__":
    main(
        [int(h) for h in sys.argv[1].split(",")] if len(sys.argv) > 1 else [16, 64, 256],
        [int(t) for t in sys.argv[2].split(",")] if len(sys.argv) > 2 else [200, 1000],
        np.dtype(sys.argv[3] if len(sys.argv) > 3 else "float32"),
        int(sys.argv[4]) if len(sys.argv) > 4 else 7,
        sys.argv[5] if len(sys.argv) > 5 else "both",
    )
