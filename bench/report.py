"""Turn raw child results into figures, then into a table, a JSON file and a plot.

`derive` adds the ratios (speedup over NumPy, ratio to the fastest peer, % of the
measured bandwidth) and cross-checks every system's value and gradients against NumPy's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

SCHEMA = "fastgrad-bench/1"

# Every result in the JSON has all of these keys (None where a figure does not apply).
RESULT_FIELDS = tuple(
    """
    system title status note error version threads
    build_s first_call_s first_call_warm_s steady_after_s steady_after_warm_s
    median_s min_s times_s repeats inner
    rss_before_inputs_mb peak_rss_mb peak_rss_delta_mb steady_peak_delta_mb
    gbps pct_bandwidth gflops speedup_vs_numpy ratio_to_fastest_peer
    value check check_rel_err
    """.split()
)
WORKLOAD_FIELDS = tuple(
    """
    key name title size_name size shape dtype min_bytes flops note fastest_peer results
    """.split()
)

# Cross-check tolerance on the value and on gradient norms, relative.
CHECK_RTOL = {"float32": 1e-3, "float64": 1e-8}


def normalize(result: dict, system: str, title: str) -> dict:
    out = {field: None for field in RESULT_FIELDS}
    out.update(result)
    out.update(system=system, title=title)
    return out


def _rel_err(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(b), 1e-30)


def compare(fp: dict, ref: dict) -> float:
    """Largest relative difference between two fingerprints (inf: NaN or shapes differ)."""
    if len(fp["grads"]) != len(ref["grads"]):
        return math.inf
    errs = [_rel_err(fp["value"], ref["value"])]
    for g, r in zip(fp["grads"], ref["grads"], strict=True):
        if g["shape"] != r["shape"]:
            return math.inf
        errs += [_rel_err(g["sum_abs"], r["sum_abs"]), _rel_err(g["l2"], r["l2"])]
    return math.inf if any(math.isnan(e) for e in errs) else max(errs)


def derive(entry: dict, bandwidth_gbps: float | None) -> None:
    """Fill in the derived figures of one workload's results, in place."""
    ok = [r for r in entry["results"] if r["status"] == "ok" and r["median_s"]]
    by_name = {r["system"]: r for r in ok}
    numpy_ref = by_name.get("numpy")
    # The values are checked against NumPy's, or JAX's where there is no NumPy version.
    check_ref = numpy_ref or by_name.get("jax")
    peers = [r for r in ok if r["system"] != "fastgrad"]
    fastest = min(peers, key=lambda r: r["median_s"]) if peers else None
    entry["fastest_peer"] = fastest["system"] if fastest else None
    for r in ok:
        r["gbps"] = entry["min_bytes"] / r["median_s"] / 1e9
        if bandwidth_gbps:
            r["pct_bandwidth"] = 100 * r["gbps"] / bandwidth_gbps
        if entry["flops"]:
            r["gflops"] = entry["flops"] / r["median_s"] / 1e9
        if numpy_ref:
            r["speedup_vs_numpy"] = numpy_ref["median_s"] / r["median_s"]
        if fastest:
            r["ratio_to_fastest_peer"] = r["median_s"] / fastest["median_s"]
        if check_ref and r.get("fingerprint") and check_ref.get("fingerprint"):
            err = compare(r["fingerprint"], check_ref["fingerprint"])
            r["check_rel_err"] = err if math.isfinite(err) else None
            rtol = entry.get("check_rtol") or CHECK_RTOL[entry["dtype"]]
            r["check"] = "ok" if err <= rtol else "mismatch"
        else:
            r["check"] = "unchecked (neither numpy nor jax ran)"


# ---------------------------------------------------------------- table


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _num(x: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if x is None else format(x, fmt) + suffix


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} MB" if x >= 10 else f"{x:.1f} MB"


COLUMNS = (
    ("system", 14, "<"),
    ("first call", 11, ">"),
    ("warm 1st", 9, ">"),
    ("steady", 9, ">"),
    ("warm st.", 9, ">"),
    ("median", 9, ">"),
    ("peak mem", 9, ">"),
    ("call mem", 9, ">"),
    ("GB/s", 6, ">"),
    ("%bw", 5, ">"),
    ("vs numpy", 8, ">"),
    ("/fastest", 8, ">"),
    ("check", 6, "<"),
)


def _row(cells: list[str]) -> str:
    return "  ".join(format(c, f"{a}{w}") for c, (_, w, a) in zip(cells, COLUMNS, strict=True))


