"""Settings: where compiled kernels are cached, and what fastgrad says while it compiles.

`FASTGRAD_CACHE_DIR` overrides the cache's default place, `$XDG_CACHE_HOME/fastgrad` (or
`~/.cache/fastgrad`). `config` holds the switches, read from the environment at import
and changed with `fg.config.update(name, value)`: `log_compiles`
(`FASTGRAD_LOG_COMPILES=1`), `compile_notice` (`FASTGRAD_COMPILE_NOTICE=0` hides it) and
`compile` (`FASTGRAD_COMPILE=sync` compiles before a first call returns),
`compile_timeout` (`FASTGRAD_COMPILE_TIMEOUT`), `runtime` (`FASTGRAD_RUNTIME=steps` runs
plans step by step rather than through the plan interpreter), `trace_cache_size`
(`FASTGRAD_TRACE_CACHE_SIZE`), `plan_cache` (`FASTGRAD_PLAN_CACHE=0` keeps prepared
plans off the disk) and `plan_cache_mb` (`FASTGRAD_PLAN_CACHE_MB`, the plans' share of the
cache directory), `output_pool_mb` (`FASTGRAD_OUTPUT_POOL_MB`, memory of large outputs
kept for later calls).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

# What `cache_dir` reads (HOME: through Path.home): a cache of it is kept under them.
CACHE_VARIABLES = ("FASTGRAD_CACHE_DIR", "XDG_CACHE_HOME", "HOME")


def cache_dir() -> Path:
    """The directory for fastgrad's on-disk cache (not created here)."""
    explicit = os.environ.get("FASTGRAD_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fastgrad"


def dir_size(path: Path) -> tuple[int, int]:
    """(number of files, total bytes) under `path`; (0, 0) if it does not exist."""
    files = total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:  # removed while we walk: another process cleaning up
                pass
    return files, total


def _flag(variable: str, default: bool) -> bool:
    value = os.environ.get(variable, "").strip().lower()
    if not value:
        return default
    return value not in ("0", "false", "no", "off")


#: The values of `config.compile`.
COMPILE_MODES = ("background", "sync")
#: The values of `config.runtime`.
RUNTIMES = ("vm", "steps")  # the first: the default


def _count(variable: str, default: int, least: int = 1) -> int:
    value = os.environ.get(variable, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < least:
        raise ValueError(f"{variable}={value!r}: expected a whole number of at least {least}")
    return int(value)


def _fits_timeout(seconds: float) -> bool:
    """Whether `seconds` can be a wait's timeout: above 0, and at most what threading's
    locks and timers accept (they raise OverflowError beyond it, inf included)."""
    return 0 < seconds <= threading.TIMEOUT_MAX


def _seconds(variable: str, default: float) -> float:
    value = os.environ.get(variable, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not _fits_timeout(seconds):
        raise ValueError(
            f"{variable}={value!r}: expected a number of seconds above 0 and at most "
            f"{threading.TIMEOUT_MAX:g}"
        )
    return seconds


def _choice(variable: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(variable, "").strip().lower() or choices[0]
    if value not in choices:
        raise ValueError(f"{variable}={value!r}: expected one of {', '.join(choices)}")
    return value


class Config:
    """fastgrad's switches.

    - `log_compiles`: log every trace and compile on stderr, with the reason (which
      argument changed, and how). Default from `FASTGRAD_LOG_COMPILES`.
    - `compile_notice`: while kernels compile, say so on stderr in one line. Default on;
      `FASTGRAD_COMPILE_NOTICE=0` turns it off.
    - `compile`: "background" (the default): a first call runs at once on NumPy while its
      kernels compile on a background thread, and calls switch to each kernel when it is
      ready; "sync": a first call waits for its kernels (compiled on that thread too,
      under the watchdog below). Default from `FASTGRAD_COMPILE`.
    - `compile_timeout`: seconds of wall time after which a kernel's compile is reported
      as overdue (once, naming the kernel) and its loop, and any call waiting for it, runs
      with NumPy; the kernel compiles in a separate process next time
      (fastgrad.runtime.slow_kernels). Default 60, or `FASTGRAD_COMPILE_TIMEOUT`: the
      slowest build measured (gamma's sampler, 4.4 s of CPU) took 12-34 s of wall time
      on a loaded 2-core machine, so a minute is no false alarm there, yet a hung
      compile is told within a minute.
    - `trace_cache_size`: how many input signatures (shapes, dtypes, static values) each
      jitted function keeps traced and compiled; beyond it the least recently used is
      dropped (and traced again if it comes back). Default 256, or
      `FASTGRAD_TRACE_CACHE_SIZE`.
    - `runtime`: how a plan runs once its kernels are compiled: "vm" (the default), each
      run of kernels, matmuls and views one call into a compiled interpreter
      (runtime.vm); "steps", one Python call per step, the reference and debug path.
      Plans built after the change use it. Default from `FASTGRAD_RUNTIME`.
    - `plan_cache`: keep each prepared plan (the simplified graph, its fused loops and their
      kernel sources) in the cache directory, keyed by the traced graph, so that a new
      process tracing the same function skips simplification, partitioning and code
      generation, and the reverse-mode graph of a jitted gradient too, so that tracing
      runs no VJP rule (fastgrad.compiler.plan_cache; graphs under 200 nodes are
      prepared afresh, which is faster). Default on; `FASTGRAD_PLAN_CACHE=0` turns it off.
    - `plan_cache_mb`: the most megabytes the stored plans and graphs may take; past it,
      a process storing one removes the least recently used (written or read) down to 90%
      of it, never one used in the last minute (compiler.cache_eviction). Default 256, or
      `FASTGRAD_PLAN_CACHE_MB`.
    - `cut_products`: with the "vm" runtime, BLAS runs on one thread and the interpreter
      cuts big matrix products across the cores itself, with threads that sleep rather
      than spin while they wait (runtime.gemm_split), where their bands keep their bits
      on this machine (the step runner, the reference, runs such a plan's products on
      one BLAS thread too); off: BLAS's own threads, except beside parallel kernels.
      Plans built after the change use it. Default on; `FASTGRAD_CUT_PRODUCTS=0` turns it
      off.
    - `output_pool_mb`: the most megabytes of memory under large outputs (1 MB and above)
      kept to be handed out again to a later call's outputs once nothing else holds it
      (runtime.recycling: the first touch of fresh pages is what costs). What the caller
      holds counts too; `fg.release_buffers()` lets go of what nobody holds. Default 512,
      or `FASTGRAD_OUTPUT_POOL_MB`; 0 turns it off.

    - `check_graphs`: type-check every traced graph node by node (Graph.verify with
      types), re-deriving each node's type from its op's rule. Tracing gives each node
      that type as it binds it, and a graph read from the plan cache was checked when
      it was built, so by default a trace checks its wiring only (the type check was
      20-27 ms of a 200-step RNN's warm first call). For tests and debugging: on with
      `FASTGRAD_CHECK_GRAPHS=1` or `FASTGRAD_DEBUG=1`.

    >>> import fastgrad as fg
    >>> fg.config.update("log_compiles", True)
    >>> fg.config.log_compiles
    True
    >>> fg.config.update("log_compiles", False)
    """

    log_compiles: bool
    compile_notice: bool
    compile: str
    compile_timeout: float
    trace_cache_size: int
    runtime: str
    plan_cache: bool
    plan_cache_mb: int
    check_graphs: bool
    cut_products: bool
    output_pool_mb: int

    def __init__(self) -> None:
        self.log_compiles = _flag("FASTGRAD_LOG_COMPILES", False)
        self.compile_notice = _flag("FASTGRAD_COMPILE_NOTICE", True)
        self.compile = _choice("FASTGRAD_COMPILE", COMPILE_MODES)
        self.compile_timeout = _seconds("FASTGRAD_COMPILE_TIMEOUT", 60.0)
        self.trace_cache_size = _count("FASTGRAD_TRACE_CACHE_SIZE", 256)
        self.runtime = _choice("FASTGRAD_RUNTIME", RUNTIMES)
        self.plan_cache = _flag("FASTGRAD_PLAN_CACHE", True)
        self.plan_cache_mb = _count("FASTGRAD_PLAN_CACHE_MB", 256)
        debug = _flag("FASTGRAD_DEBUG", False)
        self.check_graphs = _flag("FASTGRAD_CHECK_GRAPHS", debug)
        self.cut_products = _flag("FASTGRAD_CUT_PRODUCTS", True)
        self.output_pool_mb = _count("FASTGRAD_OUTPUT_POOL_MB", 512, least=0)

    def update(self, name: str, value: Any) -> None:
        """Set switch `name` (as in JAX's `jax.config.update`)."""
        if name not in vars(self):
            raise AttributeError(
                f"fastgrad has no setting {name!r}; the settings are "
                + ", ".join(sorted(vars(self)))
            )
        if name == "compile":
            if value not in COMPILE_MODES:
                raise ValueError(f"setting compile takes one of {COMPILE_MODES}, got {value!r}")
        elif name == "compile_timeout":
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not _fits_timeout(value)
            ):
                raise ValueError(
                    "setting compile_timeout takes seconds > 0 and <= "
                    f"{threading.TIMEOUT_MAX:g}, got {value!r}"
                )
            value = float(value)
        elif name == "runtime":
            if value not in RUNTIMES:
                raise ValueError(f"setting runtime takes one of {RUNTIMES}, got {value!r}")
        elif name in ("trace_cache_size", "plan_cache_mb"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"setting {name} takes an int >= 1, got {value!r}")
        elif name == "output_pool_mb":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"setting {name} takes an int >= 0, got {value!r}")
        elif not isinstance(value, bool):
            raise TypeError(f"setting {name} takes True or False, got {value!r}")
        setattr(self, name, value)

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items())) + ")"


config = Config()
