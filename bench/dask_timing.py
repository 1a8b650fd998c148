"""Where a fastgrad.dask call's time goes: compute on the workers versus overhead.

Calls run under Dask's task stream, which records when each task computed on which
worker and how long its inputs took to arrive. Per call, compute is the busiest worker's
task time; overhead is the rest of the call's wall time (building and sending the graph,
scattering the parameters, scheduling, moving partial gradients, fetching the result).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

CALLS = 3


def per_call_breakdown(client, fn, args, calls: int = CALLS) -> dict:
    """Median wall, compute (busiest worker) and overhead seconds over `calls` calls."""
    from distributed import get_task_stream

    windows = []
    with get_task_stream(client) as stream:
        for _ in range(calls):
            start = time.time()
            fn(*args)
            windows.append((start, time.time()))
    walls, computes, transfers, busy_sums = [], [], [], []
    for start, stop in windows:
        busy: dict[str, float] = defaultdict(float)
        moved = 0.0
        for task in stream.data:
            for span in task["startstops"]:
                if not start <= span["start"] <= stop:
                    continue
                if span["action"] == "compute":
                    busy[task["worker"]] += span["stop"] - span["start"]
                elif span["action"] == "transfer":
                    moved += span["stop"] - span["start"]
        walls.append(stop - start)
        computes.append(max(busy.values(), default=0.0))
        busy_sums.append(sum(busy.values()))
        transfers.append(moved)
    wall, compute = statistics.median(walls), statistics.median(computes)
    return {
        "calls": calls,
        "wall_s": wall,
        "compute_s": compute,
        "overhead_s": wall - compute,
        "worker_busy_total_s": statistics.median(busy_sums),
        "transfer_s": statistics.median(transfers),
        "walls_s": walls,
        "computes_s": computes,
    }
