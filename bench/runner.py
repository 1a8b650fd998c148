"""`fastgrad bench`: parse the command line, run every measurement in a child process,
then print the table and write the JSON and plot.

Progress goes to stderr, the table to stdout. `main(argv)` is what the `fastgrad`
command calls; `python -m fastgrad_bench` calls it too.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import child, environment, models, report, systems, workloads
from .measure import MEMORY_METHOD

DEFAULT_REPEAT, QUICK_REPEAT = 15, 3
# Per measurement: stop repeating after this long (at least three batches are always
# timed), so that a slow system does not hold the whole suite up.
BUDGET_S, QUICK_BUDGET_S = 30.0, 2.0
TRIAD_N, QUICK_TRIAD_N = 2 * 10**7, 10**7  # both far beyond any cache
TRIAD_REPEAT, QUICK_TRIAD_REPEAT = 20, 5
PEERS_INSTALL = 'pip install -e ".[compare]"'  # the extra that installs every peer


def _count(text: str) -> int:
    """A positive integer; 1e7 and 10_000_000 are accepted too."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not value.is_integer() or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(value)


def _system_list(text: str) -> list[str]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of systems")
    unknown = [n for n in names if n not in systems.SYSTEMS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown system {', '.join(map(repr, unknown))}; choose from "
            + ",".join(systems.PEERS)
            + " (fastgrad always runs)"
        )
    return [n for n in names if n != "fastgrad"]


def make_parser() -> argparse.ArgumentParser:
    names = ", ".join(f"{w.key} ({w.name})" for w in workloads.WORKLOADS + workloads.OPT_IN)
    names += "; or the group 'models' (W4 and M1-M5)"
    parser = argparse.ArgumentParser(
        prog="fastgrad bench",
        description="Benchmark fastgrad against hand-written NumPy, a hand-fused Numba "
        "loop and the installed peers (autograd, JAX, PyTorch). Each system runs in a "
        "process of its own.",
        epilog=f"Peers that are not installed are skipped, with one note ({PEERS_INSTALL} "
        "installs them).",
    )
    parser.add_argument(
        "workloads", nargs="*", metavar="WORKLOAD", help=f"workloads to run (default: all): {names}"
    )
    parser.add_argument(
        "--size",
        type=_count,
        metavar="N",
        help="override every selected workload's main size "
        "(W1/W5: elements, W2/W3: rows, W4: batch)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float64",
        help="floating-point type of the inputs (default: float64)",
    )
    parser.add_argument(
        "--repeat",
        type=_count,
        metavar="R",
        help=f"timed batches per measurement; the median is reported "
        f"(default: {DEFAULT_REPEAT}, {QUICK_REPEAT} with --quick)",
    )
    parser.add_argument(
        "--compare",
        type=_system_list,
        metavar="LIST",
        default=list(systems.PEERS),
        help="comma-separated systems to compare with (default: all): " + ",".join(systems.PEERS),
    )
    parser.add_argument(
        "--json", metavar="PATH", help="write every figure and the environment as JSON"
    )
    parser.add_argument("--plot", metavar="PATH", help="write a PNG chart (needs matplotlib)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and few repeats: a smoke test, not a measurement",
    )
    parser.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="skip the warm runs (a second process per compiler, on the compile cache "
        "the first one filled; torch.compile's costs ~10 s a workload): the warm "
        "columns show '-'",
    )
    parser.add_argument(
        "--timeout",
        type=_count,
        metavar="SECONDS",
        default=1800,
        help="give up on one measurement after this long (default: 1800)",
    )
    parser.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="TEXT",
        help="a note to print with the table and store in the JSON",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the workloads and systems, then exit"
    )
    return parser


def _check_output(parser, option: str, path: str | None) -> None:
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        parser.error(f"{option} {path}: is a directory, expected a file path")
    if not p.parent.is_dir():
        parser.error(f"{option} {path}: directory {str(p.parent)!r} does not exist")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        args.selected = workloads.select(args.workloads)
    except KeyError as exc:
        parser.error(str(exc.args[0]))
    _check_output(parser, "--json", args.json)
    _check_output(parser, "--plot", args.plot)
    if args.plot and not _has_matplotlib():
        parser.error(
            "--plot needs matplotlib, which is not installed "
            "(pip install matplotlib, or pip install 'fastgrad[plot]')"
        )
    if args.repeat is None:
        args.repeat = QUICK_REPEAT if args.quick else DEFAULT_REPEAT
    # Refuse sizes this machine cannot hold instead of letting a child be killed.
    total = environment.memory_bytes().get("MemTotal")
    itemsize = np.dtype(args.dtype).itemsize
    for w in args.selected:
        # Inputs plus gradients, and room for the temporaries hand-written NumPy keeps.
        size = w.size(args.quick, args.size)
        need = 4 * w.min_bytes(size, itemsize)
        if total and need > total:
            parser.error(
                f"size {size:,} is too large for {w.key}: it needs about "
                f"{need / 1e9:.1f} GB, this machine has {total / 1e9:.1f} GB"
            )
    return args


