"""One measurement in its own process, so that its memory figures are its own.

The parent calls `launch(spec)`, which runs `python -m fastgrad_bench.child SPEC OUT`;
the child measures one workload on one system (or the bandwidth triad) and writes a
JSON result to OUT. Whatever goes wrong in the child becomes an "error" result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

MB = 1 << 20


# ---------------------------------------------------------------- parent side


def launch(spec: dict, env: dict | None = None, timeout: float | None = None) -> dict:
    """Run one child with `spec`; return its result, or an error result if it died."""
    with tempfile.TemporaryDirectory(prefix="fastgrad-bench-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "fastgrad_bench.child", json.dumps(spec), str(out)]
        # A session of its own, so that on timeout the child's helpers go with it.
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"status": "error", "error": f"timed out after {timeout:g} s"}
        if out.exists():
            return json.loads(out.read_text())
    tail = "\n".join(output.strip().splitlines()[-15:])
    if proc.returncode == -signal.SIGKILL:
        why = "child was killed (out of memory?)"
    else:
        why = f"child exited with code {proc.returncode} and wrote no result"
    return {"status": "error", "error": why, "output_tail": tail}


# ---------------------------------------------------------------- child side


def run_triad(spec: dict) -> dict:
    from .measure import triad

    return {"status": "ok", **triad(spec["n"], spec["repeat"])}


def _fingerprint(value: float, grads: list[np.ndarray]) -> dict:
    """A few numbers that any correct implementation reproduces, for cross-checking."""
    return {
        "value": value,
        "grads": [
            {
                "shape": list(g.shape),
                "dtype": str(g.dtype),
                "sum_abs": float(np.sum(np.abs(g), dtype=np.float64)),
                "l2": float(np.sqrt(np.sum(np.square(g, dtype=np.float64)))),
            }
            for g in grads
        ],
    }


def run_workload(spec: dict, result: dict) -> dict:
    """Measure one workload on one system, filling `result` as it goes."""
    from . import measure, systems, workloads

    systems.hide_modules()
    system = systems.SYSTEMS[spec["system"]]
    workload = workloads.find(spec["workload"])
    result.update(status="ok", stage="import")
    try:
        result.update(system.setup(spec["threads"]))
    except ModuleNotFoundError as exc:
        # A missing peer is skipped; fastgrad missing, or a broken install, is an error.
        missing = (exc.name or "").split(".")[0]
        if not system.peer or missing not in system.modules:
            raise
        return {"status": "skipped", "note": f"{missing} is not installed ({system.install})"}

    result["stage"] = "inputs"
    base = measure.current_rss()
    try:
        inputs = system.inputs(workload, spec["size"], np.dtype(spec["dtype"]))
    except systems.NotApplicable as exc:
        system.close()
        return {"status": "skipped", "note": f"not applicable: {exc}"}
    args = system.convert(workload, inputs)
    del inputs  # a system that copied the inputs should not be charged for our originals

    result["stage"] = "first call"
    # Building the function is timed apart, like the import: fastgrad's jit(f) imports its
    # compiler and runtime layers (and hands its compile thread Numba's import), which
    # `import fastgrad` leaves out; JAX's and torch's imports load theirs, and no system's
    # import is counted. The first call (trace, compile, one call) starts at the call.
    start = time.perf_counter()
    try:
        fn = system.build(workload)
    except systems.NotApplicable as exc:
        return {"status": "skipped", "note": f"not applicable: {exc}"}
    result["build_s"] = time.perf_counter() - start
    start = time.perf_counter()
    out = fn(*args)
    system.sync(out)
    result["first_call_s"] = time.perf_counter() - start
    value, grads = system.to_numpy(out)
    result["fingerprint"] = _fingerprint(value, grads)
    result["value"] = value
    del out, grads
    first_peak = measure.peak_rss()

    # Time to steady state: the first call, then until every later call runs compiled
    # (fastgrad's first call runs on NumPy while its kernels compile in the background).
    result["stage"] = "compile"
    settling = time.perf_counter()
    system.settle(fn, args)  # the steady state is measured on the final kernels
    result["steady_after_s"] = result["first_call_s"] + time.perf_counter() - settling

    if not spec.get("first_call_only"):
        result["stage"] = "steady state"
        # Reset the peak so that the steady-state figure leaves out the compiler's and
        # the inputs' memory: what remains is the calls' outputs and temporaries.
        resettable = measure.reset_peak_rss()
        steady_base = measure.current_rss()

        def call():
            system.sync(fn(*args))  # the result is dropped inside the timed region

        result.update(measure.steady_state(call, spec["repeat"], spec["budget_s"]))
        steady_peak = measure.peak_rss()
        if resettable and steady_base is not None:
            # clamped: freeing the first call's garbage can drop RSS below the base
            result["steady_peak_delta_mb"] = max(0, steady_peak - steady_base) / MB
        first_peak = max(first_peak, steady_peak)
        result["stage"] = "details"
        result.update(system.details(fn, args))
    system.close()

    result.pop("stage")
    result["peak_rss_mb"] = first_peak / MB
    if base is not None:
        result["rss_before_inputs_mb"] = base / MB
        result["peak_rss_delta_mb"] = (first_peak - base) / MB
    return result


def main(argv: list[str]) -> int:
    spec, out_path = json.loads(argv[0]), Path(argv[1])
    partial: dict = {}
    try:
        if spec.get("kind") == "triad":
            result = run_triad(spec)
        else:
            result = run_workload(spec, partial)
    except Exception as exc:  # whatever the system raises is reported, not lost
        result = {
            "status": "error",
            "stage": partial.get("stage"),
            "error": f"{type(exc).__name__}: {exc}".strip(),
            "traceback": traceback.format_exc(),
        }
    out_path.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
