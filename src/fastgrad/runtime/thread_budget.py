"""How many threads a plan's parts may use: Numba's count, and whether a plan's matrix
products run on one BLAS thread so that they do not fight its parallel kernels for the
cores."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.ir import Graph
from fastgrad.runtime import numba_load

# The largest matmul (multiply-adds of one product) that `shares_cores` runs on one BLAS
# thread beside parallel kernels: ~2.6 ms on one core in float32.
MIDSIZE_GEMM = 1 << 27


def numba_threads() -> int:
    """The size of Numba's thread pool, read without importing Numba while it is not yet
    imported (a first call on NumPy needs no Numba): NUMBA_NUM_THREADS, else the CPUs this
    process may run on, as Numba counts them.

    >>> numba_threads() >= 1
    True
    """
    numba = numba_load.imported("numba")  # (the compile thread may be importing it)
    if numba is not None:
        return int(numba.config.NUMBA_NUM_THREADS)
    if os.environ.get("NUMBA_NUM_THREADS"):
        return int(os.environ["NUMBA_NUM_THREADS"])
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def largest_gemm(graph: Graph) -> int:
    """Multiply-adds of the largest single product BLAS computes in `graph` (a batched
    matmul is one product per matrix); 0: none."""
    sizes = [
        int(np.prod(n.out.aval.shape[-2:])) * n.inputs[0].aval.shape[-1]
        for n in graph.nodes
        if n.op.name == "matmul" and n.out.aval.ndim >= 2 and n.inputs[0].aval.ndim >= 2
    ]
    return max(sizes, default=0)


def shares_cores(plan: Sequence[Any], graph: Graph) -> bool:
    """Whether the plan runs parallel kernels between matrix-matrix products of at most
    MIDSIZE_GEMM multiply-adds each: then its matmuls run on one BLAS thread, and only
    Numba's threads run in parallel. Two thread pools that each wait for work by spinning
    fight over the same cores: the transformer block (bench M2, f32, 2 threads) spent
    121 ms of CPU time per call with both, 21 ms with BLAS on one thread, 18 ms on one
    thread for all (on the loaded 2-core development machine; its quiet run: 67.8 ms a
    call, 3.3x its one-thread CPU time). Matrix-vector products (bandwidth-bound, where
    BLAS's threads pay) and large products keep BLAS's threads."""
    if not any(getattr(s, "parallel", False) for s in plan):  # parallel kernels
        return False
    products = [n.out.aval.shape for n in graph.nodes if n.op.name == "matmul"]
    return (
        bool(products)
        and all(len(s) >= 2 and min(s[-2:]) > 1 for s in products)
        and largest_gemm(graph) <= MIDSIZE_GEMM
    )