def _result_row(r: dict) -> str:
    if r["status"] == "skipped":
        return _row([r["system"], *[""] * (len(COLUMNS) - 1)])[:16] + f"skipped: {r['note']}"
    if r["status"] == "error":
        where = f" (during {r['stage']})" if r.get("stage") else ""
        msg = (r["error"] or "unknown error").splitlines()[0][:160]
        return _row([r["system"], *[""] * (len(COLUMNS) - 1)])[:16] + f"ERROR{where}: {msg}"
    check = r["check"] or ""
    if check == "mismatch":
        err = r["check_rel_err"]
        check = "MISMATCH: " + ("NaN or wrong shape" if err is None else f"rel err {err:.1e}")
    elif check.startswith("unchecked"):
        check = "-"
    return _row(
        [
            r["system"],
            fmt_time(r["first_call_s"]),
            fmt_time(r["first_call_warm_s"]),
            fmt_time(r["steady_after_s"]),
            fmt_time(r["steady_after_warm_s"]),
            fmt_time(r["median_s"]),
            _mb(r["peak_rss_delta_mb"]),
            _mb(r["steady_peak_delta_mb"]),
            _num(r["gbps"], ".1f"),
            _num(r["pct_bandwidth"], ".0f", "%"),
            _num(r["speedup_vs_numpy"], ".2f", "x"),
            _num(r["ratio_to_fastest_peer"], ".2f", "x"),
            check,
        ]
    )


def not_installed_line(missing: dict[str, str], install: str) -> str:
    """One line for every peer that is not installed, and how to install them."""
    return f"not installed, so not run: {', '.join(missing)} (install them with: {install})"


def format_table(doc: dict) -> str:
    env, bw = doc["environment"], doc["bandwidth"]
    v = env["versions"]
    lines = [
        f"fastgrad bench  ({doc['settings']['dtype']}, {env['threads']} threads, "
        f"{env['cpu_model']})",
        "versions: " + ", ".join(f"{k} {v[k]}" for k in v if v[k]),
        f"memory bandwidth (parallel Numba triad, 3 arrays): {_num(bw['gbps'], '.1f')} GB/s",
        f"load average at start {_load(env.get('load_start'))}, "
        f"at end {_load(doc.get('load_end'))} (other work on the machine skews timings)",
    ]
    lines += [f"note: {n}" for n in doc["notes"]]
    missing = doc.get("not_installed") or {}
    if missing:
        lines.append(not_installed_line(missing, doc.get("peers_install", "")))
    for entry in doc["workloads"]:
        lines += [
            "",
            f"{entry['key']} {entry['name']}: {entry['title']}",
            f"   {entry['shape']}  {entry['dtype']}  least traffic "
            f"{entry['min_bytes'] / 1e6:,.1f} MB"
            + (f"  ({entry['note']})" if entry["note"] else ""),
            "   " + _row([name for name, _, _ in COLUMNS]),
        ]
        lines += ["   " + _result_row(r) for r in entry["results"] if r["system"] not in missing]
        lines += _breakdown_lines(entry)
    lines += [
        "",
        "first call: trace + compile + one call, in a fresh process with an empty compile",
        "cache; building the function (fg.jit(f), jax.jit(f), ...) is timed apart, like the",
        "import (build_s in the JSON: fastgrad's jit imports its compiler and runtime layers);",
        "warm 1st: the same in a second process on the cache the first filled (fastgrad's",
        "kernels and plans, JAX's persistent compilation cache, torch.compile's inductor and",
        "AOTAutograd caches); '-' for systems with no compile cache (NumPy, Numba's loops,",
        "autograd, PyTorch eager), whose warm first call is their cold one;",
        "steady, warm st.: from the start of the first call until every later call runs",
        "compiled (fastgrad's first call runs on NumPy while kernels compile; the peers'",
        "first call is compiled), cold and warm;",
        "median: steady state per call; peak mem: peak RSS minus RSS before the inputs;",
        "call mem: peak RSS growth during the steady-state calls (memory an allocator kept",
        "from the first call is not counted again); GB/s: least traffic / median;",
        "%bw: of the triad bandwidth; vs numpy: speedup over hand-written NumPy;",
        "/fastest: time / fastest non-fastgrad system's time (below 1 is faster);",
        "check: value and gradient norms agree with NumPy's (with JAX's where there is",
        "no hand-written NumPy version: the models group).",
    ]
    return "\n".join(lines)


