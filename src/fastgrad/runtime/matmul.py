"""Matmul plan steps, and the fold of sums of matmuls into BLAS accumulation.

A sum of matrix products that nothing else reads, such as a weight's gradient summed
over the steps of an unrolled loop (`dW = h0.T @ g0 + h1.T @ g1 + ...`), becomes one
buffer that the first product writes and every other product adds into (gemm with
beta = 1): the elementwise add steps, and the products' own buffers, are gone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from fastgrad.runtime import blas
from fastgrad.runtime.arena import staggered_empty

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class MatmulStep:
    """BLAS through NumPy, writing into a preallocated output when it has one; with
    `accumulate`, adding its product into the output slot's current value instead."""

    ins: list[int]
    out: int
    shape: tuple[int, ...]
    dtype: np.dtype
    buffer: int | None = None  # the slot of the preallocated output, or None: fresh
    accumulate: bool = False
    # Run by `run` in an arena's first call, bound at the next (runtime.arena's `_later`).
    binds_later = True

    def run(self, env: list[Any]) -> None:
        a, b = env[self.ins[0]], env[self.ins[1]]
        if self.accumulate:
            blas.accumulate(a, b, env[self.out])
        elif self.buffer is None:
            env[self.out] = np.matmul(a, b, out=staggered_empty(self.shape, self.dtype, 0))
        else:
            np.matmul(a, b, out=env[self.buffer])

    def prepare(self, env: list[Any], static: AbstractSet[int]) -> Callable[[], None]:
        """The matmul with its operands and output bound when they are fixed buffers."""
        if self.buffer is None or not all(slot in static for slot in self.ins):
            return partial(self.run, env)
        a, b, out = env[self.ins[0]], env[self.ins[1]], env[self.buffer]
        if self.accumulate:
            return blas.bind(a, b, out)
        return partial(np.matmul, a, b, out=out)


def fold_accumulations(plan: Sequence[Any], fresh: AbstractSet[int]) -> list[Any]:
    """`plan` without the adds of 2-D matmul products that only the add reads (nor of
    sums of them): the products write the add's slot, the first in plan order plainly
    and the others accumulating into it.

    An add whose result the caller receives (a slot in `fresh`, allocated at each call)
    stays: the sum before it accumulates in a preallocated buffer, which the add reads
    as it writes the fresh array. Products of arguments and views of them (whose
    addresses change from call to call: an unrolled loop's `xs[t].T @ g_t`) fold too:
    the plan interpreter reads their addresses at each call in compiled code, and only
    the step runner (the reference) finds them with ctypes (~1.4 us each). Bench M1,
    one thread, CPU time of the call, median of 60 alternating in one process (load
    ~14): 1.05x faster in float32 and float64 (49 add loops of (64, 128) gone)."""
    readers: Counter[int] = Counter(fresh)
    for step in plan:
        readers.update({*step.ins, *getattr(step, "checks", ())})
    # slot -> the matmuls whose products sum to its value (all of one dtype). A fold
    # merges its terms' groups into the largest and every product learns its slot at the
    # end: re-targeting and copying each group at each fold was quadratic in an unrolled
    # loop's length (the T-th add of a weight's gradient moved T products).
    writers = {
        s.out: [s]
        for s in plan
        if isinstance(s, MatmulStep) and len(s.shape) == 2 and s.dtype in _FLOATS
    }
    kept = []
    for step in plan:
        terms = _summed_slots(step)
        if (
            terms
            and step.outs[0] not in fresh
            and all(readers[s] == 1 and s in writers for s in terms)
            and all(writers[s][0].dtype == step.loop.nodes[-1].out.aval.dtype for s in terms)
        ):
            parts = [writers.pop(s) for s in terms]
            group = max(parts, key=len)
            for part in parts:
                if part is not group:
                    group.extend(part)
            writers[step.outs[0]] = group
            continue
        kept.append(step)
    order = {id(s): i for i, s in enumerate(plan)}
    for slot, group in writers.items():
        group.sort(key=lambda s: order[id(s)])
        for k, w in enumerate(group):
            w.out = slot
            w.accumulate = k > 0
    return kept


def _summed_slots(step: Any) -> list[int] | None:
    """The slots a kernel step sums, when all it does is add distinct 2-D arrays of its
    output's shape, each once (no broadcasting, no constants)."""
    loop = getattr(step, "loop", None)
    if loop is None or any(n.op.name != "add" for n in loop.nodes):
        return None
    if len(step.outs) != 1 or step.scalars or len(set(step.ins)) != len(loop.nodes) + 1:
        return None
    shape = loop.nodes[-1].out.aval.shape
    if len(shape) != 2 or any(v.aval.shape != shape for n in loop.nodes for v in n.inputs):
        return None
    uses = Counter(id(v) for n in loop.nodes for v in n.inputs)
    if any(uses[id(v)] != 1 for v in step.source.inputs):
        return None
    return list(step.ins)
