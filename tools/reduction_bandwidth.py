"""Reductions against their limit: a copy of the same array, and the same elementwise
work as a map when the reduction is fed by one, measured in one run.

    FASTGRAD_COMPILE=sync python tools/reduction_bandwidth.py [name filter]

Each case, the copy (np.copyto into a preallocated array) and the map are timed in turn,
25 rounds, keeping each one's best (the machine may be shared). A reduction reads N bytes
where a copy reads and writes 2N: the last column is the reduction's bytes per second over
the copy's, or the map's time over the reduction's where the map is slower (tanh is
compute-bound). The first line is the per-call floor (a 4x4 array): small arrays are
dominated by it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np

import fastgrad as fg
import fastgrad.numpy as fnp


def interleaved(
    fns: list[Callable[[], object]],
    rounds: int = 25,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Best time of each function, the functions run in turn `rounds` times."""
    for f in fns:
        f()
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for k, f in enumerate(fns):
            start = clock()
            f()
            best[k] = min(best[k], clock() - start)
    return best


def cases() -> list[tuple[str, tuple[int, ...], type, Callable, Callable | None]]:
    """(name, shape, dtype, reduction, elementwise map or None)."""
    out: list[tuple[str, tuple[int, ...], type, Callable, Callable | None]] = []
    for dt in (np.float32, np.float64):
        for shape in ((200000, 8, 2), (1000000, 3), (500000, 16)):
            out.append((f"sum0 {shape}", shape, dt, lambda x: fnp.sum(x, axis=0), None))
            out.append((f"max0 {shape}", shape, dt, lambda x: fnp.max(x, axis=0), None))
        for shape in ((256, 512), (4096, 1024)):
            out.append((f"row {shape}", shape, dt, lambda x: fnp.sum(x, axis=1), None))
            out.append((f"col {shape}", shape, dt, lambda x: fnp.sum(x, axis=0), None))
            out.append((f"all {shape}", shape, dt, lambda x: fnp.sum(x), None))
            square = (lambda x: x * x + 1, lambda x: fnp.tanh(x) * x)
            for label, m in zip(("x*x+1", "tanh(x)*x"), square, strict=True):
                for axis, side in ((0, "col"), (1, "row")):
                    out.append((f"{side}({label}) {shape}", shape, dt,
                                lambda x, m=m, a=axis: fnp.sum(m(x), axis=a), m))  # fmt: skip
    return out


def measure(reduce: Callable, elementwise: Callable | None, x: np.ndarray) -> list[float]:
    """Best times of the jitted reduction, the copy and (if any) the jitted map of `x`."""
    dst = np.empty_like(x)
    jitted = fg.jit(reduce)
    fns: list[Callable[[], object]] = [lambda: jitted(x), lambda: np.copyto(dst, x)]
    if elementwise is not None:
        mapped = fg.jit(elementwise)
        fns.append(lambda: mapped(x))
    return interleaved(fns)


def main() -> None:
    pattern = sys.argv[1] if len(sys.argv) > 1 else ""
    print("uptime:", os.popen("uptime").read().strip())
    tiny, small = fg.jit(lambda x: fnp.sum(x, axis=0)), np.ones((4, 4))
    print(f"per-call floor: {interleaved([lambda: tiny(small)], 200)[0] * 1e6:.1f} us")
    rng = np.random.default_rng(0)
    for name, shape, dt, reduce, elementwise in cases():
        if pattern not in name:
            continue
        x = rng.standard_normal(shape).astype(dt)
        t = measure(reduce, elementwise, x)
        limit = max([t[1] / 2, *t[2:]])
        print(
            f"{np.dtype(dt).name:8s} {name:30s} reduction {t[0] * 1e3:8.3f} ms  copy "
            f"{t[1] * 1e3:7.3f} ms ({2 * x.nbytes / t[1] / 1e9:5.1f} GB/s)"
            + (f"  map {t[2] * 1e3:7.3f} ms" if len(t) > 2 else "")
            + f"  limit/reduction {100 * limit / t[0]:4.0f}%"
        )


if __name__ == "__main__":
    main()