def _breakdown_lines(entry: dict) -> list[str]:
    """For results that split a call's time (the Dask systems): compute vs overhead, and
    the speedup over fastgrad in one process and over the system's one-worker version."""
    by_name = {r["system"]: r for r in entry["results"] if r["status"] == "ok"}
    single = by_name.get("fastgrad")
    lines = []
    for r in by_name.values():
        b = r.get("breakdown")
        if not b:
            continue
        text = (
            f"   {r['system']}: per call {fmt_time(b['wall_s'])} = compute "
            f"{fmt_time(b['compute_s'])} (busiest worker) + overhead "
            f"{fmt_time(b['overhead_s'])} (graph, scatter, scheduling, transfers "
            f"{fmt_time(b['transfer_s'])}, result)"
        )
        if single and single["median_s"]:
            text += f"; {single['median_s'] / b['wall_s']:.2f}x one process"
        lines.append(text)
    one, two = by_name.get("dask-1"), by_name.get("dask-2")
    if one and two and one.get("breakdown") and two.get("breakdown"):
        speedup = one["breakdown"]["wall_s"] / two["breakdown"]["wall_s"]
        lines.append(
            f"   2 workers vs 1: {speedup:.2f}x, scaling efficiency {100 * speedup / 2:.0f}% "
            f"(compute alone {one['breakdown']['compute_s'] / two['breakdown']['compute_s']:.2f}x)"
        )
    return lines


def _load(load: list | None) -> str:
    return "-" if not load else "/".join(f"{x:.1f}" for x in load)


# ---------------------------------------------------------------- json


def _finite(obj):
    """NaN and infinities as strings: strict JSON readers reject the bare tokens."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def write_json(doc: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n")


# ---------------------------------------------------------------- plot

COLORS = {
    "fastgrad": "#d62728",
    "numpy": "#7f7f7f",
    "numba": "#ff7f0e",
    "autograd": "#8c564b",
    "jax": "#1f77b4",
    "torch": "#2ca02c",
    "torch-compile": "#98df8a",
}


def plot(doc: dict, path: str | Path) -> None:
    """Two panels: steady-state time relative to NumPy, and first-call time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = doc["workloads"]
    systems = [s for s in COLORS if any(_ok(e, s) for e in entries)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 2.2 * len(entries) + 3), 9))
    width = 0.8 / max(1, len(systems))
    labels = [f"{e['key']} {e['name']}\n{e['shape']}" for e in entries]

    for i, system in enumerate(systems):
        xs, ys, firsts = [], [], []
        for j, e in enumerate(entries):
            r = _ok(e, system)
            if r is None:
                continue
            if r["speedup_vs_numpy"]:
                xs.append(j + (i - (len(systems) - 1) / 2) * width)
                ys.append(1 / r["speedup_vs_numpy"])
            firsts.append((j + (i - (len(systems) - 1) / 2) * width, r["first_call_s"]))
        bars = top.bar(xs, ys, width, label=system, color=COLORS[system])
        top.bar_label(bars, labels=[f"{y:.2g}" for y in ys], fontsize=7, padding=1)
        bottom.bar([x for x, _ in firsts], [f for _, f in firsts], width, color=COLORS[system])

    # A warm-cache first call, hatched over its system's cold bar
    for i, system in enumerate(systems):
        for j, e in enumerate(entries):
            r = _ok(e, system)
            if r and r["first_call_warm_s"]:
                bottom.bar(
                    [j + (i - (len(systems) - 1) / 2) * width],
                    [r["first_call_warm_s"]],
                    width * 0.6,
                    color="white",
                    edgecolor=COLORS[system],
                    hatch="///",
                )

    env = doc["environment"]
    top.axhline(1.0, color="black", lw=0.8)
    top.set_yscale("log")
    top.set_ylabel("steady-state time / hand-written NumPy\n(log; lower is faster)")
    top.set_title(
        f"fastgrad bench, {doc['settings']['dtype']}, {env['threads']} threads, "
        f"{env['cpu_model']}" + "".join(f"\n{n}" for n in doc["notes"]),
        fontsize=10,
    )
    top.legend(
        ncol=min(7, len(systems)), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22)
    )
    bottom.set_yscale("log")
    bottom.set_ylabel("first call, seconds (log)\nhatched: with a warm compile cache")
    for ax in (top, bottom):
        ax.set_xticks(range(len(entries)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.grid(axis="y", which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def _ok(entry: dict, system: str) -> dict | None:
    for r in entry["results"]:
        if r["system"] == system and r["status"] == "ok":
            return r
    return None
