"""Kernels whose compile outran the watchdog: remembered on disk, compiled apart next time.

A Numba compile cannot be interrupted inside a process (and it holds Numba's compiler lock,
so nothing else compiles meanwhile). When one takes longer than `config.compile_timeout`,
the compile thread's watchdog records its kernel here (`<cache dir>/slow_kernels/`). A later
run compiles a recorded kernel in a child process (`compile_apart`), which saves its machine
code to the cache and can be killed; the caller's process then only loads it. A kernel
whose child also runs past `APART_FACTOR` times the timeout is recorded as hung and runs
with NumPy from then on, until fastgrad, Numba or the CPU changes (the key holds them).
"""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from fastgrad.compiler.kernel_cache import compile_kernel, kernel_key, needs_build
from fastgrad.compiler.machine_code import write_atomically
from fastgrad.core.config import cache_dir, config

SLOW, HUNG = "slow", "hung"
# A child process gets this many times the watchdog's timeout: a kernel that compiled
# slowly (not forever) in the caller's process gets room to finish once, for good.
APART_FACTOR = 10


def _record(source: str) -> Path:
    return cache_dir() / "slow_kernels" / f"{kernel_key(source)}.json"


# Record path -> state, as read (or written) by this process: each step of an unrolled
# loop asks about its kernel (599 reads of absent files took 0.9 s of a warm T=200 RNN
# first call). A record another process writes meanwhile is for later runs.
_KNOWN: dict[Path, str | None] = {}


def recorded(source: str) -> str | None:
    """SLOW or HUNG if the kernel in `source` is recorded, else None."""
    path = _record(source)
    if path in _KNOWN:
        return _KNOWN[path]
    try:
        state = json.loads(path.read_text())["state"]
    except (OSError, ValueError, KeyError, TypeError):  # absent, or damaged: not recorded
        state = None
    _KNOWN[path] = state = state if state in (SLOW, HUNG) else None
    return state


def record(source: str, state: str, label: str, seconds: float) -> None:
    """Remember the kernel in `source` as SLOW or HUNG (an unwritable cache forgets it)."""
    text = json.dumps({"state": state, "kernel": label, "seconds": round(seconds, 1)})
    _KNOWN[_record(source)] = state
    try:
        write_atomically(_record(source), text.encode())
    except OSError:
        pass  # the cache warns about itself when kernels are saved


def compile_apart(source: str, name: str, types: tuple[Any, ...], label: str) -> tuple[Any, bool]:
    """Compile the kernel in `source` for `types` in a child process, bounded by
    `APART_FACTOR * config.compile_timeout` seconds, then load its machine code from the
    cache: (dispatcher, True). A child that fails or runs out of time raises RuntimeError
    (one out of time records the kernel as hung)."""
    bound = APART_FACTOR * config.compile_timeout
    payload = pickle.dumps((source, name, types, bound))
    command = [sys.executable, "-c", "from fastgrad.runtime.slow_kernels import main; main()"]
    try:
        child = subprocess.run(command, input=payload, capture_output=True, timeout=bound)
    except subprocess.TimeoutExpired:  # run() has killed the child
        record(source, HUNG, label, bound)
        raise RuntimeError(
            f"its compile ran past {bound:g} s in a separate process, which was stopped"
        ) from None
    if child.returncode != 0:
        error = child.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(
            f"its compile in a separate process failed: {error[-1] if error else child}"
        )
    if needs_build(source):  # nothing on disk to load: compiling here could hang again
        raise RuntimeError("compiled in a separate process, but the cache could not keep it")
    dispatcher, _ = compile_kernel(source, name, types)
    return dispatcher, True


def main() -> None:
    """The child process: compile one kernel (read from stdin) into the cache. An alarm
    ends it at the bound even if its parent is gone (SIGALRM's default action)."""
    source, name, types, bound = pickle.loads(sys.stdin.buffer.read())
    if hasattr(signal, "alarm"):
        signal.alarm(int(bound) + 1)
    compile_kernel(source, name, types)
