"""`value_and_grad` over data that lives on a Dask cluster.

One call scatters the parameters (with the jitted function) once to every worker,
evaluates the value and gradient of every chunk on the worker that holds it, adds the
results up in a tree of `combine` tasks, and brings back one value and one gradient.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from dask import delayed
from distributed import Client, get_client
from distributed.client import FutureCancelledError

import fastgrad as fg
from fastgrad.api.grad import check_argnums
from fastgrad.api.trace import name_of, param_names
from fastgrad.core.pytree import flatten, unflatten
from fastgrad.dask.chunks import Chunked, is_data, split_data
from fastgrad.dask.tasks import Partial, Step, combine, evaluate_chunk

REDUCTIONS = ("mean", "sum")

# How many times one call runs when the cluster loses its work (a worker dying with the
# only copy of something the call needs): each attempt scatters and computes afresh.
_ATTEMPTS = 3


class DataParallel:
    """A value-and-gradient function whose data arguments are chunked on a Dask cluster
    (see `value_and_grad`).

    >>> import dask.array as da, fastgrad.dask
    >>> from distributed import Client, LocalCluster
    >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> step = fastgrad.dask.value_and_grad(lambda w, x: fnp.sum(x * w), reduce="sum")
    >>> x = da.arange(6.0, chunks=2)
    >>> len(step.warmup(1.0, x))  # compiled on every worker (here one) before the first step
    1
    >>> step(2.0, x)  # the sum of 2 x over x's three chunks, and its gradient in w
    (array(30.), array(15.))
    >>> client.close(); cluster.close()
    """

    def __init__(
        self,
        fun: Callable[..., Any],
        argnums: int | Sequence[int],
        has_aux: bool,
        reduce: str,
        split_every: int,
        client: Client | None,
    ):
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
        if not isinstance(split_every, int) or split_every < 2:
            raise ValueError(f"split_every must be an int of at least 2, got {split_every!r}")
        self.fun = fun
        self.argnums = argnums
        self.has_aux = has_aux
        self.reduce = reduce
        self.split_every = split_every
        self.client = client
        # Built once: its token lets every worker keep one traced, compiled copy.
        self.chunk_fun = fg.jit(fg.value_and_grad(fun, argnums=argnums, has_aux=has_aux))

    def _client(self) -> Client:
        if self.client is not None:
            return self.client
        try:
            return get_client()
        except ValueError:
            raise ValueError(
                f"fastgrad.dask.value_and_grad({name_of(self.fun)}) needs a Dask client: "
                "create one first (distributed.Client(...)) or pass client="
            ) from None

    def _prepare(self, args: tuple[Any, ...], client: Client) -> tuple[Any, Chunked, Any]:
        """The scattered step, the chunked data and the gradients' tree structure."""
        nums = check_argnums(self.argnums, len(args), self.fun)
        names = param_names(self.fun, len(args))
        slots = tuple(i for i, a in enumerate(args) if i not in nums and is_data(a))
        for i in nums:
            if is_data(args[i]):
                raise TypeError(
                    f"argument {names[i]} is differentiated but is chunked data; parameters "
                    "must be NumPy arrays or pytrees of them"
                )
        if not slots:
            raise TypeError(
                f"no data argument: pass at least one dask array, or list of Dask futures or "
                f"delayed values (one per chunk), to {name_of(self.fun)}"
            )
        data_names = tuple(names[i] for i in slots)
        chunked = split_data(data_names, [args[i] for i in slots])
        step = Step(
            self.chunk_fun,
            tuple(None if i in slots else a for i, a in enumerate(args)),
            slots,
            data_names,
            self.has_aux,
            self.reduce == "mean",
        )
        [shared] = client.scatter([step], broadcast=True, hash=False)
        diff = args[nums[0]] if isinstance(self.argnums, int) else tuple(args[i] for i in nums)
        return shared, chunked, flatten(diff)[1]

    def __call__(self, *args: Any) -> Any:
        client = self._client()
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                total, grad_tree = self._sum_chunks(args, client)
                break
            except FutureCancelledError as exc:
                # The scheduler gives up on work whose inputs died with a worker (the
                # scattered step, say) instead of recomputing it: scatter and run again.
                if attempt == _ATTEMPTS:
                    raise
                warnings.warn(
                    f"fastgrad.dask.value_and_grad({name_of(self.fun)}): the cluster lost "
                    f"work during the call ({exc}); running it again "
                    f"(attempt {attempt + 1} of {_ATTEMPTS})",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self._finish(total, grad_tree)

    def _sum_chunks(self, args: tuple[Any, ...], client: Client) -> tuple[Partial, Any]:
        shared, chunked, grad_tree = self._prepare(args, client)
        tasks = _chunk_tasks(shared, chunked, range(len(chunked.infos)))
        # A tree of sums, in chunk order, so the same chunks give the same bits wherever
        # they ran and however often a task was retried.
        level = tasks
        while len(level) > 1:
            level = [
                delayed(combine, pure=False)(*level[i : i + self.split_every])
                for i in range(0, len(level), self.split_every)
            ]
        total: Partial = client.compute(level[0]).result()
        del shared  # the scattered step is released with its last reference
        return total, grad_tree

    def _finish(self, total: Partial, grad_tree: Any) -> Any:
        def averaged(leaf: Any) -> Any:
            leaf = np.asarray(leaf)
            if self.reduce == "sum":
                return leaf
            if np.issubdtype(leaf.dtype, np.inexact):
                return leaf / leaf.dtype.type(total.rows)
            return leaf / total.rows

        value = averaged(total.value)
        grads = unflatten(grad_tree, [averaged(g) for g in total.grads or []])
        if not self.has_aux:
            return value, grads
        aux = unflatten(total.aux_tree, [averaged(a) for a in total.aux or []])
        return (value, aux), grads

    def warmup(self, *args: Any) -> dict[str, float]:
        """Trace and compile on every worker before the first step; seconds per worker.

        Each worker evaluates the first chunk (and the last, when its row count differs),
        so its jitted function is traced and its kernels are compiled or loaded from the
        disk cache, and waits for them (in background mode too, `Jitted.compile`): the
        steps that follow run compiled. Those chunks travel to workers that do not hold
        them, once.
        """
        client = self._client()
        shared, chunked, _ = self._prepare(args, client)
        last = len(chunked.infos) - 1
        picks = [0] if last == 0 else [0, last]
        seconds = {}
        for worker in client.nthreads():
            start = time.perf_counter()
            # Fresh task keys per worker: the scheduler would not run a finished key again.
            for task in _chunk_tasks(shared, chunked, picks, settle=True):
                client.compute(task, workers=[worker], allow_other_workers=False).result()
            seconds[worker] = time.perf_counter() - start
        del shared
        return seconds


def _chunk_tasks(
    shared: Any, chunked: Chunked, indices: Sequence[int], settle: bool = False
) -> list[Any]:
    return [
        delayed(evaluate_chunk, pure=False)(
            shared, chunked.infos[i], *chunked.pieces[i], settle=settle
        )
        for i in indices
    ]


def value_and_grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    reduce: str = "mean",
    *,
    split_every: int = 8,
    client: Client | None = None,
) -> DataParallel:
    """`fun`'s value and gradient over data chunked on a Dask cluster, chunk by chunk.

    Call the result like `fg.value_and_grad(fun)`. The arguments in `argnums` are the
    parameters (NumPy arrays or pytrees of them); every other argument that is a
    `dask.array.Array`, or a list of Dask futures or delayed values (one per chunk), is
    data, chunked along its first axis; the remaining arguments are constants. `fun` is
    evaluated on each chunk, on the worker that holds it, and the results are added up by
    a tree of tasks (`split_every` at a time). With `reduce="mean"`, `fun` returns the mean
    over a chunk's rows and the results are weighted by row count, so the answer is the
    mean over all rows; with `reduce="sum"` they are added. Aux values (`has_aux=True`)
    are reduced the same way. Parameters and constants travel once per call to each
    worker; `.warmup(*args)` compiles on every worker before the first step. A chunk with
    NaN, inf, or the wrong shape or dtype raises `ChunkError` naming it.

    >>> import dask.array as da, fastgrad.numpy as fnp, fastgrad.dask
    >>> from distributed import Client, LocalCluster
    >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> def loss(w, x, y):
    ...     return fnp.mean((x @ w - y) ** 2)
    >>> x, y = da.ones((1000, 3), chunks=(300, 3)), da.zeros(1000, chunks=300)
    >>> value, g = fastgrad.dask.value_and_grad(loss)(np.ones(3), x, y)
    >>> float(value), g
    (9.0, array([6., 6., 6.]))
    >>> client.close(); cluster.close()
    """
    return DataParallel(fun, argnums, has_aux, reduce, split_every, client)
