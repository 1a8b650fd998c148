"""The `fastgrad` command: `fastgrad info` and `fastgrad bench` (the benchmark suite)."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence


def info() -> int:
    import llvmlite
    import numba
    import numpy

    import fastgrad
    from fastgrad.core.config import cache_dir, dir_size

    path = cache_dir()
    files, size = dir_size(path)
    rows = [
        ("fastgrad", fastgrad.__version__),
        ("python", platform.python_version()),
        ("numpy", numpy.__version__),
        ("numba", numba.__version__),
        ("llvmlite", llvmlite.__version__),
        ("threads", f"{numba.config.NUMBA_NUM_THREADS} (NUMBA_NUM_THREADS)"),  # type: ignore[attr-defined]
        ("cpu", cpu_model()),
        ("cache", f"{path} ({files} files, {size / 2**20:.1f} MiB)"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="fastgrad", description="JIT-compiled CPU reverse-mode autodiff for NumPy code."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print versions, threads and the kernel cache directory")
    sub.add_parser(
        "bench",
        help="run the benchmark suite (fastgrad bench --help for its options)",
        add_help=False,
    )
    if argv[:1] == ["bench"]:
        from fastgrad_bench.runner import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
