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
from fastgrad.runtime import gemm_bands, numba_load
from fastgrad.runtime.gemm_bands import (
    CUT_THREADS,
    DEFAULT_MIN_WORK,
    DEFAULT_PIECE_WORK,
    MAX_PIECES,
)

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


# Each matmul's output shape, multiply-adds of one of its matrices, and dtype's name.
Products = tuple[tuple[tuple[int, ...], int, str], ...]


def products(graph: Graph) -> Products:
    """Each matmul's output shape, the multiply-adds of its single product (0 for one
    with a 1-D operand) and its dtype, in the graph's order (what `shares_cores` reads of
    a graph, which a plan read from disk has stored: runtime.build_tables)."""
    return tuple(
        (
            n.out.aval.shape,
            n.out.aval.shape[-2] * n.out.aval.shape[-1] * n.inputs[0].aval.shape[-1]
            if len(n.out.aval.shape) >= 2 and len(n.inputs[0].aval.shape) >= 2
            else 0,
            np.dtype(n.out.aval.dtype).name,
        )
        for n in graph.nodes
        if n.op.name == "matmul"
    )


def shares_cores(plan: Sequence[Any], matmuls: Products) -> bool:
    """Whether the plan's matmuls run on one BLAS thread: all of them matrix-matrix
    products, and either the plan interpreter cuts across the cores every one of them it
    takes (`cut_pieces` > 1 for each of at least DEFAULT_MIN_WORK multiply-adds, where it
    may cut: `may_cut`), or the plan runs parallel kernels between products of at most
    MIDSIZE_GEMM multiply-adds each. Two thread pools that each wait for work by spinning
    fight over the same cores: the transformer block (bench M2, f32, 2 threads) spent
    121 ms of CPU time per call with both, 21 ms with BLAS on one thread, 18 ms on one
    thread for all (on the loaded 2-core development machine; its quiet run: 67.8 ms a
    call, 3.3x its one-thread CPU time); and BLAS's own threads, beside a core another
    process keeps busy, stalled M2 ~50x. Matrix-vector products (bandwidth-bound, where
    BLAS's threads pay) keep BLAS's threads, and so do plans without parallel kernels with
    a product the interpreter would run whole on one core (one whose bands would change
    its bits on this machine: runtime.gemm_probe), as NumPy runs them.

    The step runner reads the same answer as the interpreter (`may_cut` does not ask
    which runs the plan): it is the reference whose bits the interpreter's products keep,
    and OpenBLAS's own threads sum some elements in another order than its one thread
    (float32, AVX2 kernels). `matmuls`: the plan's graph's `products`."""
    if not matmuls or not all(len(s) >= 2 and min(s[-2:]) > 1 for s, _, _ in matmuls):
        return False
    if may_cut() and all(
        cut_pieces(dtype, s[-2], s[-1], size // (s[-2] * s[-1]), math.prod(s[:-2])) > 1
        for s, size, dtype in matmuls
        if size * math.prod(s[:-2]) >= DEFAULT_MIN_WORK
    ):
        return True
    return (
        any(getattr(s, "parallel", False) for s in plan)  # parallel kernels
        and max(size for _, size, _ in matmuls) <= MIDSIZE_GEMM
    )


def cut_pieces(dtype: Any, m: int, n: int, k: int, batch: int = 1) -> int:
    """Into how many pieces the plan interpreter's cut (runtime.gemm_split, its settings
    the defaults) cuts a product of `batch` matrices C (m x n) = A (m x k) @ B (k x n) of
    `dtype` where it may cut (`cuts_products`); 1: it runs it whole (below
    DEFAULT_MIN_WORK multiply-adds, or no band keeps its bits on this machine). The
    cut's own rule (runtime.gemm_bands) with the probe's answer it reads from its state
    (runtime.gemm_probe: once per machine, stored)."""
    if m * n * k * batch < DEFAULT_MIN_WORK:
        return 1
    from fastgrad.runtime import gemm_probe  # (runs NumPy's BLAS: only where asked)

    rule = gemm_bands.rule(gemm_probe.alignments(), int(np.dtype(dtype) == np.float64))
    most = MAX_PIECES if batch > 1 else CUT_THREADS
    return gemm_bands.pieces(m, n, k, batch, most, DEFAULT_PIECE_WORK, rule)[0]


def cuts_products() -> bool:
    """Whether the plan interpreter cuts big products across the cores with BLAS on one
    thread (runtime.gemm_split): it runs the plans ("vm"), where it may (`may_cut`)."""
    from fastgrad.core.config import config

    return config.runtime == "vm" and may_cut()


def may_cut() -> bool:
    """Whether products may be cut across the cores by the plan interpreter, whichever
    runs the plans: `config.cut_products` on, on Linux (POSIX semaphores), with NumPy's
    OpenBLAS, whose thread count can be set per thread, in a process that may run on two
    CPUs or more (on one, the worker would only take turns with the calling thread)."""
    from fastgrad.core.config import config
    from fastgrad.runtime.blas import blas_address, has_local_threads

    return (
        config.cut_products
        and sys.platform.startswith("linux")
        and usable_cpus() >= 2
        and has_local_threads()
        and blas_address("gemm", np.dtype(np.float32)) is not None
    )
