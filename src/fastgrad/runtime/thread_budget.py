"""How many threads a plan's parts may use: Numba's count, and whether a plan's matrix
products run on one BLAS thread so that BLAS's spinning threads do not fight its parallel
kernels (or another process) for the cores."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.ir import Graph
from fastgrad.runtime import numba_load
from fastgrad.runtime.blas import BAND_ALIGN

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
    return usable_cpus()


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


Products = tuple[tuple[tuple[int, ...], int], ...]


def products(graph: Graph) -> Products:
    """Each matmul's output shape and the multiply-adds of its single product (0 for one
    with a 1-D operand), in the graph's order (what `shares_cores` reads of a graph, which
    a plan read from disk has stored: runtime.build_tables)."""
    return tuple(
        (
            n.out.aval.shape,
            n.out.aval.shape[-2] * n.out.aval.shape[-1] * n.inputs[0].aval.shape[-1]
            if len(n.out.aval.shape) >= 2 and len(n.inputs[0].aval.shape) >= 2
            else 0,
        )
        for n in graph.nodes
        if n.op.name == "matmul"
    )


def shares_cores(plan: Sequence[Any], matmuls: Products) -> bool:
    """Whether the plan's matmuls run on one BLAS thread: all of them matrix-matrix
    products, and either the plan interpreter cuts the big ones across the cores itself
    (`cuts_products`), or the plan runs parallel kernels between products of at most
    MIDSIZE_GEMM multiply-adds each. Two thread pools that each wait for work by spinning
    fight over the same cores: the transformer block (bench M2, f32, 2 threads) spent
    121 ms of CPU time per call with both, 21 ms with BLAS on one thread, 18 ms on one
    thread for all (on the loaded 2-core development machine; its quiet run: 67.8 ms a
    call, 3.3x its one-thread CPU time); and BLAS's own threads, beside a core another
    process keeps busy, stalled M2 ~50x. Matrix-vector products (bandwidth-bound, where
    BLAS's threads pay) keep BLAS's threads, and so do plans with a product above
    MIDSIZE_GEMM the interpreter does not cut (one matrix whose C is not a multiple of
    BAND_ALIGN wide). `matmuls`: the plan's graph's `products`."""
    if not matmuls or not all(len(s) >= 2 and min(s[-2:]) > 1 for s, _ in matmuls):
        return False
    if cuts_products() and all(
        len(s) > 2 and math.prod(s[:-2]) > 1 or s[-1] % BAND_ALIGN == 0
        for s, size in matmuls
        if size > MIDSIZE_GEMM
    ):
        return True
    return (
        any(getattr(s, "parallel", False) for s in plan)  # parallel kernels
        and max(size for _, size in matmuls) <= MIDSIZE_GEMM
    )


def cuts_products() -> bool:
    """Whether the plan interpreter cuts big products across the cores with BLAS on one
    thread (runtime.gemm_split): it runs the plans ("vm", `config.cut_products` on), on
    Linux (POSIX semaphores), with NumPy's OpenBLAS, whose thread count can be set per
    thread, in a process that may run on two CPUs or more (on one, the worker would only
    take turns with the calling thread)."""
    from fastgrad.core.config import config
    from fastgrad.runtime.blas import blas_address, has_local_threads

    return (
        config.runtime == "vm"
        and config.cut_products
        and sys.platform.startswith("linux")
        and usable_cpus() >= 2
        and has_local_threads()
        and blas_address("gemm", np.dtype(np.float32)) is not None
    )
