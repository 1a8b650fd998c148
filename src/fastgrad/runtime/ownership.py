"""What a jitted function's caller receives is its own: outputs that are arguments, or
views of them, are copied at each call.

NumPy arrays are mutable: had `jit(lambda x: x.T)(a)` returned a view of `a`, a caller
writing into the result would change its argument, and one writing into its argument
would change a result it kept. JAX returns new (immutable) arrays for the same programs;
torch.compile returns the argument itself, as PyTorch's eager mode does. fastgrad's
outputs are otherwise always fresh arrays (runtime.arena), so these are too: a copy,
whose cost is that of the bytes returned, paid only by plans that return an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def borrowed(views: Iterable[tuple[int, int]], inputs: int) -> set[int]:
    """The slots holding an argument (the first `inputs` slots) or a view of one, given
    the plan's views as (input slot, output slot) in the order they run."""
    slots = set(range(inputs))
    for source, out in views:
        if source in slots:
            slots.add(out)
    return slots


def owned(outs: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """`outs` with each array that may share memory with an array in `args` copied: for
    the reference interpreter (`jit(fuse=False)`), whose plan is not known in advance."""
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    return [
        np.array(o, copy=True)
        if isinstance(o, np.ndarray) and any(np.may_share_memory(o, a) for a in arrays)
        else o
        for o in outs
    ]
