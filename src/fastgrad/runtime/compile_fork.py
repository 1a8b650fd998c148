"""Numba's compiler lock across a fork: a child must not inherit it held.

Numba compiles under one process-wide lock (`numba.core.compiler_lock`). A fork copies the
lock as it is, but only the forking thread: if the compile thread held it at that moment,
the child's copy stays held by a thread the child does not have, and every compile in
the child waits for it, until the watchdog gives the call to NumPy (`config.
compile_timeout`, 60 s by default) and the child never runs compiled. So, before a fork,
the forking thread takes the lock itself, waiting for the compile under way to end (at
most `config.compile_timeout`, and not at all for a compile the watchdog already found
overdue, which may never end); parent and child release it after the fork, and the
child's compile thread (background._Worker.forked) compiles what its parent had not
finished. A fork while Numba is not imported costs nothing here. First of all, a fork
waits for Numba's import under way on the compile thread (runtime.numba_load).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from fastgrad.core.config import config
from fastgrad.runtime import numba_load


class _Forks(threading.local):
    """The lock the running thread took for its fork under way, if any."""

    held: Any = None
    loading = False  # whether it holds runtime.numba_load's lock too


_forks = _Forks()


def _compiler_lock() -> Any:
    module = sys.modules.get("numba.core.compiler_lock")
    return None if module is None else module.global_compiler_lock._lock


def before_fork(overdue: Callable[[], bool]) -> None:
    """Wait for Numba's import and registry load under way (runtime.numba_load), then take
    Numba's compiler lock for the fork, unless `overdue()` says a compile may never give
    it back."""
    _forks.held = None
    _forks.loading = numba_load.before_fork(config.compile_timeout)
    lock = _compiler_lock()
    if lock is None or overdue():
        return
    if lock.acquire(timeout=config.compile_timeout):
        _forks.held = lock


def after_fork() -> None:
    """In the parent and in the child: give back the lock `before_fork` took."""
    lock, _forks.held = _forks.held, None
    if lock is not None:
        lock.release()
    loading, _forks.loading = _forks.loading, False
    if loading:
        numba_load.after_fork()


def holds_stale_lock() -> bool:
    """In a forked child: whether Numba's compiler lock, or runtime.numba_load's, is held
    by a thread the child does not have (the fork did not wait for it: a compile found
    overdue, or a compile or Numba's import that outran the wait)."""
    return _held(numba_load.LOCK) or _held(_compiler_lock())


def _held(lock: Any) -> bool:
    """Whether `lock` (None: Numba is not imported) is held: one no thread holds is
    taken and given back at once."""
    if lock is None:
        return False
    if not lock.acquire(blocking=False):
        return True
    lock.release()
    return False


def register(overdue: Callable[[], bool]) -> None:
    """Install the hooks (once per process, by runtime.background). `logging` is imported
    first so that its own fork hook, which takes logging's module lock, runs after ours
    (hooks run in reverse order of registration): else a fork would hold logging's lock
    while waiting for a compile that itself waits for logging's lock (Numba logs)."""
    import logging  # noqa: F401  (its fork hook must be registered before ours)

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(
            before=lambda: before_fork(overdue),
            after_in_parent=after_fork,
            after_in_child=after_fork,
        )
