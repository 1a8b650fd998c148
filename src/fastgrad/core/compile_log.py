"""What fastgrad says on stderr while it traces and compiles.

`compiling(what, n_new)` wraps a first run that builds `n_new` kernels: one line says what
is compiled, a mark appears as each kernel is built (`kernel_built`, called by the
compiler) and the time it took ends the line. When kernels compile in the background,
`background_started` says so as the first call returns, and `background_done` when they
are ready; `compile_overdue` when one outruns `config.compile_timeout`. With
`config.log_compiles` (`FASTGRAD_LOG_COMPILES=1`), `log_trace` and `log_compile` also log
every trace and every compile with its reason. Callers pass plain text: this module
knows no graph or kernel.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from fastgrad.core.config import cache_dir, config

PREFIX = "fastgrad: "


def _stream() -> TextIO:
    return sys.stderr  # looked up at each write, so that redirections take effect


def log_trace(function: str, reason: str) -> None:
    """Log (if asked) that `function` is traced, and why: "first call", or what changed."""
    if config.log_compiles:
        print(f"{PREFIX}tracing {function}: {reason}", file=_stream(), flush=True)


def log_compile(
    what: str, n_kernels: int, cached: int, seconds: float | None = None, reason: str = ""
) -> None:
    """Log (if asked) a compile of `what`: `n_kernels` kernels, of which `cached` were
    already compiled (in memory or on disk), so `n_kernels - cached` were built now."""
    if not config.log_compiles:
        return
    built = n_kernels - cached
    text = f"{PREFIX}compiled {what}: {_plural(n_kernels, 'kernel')}"
    text += f" ({built} built, {cached} cached)" if n_kernels else ""
    if seconds is not None:
        text += f" in {seconds:.2f} s"
    print(text + (f"; {reason}" if reason else ""), file=_stream(), flush=True)


def background_started(what: str, n_new: int) -> None:
    """Say (once the first call of `what` has returned, computed with NumPy) that `n_new`
    kernels are being built in the background."""
    if config.compile_notice and n_new > 0:
        print(
            f"{PREFIX}compiling {what}: {_plural(n_new, 'kernel')} in the background (calls "
            f"run with NumPy until each is ready; cached in {_short(cache_dir())} for next "
            "time)",
            file=_stream(),
            flush=True,
        )


def background_done(what: str, n_kernels: int, built: int, failed: int, seconds: float) -> None:
    """Say that the background compile of `what` has finished: `built` of `n_kernels`
    kernel variants were built (the rest loaded from disk), `failed` failed."""
    text = f"{PREFIX}compiled {what} in the background: {_plural(n_kernels, 'kernel')}"
    text += f" ({built} built, {n_kernels - built - failed} cached"
    text += f", {failed} failed)" if failed else ")"
    text += f" in {seconds:.2f} s; "
    text += "the failed kernels' loops run with NumPy" if failed else "calls now run compiled"
    if config.log_compiles or (config.compile_notice and (built or failed)):
        print(text, file=_stream(), flush=True)


def log_kernel_ready(label: str, ok: bool, built: bool, seconds: float) -> None:
    """Log (if asked) that the background compile of one kernel (`label`) is done."""
    if config.log_compiles:
        how = ("built" if built else "loaded from disk") if ok else "FAILED"
        text = f"{PREFIX}{label} {how} in the background in {seconds:.2f} s"
        print(text + ("; calls switch to it" if ok else ""), file=_stream(), flush=True)


def compile_overdue(label: str, size: str, seconds: float, kernel: bool | str = True) -> None:
    """Say (always: something is wrong) that the compile of one kernel (`label`, of `size`)
    has run for `seconds`, past `config.compile_timeout`; a kernel (not an adapter or the
    plan interpreter) compiles in a separate process next time; a job of another kind
    says what follows (`kernel` a sentence: runtime.native_plan.Load's)."""
    then = (
        kernel
        if isinstance(kernel, str)
        else "the kernel compiles in a separate process next time"
        if kernel
        else "plans run step by step"
    )
    print(
        f"{PREFIX}the compile of the {label}, {size}, has run for {seconds:.0f} s (more than "
        f"compile_timeout): calls run that loop, and any queued behind it, with NumPy "
        f"meanwhile; {then}",
        file=_stream(),
        flush=True,
    )


class Notice:
    """The one line shown while kernels are built."""

    def __init__(self, what: str, n_new: int):
        self.what = what
        self.n_new = n_new
        self.done = 0
        self.start = time.perf_counter()
        self.shown = config.compile_notice and n_new > 0
        self.tty = _stream().isatty()
        if self.shown:
            self._write(self._head() + ("" if self.tty else " "))

    def _head(self) -> str:
        return (
            f"{PREFIX}compiling {self.what}: {_plural(self.n_new, 'kernel')} (cached in "
            f"{_short(cache_dir())} for next time)"
        )

    def _write(self, text: str) -> None:
        stream = _stream()
        stream.write(text)
        stream.flush()

    def kernel_built(self) -> None:
        # A kernel may be built twice (for two memory layouts): the count stops at n_new.
        self.done += 1
        if not self.shown or self.done > self.n_new:
            return
        if self.tty:  # rewrite the line in place with a count
            self._write(f"\r{self._head()} {self.done}/{self.n_new}")
        else:  # a log file gets a dot per kernel on the same line
            self._write(".")

    def close(self, failed: bool) -> None:
        if not self.shown:
            return
        seconds = time.perf_counter() - self.start
        end = "failed" if failed else "done"
        self._write(f" {end} in {seconds:.1f} s\n")


class _Notices(threading.local):
    """The notices of the first runs under way in the running thread, innermost last."""

    def __init__(self) -> None:
        self.active: list[Notice] = []


_notices = _Notices()


@contextmanager
def compiling(what: str, n_new: int) -> Iterator[Notice]:
    """Announce, for the duration of the block, that `n_new` kernels are built for `what`
    (nothing is shown when there are none, or when `config.compile_notice` is off)."""
    notice = Notice(what, n_new)
    _notices.active.append(notice)
    failed = True
    try:
        yield notice
        failed = False
    finally:
        _notices.active.remove(notice)
        notice.close(failed)


def kernel_built() -> None:
    """Called by the compiler each time it has built a kernel: advances the notice."""
    active = _notices.active
    if active:
        active[-1].kernel_built()


def _short(path: Path) -> str:
    """`path` with the home directory written `~`, as users know it."""
    try:
        return str(Path("~") / path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
