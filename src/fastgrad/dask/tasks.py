"""What runs on the workers: one chunk's value and gradient, and the sum of several.

`evaluate_chunk` checks a chunk, runs the jitted value-and-gradient on it and returns a
`Partial` (sums weighted by the chunk's row count for means); `combine` adds partials up.
Errors name the chunk (index and rows), never just the worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastgrad.core.pytree import flatten


class ChunkError(ValueError):
    """A chunk of the data could not be used: wrong shape or dtype, NaN or inf, or the
    function failed on it. The message names the chunk and its rows.

    >>> import dask.array as da, fastgrad.dask
    >>> from distributed import Client, LocalCluster
    >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> x = da.from_array(np.array([1.0, 2.0, 3.0, np.nan]), chunks=2)
    >>> fastgrad.dask.value_and_grad(lambda w, x: fnp.mean(x * w))(1.0, x)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    fastgrad.dask.tasks.ChunkError: chunk 1 (rows 2 to 3): x holds NaN or inf at row 1 ...
    >>> client.close(); cluster.close()
    """


@dataclass(frozen=True)
class Step:
    """What every chunk of one call needs; scattered once per call to every worker.

    `fun` is `jit(value_and_grad(user_fun, argnums, has_aux))`; `args` holds the
    parameters and constant arguments, with None where a data argument goes
    (`data_slots`, named `data_names`).
    """

    fun: Any
    args: tuple[Any, ...]
    data_slots: tuple[int, ...]
    data_names: tuple[str, ...]
    has_aux: bool
    mean: bool


@dataclass(frozen=True)
class ChunkInfo:
    """Where a chunk sits: its index, its first row (None if unknown) and, per data
    argument, the (dtype, trailing shape) it must have (None if unknown)."""

    index: int
    start: int | None
    expected: tuple[tuple[str, tuple[int, ...]] | None, ...]

    def where(self, rows: int | None = None) -> str:
        if self.start is None or rows is None:
            return f"chunk {self.index}"
        return f"chunk {self.index} (rows {self.start} to {self.start + rows - 1})"


@dataclass(frozen=True)
class Partial:
    """Sums over some chunks: row count, value, aux and gradient leaves (weighted by rows
    for means). `signature` is the data's (dtype, trailing shape) per argument and
    `first` the chunk it was taken from; both let `combine` catch mismatched chunks."""

    rows: int
    value: Any
    aux: list[Any] | None
    grads: list[Any] | None
    signature: tuple[tuple[str, tuple[int, ...]], ...]
    first: int
    aux_tree: Any = None


def _signature(block: np.ndarray) -> tuple[str, tuple[int, ...]]:
    return str(block.dtype), tuple(block.shape[1:])


def _describe(sig: tuple[str, tuple[int, ...]]) -> str:
    return f"dtype {sig[0]}, rows of shape {sig[1]}"


def _check_blocks(step: Step, info: ChunkInfo, blocks: list[np.ndarray]) -> int:
    """The chunk's row count, after checking every block's rank, rows, dtype and shape."""
    for name, block in zip(step.data_names, blocks, strict=True):
        if block.ndim == 0:
            raise ChunkError(f"{info.where()}: {name} is a scalar; data chunks need a row axis")
    rows = {len(b) for b in blocks}
    if len(rows) > 1:
        counts = ", ".join(
            f"{n} has {len(b)}" for n, b in zip(step.data_names, blocks, strict=True)
        )
        raise ChunkError(f"{info.where()}: the data arguments differ in row count ({counts})")
    n = rows.pop()
    for name, block, want in zip(step.data_names, blocks, info.expected, strict=True):
        got = _signature(block)
        if want is not None and got != want:
            raise ChunkError(
                f"{info.where(n)}: {name} has {_describe(got)}, expected {_describe(want)} "
                "like the rest of the array"
            )
    return n


def _first_bad_row(block: np.ndarray) -> int | None:
    if not np.issubdtype(block.dtype, np.inexact):
        return None
    finite = np.isfinite(block).reshape(len(block), -1).all(axis=1)
    bad = np.flatnonzero(~finite)
    return int(bad[0]) if len(bad) else None


def _check_finite(step: Step, info: ChunkInfo, blocks: list[np.ndarray], leaves: list[Any]) -> None:
    """A NaN or inf result caused by the chunk's data is an error naming the first bad row.

    With finite data a non-finite result comes from the parameters or the function
    itself, as it would in one process, and is returned as it is.
    """
    if all(np.isfinite(leaf).all() for leaf in leaves if np.issubdtype(leaf.dtype, np.inexact)):
        return
    for name, block in zip(step.data_names, blocks, strict=True):
        row = _first_bad_row(block)
        if row is not None:
            at = f"row {row} of the chunk" + (
                "" if info.start is None else f" (row {info.start + row} of {name})"
            )
            raise ChunkError(
                f"{info.where(len(block))}: {name} holds NaN or inf at {at}, so the value or "
                "gradient is not finite; clean or drop those rows"
            )


def evaluate_chunk(step: Step, info: ChunkInfo, *blocks: Any, settle: bool = False) -> Partial:
    """The value and gradient of one chunk, as sums weighted by its rows for means. With
    `settle` (`DataParallel.warmup`), first compile or load every kernel the call needs
    and wait for them (`Jitted.compile`), so that the worker's next calls run compiled
    and no compile is still under way when the worker is told to stop (a restart)."""
    arrays = [np.asarray(b) for b in blocks]
    n = _check_blocks(step, info, arrays)
    signature = tuple(_signature(b) for b in arrays)
    if n == 0:  # nothing to add; a mean over no rows would be NaN
        return Partial(0, None, None, None, signature, info.index)
    args = list(step.args)
    for slot, block in zip(step.data_slots, arrays, strict=True):
        args[slot] = block
    try:
        if settle:
            step.fun.compile(*args)
        out, grads = step.fun(*args)
    except Exception as exc:
        raise ChunkError(f"{info.where(n)}: {type(exc).__name__}: {exc}") from exc
    value, aux = out if step.has_aux else (out, None)
    grad_leaves = flatten(grads)[0]
    aux_leaves, aux_tree = flatten(aux) if step.has_aux else (None, None)
    _check_finite(step, info, arrays, [value, *grad_leaves])
    if step.mean:  # sums of chunk means times rows add up to the total's mean times rows
        weight = np.asarray(n)
        value = _scaled(value, weight)
        grad_leaves = [_scaled(g, weight) for g in grad_leaves]
        aux_leaves = None if aux_leaves is None else [_scaled(a, weight) for a in aux_leaves]
    return Partial(n, value, aux_leaves, grad_leaves, signature, info.index, aux_tree)


def _scaled(leaf: Any, weight: np.ndarray) -> Any:
    leaf = np.asarray(leaf)
    if np.issubdtype(leaf.dtype, np.inexact):
        return leaf * weight.astype(leaf.dtype)  # keeps float32 float32
    return leaf * weight


def combine(*partials: Partial) -> Partial:
    """The sum of partials, after checking that their chunks agree in dtype and shape."""
    filled = [p for p in partials if p.rows]
    base = min(partials, key=lambda p: p.first)
    for p in partials:
        if p.signature != base.signature:
            diffs = [
                f"{_describe(a)} in chunk {p.first} but {_describe(b)} in chunk {base.first}"
                for a, b in zip(p.signature, base.signature, strict=True)
                if a != b
            ]
            raise ChunkError("chunks disagree: " + "; ".join(diffs))
    if not filled:
        return base
    total = filled[0]
    for p in filled[1:]:
        total = Partial(
            total.rows + p.rows,
            total.value + p.value,
            _add_leaves(total.aux, p.aux, "aux", p.first),
            _add_leaves(total.grads, p.grads, "gradient", p.first),
            base.signature,
            base.first,
            total.aux_tree,
        )
    return Partial(
        total.rows, total.value, total.aux, total.grads, base.signature, base.first, total.aux_tree
    )


def _add_leaves(a: list[Any] | None, b: list[Any] | None, what: str, chunk: int) -> Any:
    if a is None or b is None:
        return None
    for x, y in zip(a, b, strict=True):
        if np.shape(x) != np.shape(y):
            raise ChunkError(
                f"chunk {chunk} gave an {what} leaf of shape {np.shape(y)} where the other "
                f"chunks gave {np.shape(x)}; {what} leaves must have one shape to be added up"
            )
    return [x + y for x, y in zip(a, b, strict=True)]
