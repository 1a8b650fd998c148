"""Buffers for a plan's values: one block of preallocated intermediates per arena, and fresh
outputs, both laid out so that no two large buffers start at the same offset modulo 4 KiB.

Loads and stores whose addresses agree in their low 12 bits look alike to the CPU's
store-to-load check ("4K aliasing"): a loop streaming through such arrays ran 3-6x slower
here (a 2^20-element loop: 45 ms against 8 ms with the buffers staggered by 320 bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Every buffer starts on a cache line; successive large ones are pushed a few lines further
# apart, so that a loop reading and writing a dozen of them finds them all at different
# offsets within a page.
ALIGN = 64
STAGGER = 320
PAGE = 4096


def staggered_empty(shape: tuple[int, ...], dtype: np.dtype, k: int) -> np.ndarray:
    """A fresh array for the `k`-th output of a loop, starting `(k + 1) * 320` bytes (modulo
    4 KiB) past a page boundary, where NumPy's large allocations sit.

    >>> a = staggered_empty((1000,), np.dtype(np.float64), 0)
    >>> a.ctypes.data % 64, a.shape
    (0, (1000,))
    """
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes < PAGE:
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + PAGE + ALIGN, np.uint8)
    address = raw.ctypes.data
    start = -address % ALIGN + ((k + 1) * STAGGER - (address + -address % ALIGN)) % PAGE
    return raw[start : start + nbytes].view(dtype).reshape(shape)


@dataclass
class Buffer:
    """A preallocated intermediate: kept in `slot` in the kernel's shape, and in `view_slot`
    in the graph's shape (the same slot when they agree)."""

    slot: int
    shape: tuple[int, ...]
    dtype: np.dtype
    view_slot: int
    view_shape: tuple[int, ...]


class Arena:
    """The values of one call in flight: the slots' template (constants, preallocated
    buffers, and the views of them that never change), and the steps to run."""

    def __init__(
        self,
        template: list[Any],
        buffers: Sequence[Buffer],
        static_views: Sequence[Any],
        runs: Sequence[Callable[[list[Any]], None]],
        outputs: Sequence[int],
    ):
        self.buffers = list(buffers)
        self.static_views = list(static_views)
        self.runs = list(runs)
        self.outputs = list(outputs)
        self.base = template
        self.template: list[Any] | None = None  # filled on first run

    def _fill(self) -> list[Any]:
        template = list(self.base)
        sizes = [int(np.prod(b.shape)) * b.dtype.itemsize for b in self.buffers]
        offsets = []
        end = 0
        for nbytes in sizes:
            start = -end % ALIGN + end
            offsets.append(start)
            end = start + nbytes + (STAGGER if nbytes >= PAGE else 0)
        block = np.empty(end + ALIGN, np.uint8)
        shift = -block.ctypes.data % ALIGN
        for b, start, nbytes in zip(self.buffers, offsets, sizes, strict=True):
            array = block[shift + start : shift + start + nbytes].view(b.dtype).reshape(b.shape)
            template[b.slot] = array
            template[b.view_slot] = array.reshape(b.view_shape)
        for step in self.static_views:
            step.run(template)
        return template

    def fresh(self) -> Arena:
        """An arena with buffers of its own, for a call that runs alongside this one."""
        return Arena(self.base, self.buffers, self.static_views, self.runs, self.outputs)

    def run(self, args: Sequence[Any]) -> list[Any]:
        template = self.template
        if template is None:
            template = self.template = self._fill()
        env = template.copy()
        env[: len(args)] = args
        with np.errstate(all="ignore"):
            for run in self.runs:
                run(env)
        return [env[i] for i in self.outputs]
