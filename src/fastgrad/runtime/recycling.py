"""The memory of large fresh outputs, kept from call to call and handed out again once
nothing else holds it.

What a call returns is always fresh: it never shares memory with anything the caller
holds. A fresh large array costs its first touch, though: the kernel writing it faults in
every page and the kernel zeroes it (a reduction over (10^6, 8, 2) float64 into a fresh
64 MB output: ~300 faults and 4-8 ms of system time a call, as much as its 5 ms of
compute; W1's 160 MB of gradients, ~16 ms of its ~90 ms). malloc keeps freed blocks for
reuse only below 32 MB; larger ones go back to the system at once.

So each block of at least `MIN_BYTES` under a fresh output is kept here, and a later
output of the same size takes a block nothing else references: CPython's reference count
of the block (under the GIL) shows only this pool's, and it has no weak reference. Every
array that can reach the memory references the block: the output itself and every NumPy
view of it (a view's `base` is the array owning the memory, never an intermediate view),
a memoryview, a ctypes or DLPack export, an array another library wraps around it, a
tuple or frame holding any of those. So memory the caller can still reach is never handed
out again, whatever the caller did with it; once it can no longer reach it, no one can
see the memory change. (A raw address taken with `.ctypes.data` and kept as an integer
is no reference: such an address is valid only while the array lives, as always.) As
NumPy's own temporary elision reasons, a count is exact only with the GIL: on a
free-threaded Python the pool is off.

A block is new only when no free one of its size is left; it lets go of the free
blocks of other sizes first, so that the pool never adds to a program's peak memory (a
first call whose NumPy temporaries come in several sizes would otherwise keep those of
one size while it allocates another). The pool holds at most `config.output_pool_mb`
megabytes of blocks, those the caller holds included: past it, the oldest go. What it keeps alive
that nobody holds is memory a program no longer sees: `release()` (`fg.release_buffers()`)
lets it all go, and `output_pool_mb = 0` turns the pool off.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from typing import Any

import numpy as np

from fastgrad.core.config import config

# Smaller blocks come back from malloc's free lists without page faults (measured: a
# fresh 8 MB array costs nothing more than a reused one here; 32 MB and above fault).
MIN_BYTES = 1 << 20


def _count(blocks: list[np.ndarray] | dict[Any, np.ndarray], k: Any) -> int:
    """The reference count of `blocks[k]`, read the way `take` reads it."""
    return sys.getrefcount(blocks[k])


# The count of a block only the pool's list holds (the list's reference and the call's).
_ALONE = _count([np.empty(1)], 0)
_FREE_THREADED = not getattr(sys, "_is_gil_enabled", lambda: True)()


def unheld(blocks: list[np.ndarray] | dict[Any, np.ndarray], k: Any) -> bool:
    """Whether nothing but the container `blocks` (a list or a dict) references
    `blocks[k]`, weakly either: its memory may be written again unseen (never on a
    free-threaded Python, whose counts are not exact)."""
    return (
        not _FREE_THREADED
        and _count(blocks, k) == _ALONE
        and not weakref.getweakrefcount(blocks[k])
    )


class Pool:
    """Blocks of fresh outputs by size, each with the stamp of its last hand-out."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocks: dict[int, list[np.ndarray]] = {}
        self.stamps: dict[int, int] = {}  # id of a block -> when it was last handed out
        self.clock = itertools.count()
        self.held = 0  # bytes of the blocks kept

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 array of `nbytes` bytes that nothing else references: a kept block
        nobody holds, or a new one (kept from now on if it is large enough)."""
        if nbytes < MIN_BYTES or _FREE_THREADED:
            return np.empty(nbytes, np.uint8)
        limit = config.output_pool_mb << 20
        with self.lock:
            if self.held > limit:  # (the setting was lowered)
                self._trim(limit, None)
            if nbytes > limit:
                return np.empty(nbytes, np.uint8)
            blocks = self.blocks.setdefault(nbytes, [])
            for k in range(len(blocks)):
                if unheld(blocks, k):
                    block = blocks[k]
                    self.stamps[id(block)] = next(self.clock)
                    return block
            # None free: let go of free blocks of other sizes first, so that what the pool
            # keeps never adds to a call's peak (M4's first call on NumPy, temporaries of
            # several sizes: 244 -> 381 MB kept free blocks of one size while it
            # allocated another)
            self._forget_free(nbytes)
            block = np.empty(nbytes, np.uint8)
            blocks = self.blocks.setdefault(nbytes, [])
            blocks.append(block)
            self.stamps[id(block)] = next(self.clock)
            self.held += nbytes
            if self.held > limit:
                self._trim(limit, block)
            return block

    def _trim(self, limit: int, keep: np.ndarray | None) -> None:
        """Forget blocks until at most `limit` bytes are kept: first those nobody holds
        (their memory goes back), then those the caller holds (theirs goes when they
        drop them), oldest first; never `keep`."""
        order = []
        for size, blocks in self.blocks.items():
            for k in range(len(blocks)):
                alone = _count(blocks, k) == _ALONE
                order.append((not alone, self.stamps[id(blocks[k])], size, blocks[k]))
        order.sort(key=lambda entry: entry[:2])
        for _, _, size, block in order:
            if self.held <= limit:
                break
            if block is not keep:
                self._forget(size, block)

    def _forget_free(self, size: int) -> None:
        """Forget the blocks nobody holds, except those of `size` bytes."""
        for other, blocks in list(self.blocks.items()):
            if other != size:
                for k in range(len(blocks) - 1, -1, -1):
                    if unheld(blocks, k):
                        self._forget(other, blocks[k])

    def _forget(self, size: int, block: np.ndarray) -> None:
        blocks = self.blocks[size]
        # by identity: list.remove would ask ndarray's == of the blocks before it
        del blocks[next(k for k, b in enumerate(blocks) if b is block)]
        del self.stamps[id(block)]
        self.held -= size
        if not blocks:
            del self.blocks[size]

    def release(self) -> None:
        """Forget every block: memory nobody holds goes back now, the rest when dropped."""
        with self.lock:
            self.blocks.clear()
            self.stamps.clear()
            self.held = 0


POOL = Pool()
take = POOL.take


def release() -> None:
    """Let go of every block kept (`fg.release_buffers()`)."""
    POOL.release()
