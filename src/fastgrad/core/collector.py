"""No full garbage collections while fastgrad prepares a function (tracing, autodiff,
simplification, partitioning, planning).

Preparing a long program makes many objects that live until it is done: each full
collection walks all of them, and the collector starts one every so many young
collections, so preparation time would grow with the square of the program's length.
Young collections go on as usual: short-lived cycles are still freed at once.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

# Young collections before a full one, while paused: in practice never.
_NEVER = 1 << 30

_lock = threading.Lock()
_depth = 0  # preparations under way, in all threads
_saved: tuple[int, ...] = ()


@contextlib.contextmanager
def no_full_collections() -> Iterator[None]:
    """Within the block, the collector makes no full collection (in any thread); the
    thresholds it had come back when the last such block, in any thread, ends."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            if len(_saved) >= 3 and _saved[0] > 0:
                gc.set_threshold(_saved[0], _saved[1], _NEVER)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and gc.get_threshold()[2:3] == (_NEVER,):
                gc.set_threshold(*_saved)