def _has_matplotlib() -> bool:
    return systems.missing_module(("matplotlib",)) is None


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def list_everything() -> str:
    lines = ["workloads:"]
    lines += [f"  {w.key:3} {w.name:13} {w.title}" for w in workloads.WORKLOADS]
    lines += [f"  {w.key:3} {w.name:13} {w.title} (run when named)" for w in workloads.OPT_IN]
    lines += [f"  {w.key:3} {w.name:13} {w.title} (group 'models')" for w in models.MODELS]
    lines += ["systems:"]
    for s in systems.SYSTEMS.values():
        missing = systems.missing_module(s.modules)
        state = f"not installed ({s.install})" if missing else "available"
        lines.append(f"  {s.name:14} {s.title:45} {state}")
    return "\n".join(lines)


class Suite:
    """Runs the selected workloads on the selected systems, one child each."""

    def __init__(self, args: argparse.Namespace, threads: int):
        self.args = args
        self.threads = threads
        self.budget = QUICK_BUDGET_S if args.quick else BUDGET_S
        self.names = ["fastgrad", *args.compare]
        # Peers that are not installed are said once, not once per workload.
        self.not_installed = {
            name: missing
            for name in args.compare
            if systems.SYSTEMS[name].peer
            and (missing := systems.missing_module(systems.SYSTEMS[name].modules))
        }
        self.total = sum(
            len([s for s in self.systems_for(w) if s not in self.not_installed])
            for w in args.selected
        )
        self.done = 0

    def systems_for(self, w: workloads.Workload) -> list[str]:
        """The workload's own systems (all of --compare when it names none), without the
        peers that --compare leaves out."""
        if not w.systems:
            return self.names
        left_out = set(systems.PEERS) - set(self.args.compare)
        return [s for s in w.systems if s not in left_out]

    def triad(self, when: str) -> dict:
        n = QUICK_TRIAD_N if self.args.quick else TRIAD_N
        repeat = QUICK_TRIAD_REPEAT if self.args.quick else TRIAD_REPEAT
        _progress(f"measuring memory bandwidth ({when}, triad of {n:,} float64) ...")
        result = child.launch(
            {"kind": "triad", "n": n, "repeat": repeat}, timeout=self.args.timeout
        )
        if result["status"] == "ok":
            _progress(f"  {result['best_gbps']:.1f} GB/s")
        else:
            _progress(f"  failed: {result['error']}")
        return result

    def spec(self, w: workloads.Workload, system: str, **extra) -> dict:
        return {
            "kind": "workload",
            "system": system,
            "workload": w.key,
            "size": w.size(self.args.quick, self.args.size),
            "dtype": self.args.dtype,
            "repeat": self.args.repeat,
            "budget_s": self.budget,
            "threads": self.threads,
            **extra,
        }

    def run_system(self, w: workloads.Workload, name: str) -> dict:
        system = systems.SYSTEMS[name]
        missing = systems.missing_module(system.modules)
        if missing and system.peer:
            return {"status": "skipped", "note": f"{missing} is not installed ({system.install})"}
        # Cold: a fresh, empty compile cache per run (so an earlier run, or the user's own
        # cache, cannot warm it). Warm: a second fresh process on the cache the first one
        # filled, which times the first call and the time to steady state only.
        prefix = f"fastgrad-bench-{name}-cache-"
        with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as cache:
            env = system.cache_env(cache)
            result = child.launch(self.spec(w, name), env=env, timeout=self.args.timeout)
            if system.warm and self.args.warm and result["status"] == "ok":
                warm = child.launch(
                    self.spec(w, name, first_call_only=True), env=env, timeout=self.args.timeout
                )
                # The warm process computes what the cold one did (a stale or damaged
                # cache answering otherwise is not timed as a success).
                fingerprints = warm.get("fingerprint"), result.get("fingerprint")
                rtol = w.check_rtol or report.CHECK_RTOL[self.args.dtype]
                err = report.compare(*fingerprints) if all(fingerprints) else 0.0
                if warm["status"] == "ok" and err > rtol:
                    result["note"] = f"warm-cache run gave other values (relative {err:.2g})"
                elif warm["status"] == "ok":
                    result["first_call_warm_s"] = warm["first_call_s"]
                    result["steady_after_warm_s"] = warm["steady_after_s"]
                else:
                    result["note"] = f"warm-cache run failed: {warm.get('error')}"
            return result

    def run_workload(self, w: workloads.Workload) -> dict:
        size = w.size(self.args.quick, self.args.size)
        entry = {
            "key": w.key,
            "name": w.name,
            "title": w.title,
            "size_name": w.size_name,
            "size": size,
            "shape": w.shape(size),
            "dtype": self.args.dtype,
            "min_bytes": w.min_bytes(size, np.dtype(self.args.dtype).itemsize),
            "flops": w.flops(size) if w.flops else None,
            "check_rtol": w.check_rtol,
            "note": w.note or None,
            "fastest_peer": None,
            "results": [],
        }
        for name in self.systems_for(w):
            if name in self.not_installed:
                result = {"status": "skipped", "note": not_installed_note(name, self)}
                entry["results"].append(report.normalize(result, name, systems.SYSTEMS[name].title))
                continue
            self.done += 1
            _progress(
                f"[{self.done}/{self.total}] {w.key} {w.name} ({w.size_name}={size:,}) "
                f"on {name} ..."
            )
            start = time.perf_counter()
            result = report.normalize(self.run_system(w, name), name, systems.SYSTEMS[name].title)
            _progress("  " + _summary(result, time.perf_counter() - start))
            entry["results"].append(result)
        return entry


