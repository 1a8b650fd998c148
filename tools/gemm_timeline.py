"""Where a call's wall time goes when the plan cuts its products across the cores: per job
of runtime.gemm_split (a product cut, or a pair), when the caller posted it, the serial
work before it (kernels, views, Python: the worker idles), what each thread ran, how late
the worker started and how long the caller waited for it; then the totals.

    PYTHONPATH=src:. python tools/gemm_timeline.py M2 [--dtype float32] [--calls 50]

The call shown is the median of `--calls` (`--pick 0`: the fastest). Times come from the
processor's cycle counter, calibrated against the wall clock. On a loaded machine the
worker often runs nothing ("0 pcs"): another process holds the second core.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench.models import GROUP
from bench.systems import Fastgrad
from numba import njit

import fastgrad as fg
from fastgrad.runtime import gemm_split as gs


@njit
def _cycles() -> int:  # pragma: no cover - compiled
    return gs.cycles()


def _events(buffer: np.ndarray) -> list[tuple[int, int, int]]:
    n = int(buffer[0])
    return [tuple(int(x) for x in buffer[1 + 3 * i : 4 + 3 * i]) for i in range(n)]  # type: ignore[misc]


def _jobs(caller: list, worker: list) -> list[dict]:
    """Each job's post, end, and each thread's (start, end) per piece; worker wake."""
    jobs: list[dict] = []
    for t, kind, _ in caller:
        if kind == gs.POSTED:
            jobs.append({"post": t, "end": t, "caller": [], "worker": [], "woken": None})
        elif kind == gs.STARTED:
            jobs[-1]["caller"].append([t, t])
        elif kind == gs.FINISHED:
            jobs[-1]["caller"][-1][1] = t
        elif kind == gs.WAITED:
            jobs[-1]["end"] = t
    j = 0
    for t, kind, _ in worker:
        while j + 1 < len(jobs) and t >= jobs[j + 1]["post"]:
            j += 1
        if not jobs or t < jobs[j]["post"]:
            continue
        if kind == gs.WOKEN and jobs[j]["woken"] is None:
            jobs[j]["woken"] = t
        elif kind == gs.STARTED:
            jobs[j]["worker"].append([t, t])
        elif kind == gs.FINISHED and jobs[j]["worker"]:
            jobs[j]["worker"][-1][1] = t
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--pick", type=int, help="which call by wall time (default: median)")
    options = parser.parse_args()
    workload = next(w for w in GROUP if w.key == options.workload)
    system = Fastgrad()
    system.setup(2)
    f = system.build(workload)
    args = workload.make_inputs(
        workload.default_size, np.dtype(options.dtype), np.random.default_rng(0)
    )
    fg.warmup(f, *args)
    for _ in range(3):
        f(*args)
    start, counted = time.perf_counter(), _cycles()
    time.sleep(0.2)
    per_us = (_cycles() - counted) / (time.perf_counter() - start) / 1e6
    caller, worker = (np.zeros(gs.TRACE_SIZE, np.int64) for _ in range(2))
    calls = []
    for _ in range(options.calls):
        caller[0] = worker[0] = 0
        gs.trace(caller, worker)
        begin = _cycles()
        f(*args)
        end = _cycles()
        time.sleep(0.001)  # the worker's last events
        gs.trace(None, None)
        calls.append(((end - begin) / per_us, begin, _events(caller), _events(worker)))
    calls.sort(key=lambda c: c[0])
    wall, begin, ce, we = calls[len(calls) // 2 if options.pick is None else options.pick]
    print(f"call {wall:.0f} us (fastest {calls[0][0]:.0f}, median {calls[len(calls) // 2][0]:.0f})")
    us = lambda t: (t - begin) / per_us  # noqa: E731
    last, totals = begin, dict.fromkeys(("serial", "jobs", "caller", "worker", "waited"), 0.0)
    for i, job in enumerate(_jobs(ce, we)):
        busy = [sum(us(b) - us(a) for a, b in job[side]) for side in ("caller", "worker")]
        ran = job["caller"][-1][1] if job["caller"] else job["post"]
        waited, length = us(job["end"]) - us(ran), us(job["end"]) - us(job["post"])
        late = f"{us(job['woken']) - us(job['post']):5.0f}" if job["woken"] else "    -"
        print(
            f"job {i:2d} at {us(job['post']):6.0f}: serial before {us(job['post']) - us(last):5.0f}"
            f"  takes {length:5.0f}; caller {busy[0]:5.0f} ({len(job['caller'])} pcs), waits"
            f" {waited:4.0f}; worker {busy[1]:5.0f} ({len(job['worker'])} pcs), woken {late}"
        )
        parts = (us(job["post"]) - us(last), length, *busy, waited)
        for key, value in zip(totals, parts, strict=True):
            totals[key] += value
        last = job["end"]
    totals["serial"] += wall - us(last)
    print("totals (us):", {k: round(v) for k, v in totals.items()})


if __name__ == "__main__":
    main()
