"""The first tier's reductions over a few trailing elements (runtime.numpy_tier and
runtime.numpy_blocks): as ufunc calls over strided slices rather than NumPy's reduce.

NumPy reduces a short last axis one output at a time, with its per-output overhead: the
sum over the last axis of a (16384, 8, 2) float32 block took 1.92 ms against 0.05 ms as
`x[..., 0] + x[..., 1]`, and over a length-8 axis 0.08 against 0.01 ms. Bench M4's first
call (a Gaussian mixture over (10^6, 8, 2)) spent most of its 1.2 s of CPU in such
reductions. The slices are added (multiplied, compared) in order, one ufunc call each;
NumPy sums a short row in another order, so the sums' last bits may differ, within the
tolerance the tiers keep (tests/test_tiers.py). Maximum and minimum propagate nan as
np.max and np.min do.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

# Trailing elements reduced per output, at most: past this, NumPy's reduce costs about
# what one ufunc call per element does.
SHORT = 16
# Outputs, at least: below this a few NumPy calls cost more than the reduce itself.
MANY = 1024
_UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


@functools.cache
def tier_impl(name: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    """What the first tier calls for op `name` (its NumPy reference `impl`): for a
    reduction, `impl` with the short-trailing-axes path in front; else `impl` itself. One
    function per op (a plan's tier built again, from stored tables, calls the same ones)."""
    ufunc = _UFUNCS.get(name)
    if ufunc is None:
        return impl
    short: dict[tuple[Any, ...], bool] = {}  # (shape, axis): whether `_short` takes it

    def reduce(x: Any, *, axis: tuple[int, ...], keepdims: bool) -> Any:
        if type(x) is not np.ndarray or x.dtype.kind != "f":
            fast = _short(ufunc, x, axis, keepdims)
            return impl(x, axis=axis, keepdims=keepdims) if fast is None else fast
        key = (x.shape, axis)
        by_slices = short.get(key)
        if by_slices is None:
            if len(short) > 4096:  # (a process tracing ever new shapes)
                short.clear()
            by_slices = short[key] = _slices(x.shape, axis) is not None
        if by_slices:
            return _short(ufunc, x, axis, keepdims)
        # What np.sum (max, min, prod) calls for an ndarray, without its Python layers
        # (~1.5 us of 400 reductions in the T=200 RNN's first call): the same bits.
        return ufunc.reduce(x, axis=axis, keepdims=keepdims)

    return reduce


def _short(ufunc: np.ufunc, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    """`ufunc` reduced over `axis` of float array `x` by slices, where those axes are
    its last ones, 2 to SHORT elements per output and at least MANY outputs; else None.

    >>> x = np.arange(24.0).reshape(3, 4, 2)
    >>> x = np.concatenate([x] * 400)
    >>> bool(np.array_equal(_short(np.add, x, (2,), False), np.sum(x, axis=2)))
    True
    >>> _short(np.maximum, x, (1, 2), True).shape
    (1200, 1, 1)
    """
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
        return None
    form = _slices(x.shape, axis)
    if form is None:
        return None
    kept, length = form
    rows = x.reshape(*kept, length)
    out = ufunc(rows[..., 0], rows[..., 1])
    for j in range(2, length):
        ufunc(out, rows[..., j], out=out)
    return out.reshape(*kept, *[1] * (x.ndim - len(kept))) if keepdims else out


def _slices(shape: tuple[int, ...], axis: tuple[int, ...]) -> tuple[Any, int] | None:
    """(the kept shape, elements per output) where `_short` reduces an array of `shape`
    over `axis` by slices: those axes its last ones, 2 to SHORT elements per output and at
    least MANY outputs; else None."""
    rank = len(shape)
    if not axis:
        return None
    axes = sorted(a % rank for a in axis) if rank else []
    if axes != list(range(rank - len(axes), rank)):
        return None
    kept = shape[: rank - len(axes)]
    length, outputs = math.prod(shape[rank - len(axes) :]), math.prod(kept)
    if not 2 <= length <= SHORT or outputs < MANY:
        return None
    return kept, length