def not_installed_note(name: str, suite: Suite) -> str:
    return f"{suite.not_installed[name]} is not installed ({systems.SYSTEMS[name].install})"


def _summary(r: dict, wall: float) -> str:
    if r["status"] == "ok":
        return (
            f"ok: first call {report.fmt_time(r['first_call_s'])}, median "
            f"{report.fmt_time(r['median_s'])} over {r['repeats']}x{r['inner']} "
            f"({wall:.1f} s)"
        )
    if r["status"] == "skipped":
        return f"skipped: {r['note']}"
    return f"ERROR: {r['error']}"


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else list(argv))
    if args.list:
        print(list_everything())
        return 0
    env = environment.collect()
    suite = Suite(args, env["threads"])
    if suite.not_installed:
        _progress(report.not_installed_line(suite.not_installed, PEERS_INSTALL))
    start = time.perf_counter()
    before = suite.triad("start")
    entries = [suite.run_workload(w) for w in args.selected]
    # Measured again at the end, since a shared machine's bandwidth drifts; --quick skips it.
    after = None if args.quick else suite.triad("end")
    rates = [t["best_gbps"] for t in (before, after) if t and t["status"] == "ok"]
    bandwidth = max(rates) if rates else None
    for entry in entries:
        report.derive(entry, bandwidth)

    notes = list(args.note)
    if args.quick:
        notes.append("--quick: small sizes and few repeats; a smoke test, not a measurement")
    doc = {
        "schema": report.SCHEMA,
        "command": "fastgrad bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            "workloads": [w.key for w in args.selected],
            "systems": suite.names,
            "dtype": args.dtype,
            "size": args.size,
            "repeat": args.repeat,
            "quick": args.quick,
            "warm": args.warm,
            "budget_s": suite.budget,
            "timeout_s": args.timeout,
        },
        "environment": env,
        "bandwidth": {
            "method": "parallel Numba triad a = b + s*c into a touched output, 3 arrays "
            "counted; the best of the runs at the start and at the end is used",
            "start": before,
            "end": after,
            "gbps": bandwidth,
        },
        "memory_method": MEMORY_METHOD,
        "not_installed": suite.not_installed,
        "peers_install": PEERS_INSTALL,
        "notes": notes,
        "elapsed_s": time.perf_counter() - start,
        "load_end": environment.load_average(),
        "workloads": entries,
    }
    print(report.format_table(doc))
    if args.json:
        report.write_json(doc, args.json)
        _progress(f"wrote {args.json}")
    if args.plot:
        report.plot(doc, args.plot)
        _progress(f"wrote {args.plot}")
    errors = [
        (e["key"], r["system"]) for e in entries for r in e["results"] if r["status"] == "error"
    ]
    if errors:
        _progress("errors in: " + ", ".join(f"{k} {s}" for k, s in errors))
    return 1 if errors else 0
