"""The data arguments of a call, as chunks along the example axis.

A data argument is a `dask.array.Array` (chunked along axis 0; other axes are merged
into one chunk) or a list of Dask futures or delayed values, one per chunk. `split_data`
lines the arguments up chunk by chunk and says what each chunk must look like.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
from dask.delayed import Delayed
from distributed import Future

from fastgrad.dask.tasks import ChunkInfo


@dataclass
class Chunked:
    """The data arguments split into chunks: `pieces[i]` holds chunk i of every argument
    (Dask futures or delayed values), `infos[i]` where it is and what it must look like."""

    pieces: list[list[Any]]
    infos: list[ChunkInfo]


def is_data(arg: Any) -> bool:
    """Whether an argument is chunked data rather than a value sent to every worker."""
    if isinstance(arg, da.Array):
        return True
    return (
        isinstance(arg, list) and len(arg) > 0 and all(isinstance(p, Future | Delayed) for p in arg)
    )


def _array_pieces(name: str, arr: da.Array) -> tuple[list[Any], tuple[int, ...]]:
    if arr.ndim == 0:
        raise ValueError(f"data argument {name} is a 0-d dask array; data needs a row axis")
    if any(len(c) > 1 for c in arr.chunks[1:]):
        # Each chunk holds whole examples: merge the other axes into one chunk.
        arr = arr.rechunk({axis: -1 for axis in range(1, arr.ndim)})
    if any(c != c for c in arr.chunks[0]):
        raise ValueError(
            f"data argument {name} has unknown chunk sizes; compute them first with "
            f"{name}.compute_chunk_sizes()"
        )
    return list(arr.to_delayed().ravel()), arr.chunks[0]


def split_data(names: Sequence[str], args: Sequence[Any]) -> Chunked:
    """Line the data arguments up chunk by chunk (they must have the same chunks)."""
    columns: list[list[Any]] = []
    expected: list[tuple[str, tuple[int, ...]] | None] = []
    sizes: tuple[int, ...] | None = None
    sizes_from = ""
    counts = []
    for name, arg in zip(names, args, strict=True):
        if isinstance(arg, da.Array):
            pieces, rows = _array_pieces(name, arg)
            expected.append((str(arg.dtype), tuple(arg.shape[1:])))
            if sizes is None:
                sizes, sizes_from = rows, name
            elif rows != sizes:
                raise ValueError(
                    f"data arguments {sizes_from} and {name} are chunked differently along "
                    f"the rows ({_short(sizes)} and {_short(rows)}); rechunk one like the "
                    f"other, e.g. {name} = {name}.rechunk({{0: {sizes_from}.chunks[0]}})"
                )
        else:
            pieces = list(arg)
            expected.append(None)
        columns.append(pieces)
        counts.append(f"{name}: {len(pieces)}")
    if len({len(c) for c in columns}) > 1:
        raise ValueError(
            "data arguments must have the same number of chunks, got " + ", ".join(counts)
        )
    starts: list[int | None]
    if sizes is None:
        starts = [None] * len(columns[0])
    else:
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
    infos = [ChunkInfo(i, s, tuple(expected)) for i, s in enumerate(starts)]
    pieces = [list(chunk) for chunk in zip(*columns, strict=True)]
    if sizes is not None:  # empty chunks add nothing; leave them out
        keep = [i for i, n in enumerate(sizes) if n > 0]
        pieces, infos = [pieces[i] for i in keep], [infos[i] for i in keep]
    if not pieces:
        raise ValueError("the data has no rows")
    return Chunked(pieces, infos)


def _short(sizes: tuple[int, ...]) -> str:
    shown = ", ".join(map(str, sizes[:4]))
    return f"({shown}{', ...' if len(sizes) > 4 else ''})"
