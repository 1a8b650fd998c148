"""Data-parallel gradients on a Dask cluster (the optional extra `fastgrad[dask]`).

`fastgrad.dask.value_and_grad(fun)` evaluates `fun` and its gradient on every chunk of
the data where the chunk lives, and adds the results up with a tree reduction. Nothing
else in fastgrad imports Dask. docs/distributed.md has the deployment and cost notes.
"""

from fastgrad.dask.gradients import DataParallel, value_and_grad
from fastgrad.dask.tasks import ChunkError

__all__ = ["ChunkError", "DataParallel", "value_and_grad"]
