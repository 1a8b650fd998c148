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


# How the plan interpreter takes a matmul, as `products` finds it: a GEMM row, which the
# cut may cut (runtime.gemm_split); a matrix times its own transpose, which it computes
# with syrk and the cut leaves whole; a product it leaves to NumPy (an operand no BLAS
# call takes without a copy: plan_rows.gemm_row). The last two run whole on one core
# where BLAS runs on one thread, on BLAS's threads otherwise.
GEMM, SYRK, NUMPY = "gemm", "syrk", "numpy"
# Each matmul's output shape, multiply-adds of one of its matrices, dtype's name, and how
# the interpreter takes it (GEMM, SYRK or NUMPY).
Products = tuple[tuple[tuple[int, ...], int, str, str], ...]
# The most multiply-adds of products run whole on one core, as a share of those the cut
# takes, with which a plan still runs BLAS on one thread (`shares_cores`).
WHOLE_SHARE = 0.1


def products(graph: Graph) -> Products:
    """Each matmul's output shape, the multiply-adds of its single product (0 for one
    with a 1-D operand), its dtype and how the interpreter takes it (GEMM, SYRK or NUMPY;
    asked only of products of DEFAULT_MIN_WORK multiply-adds or more, which the cut might
    take: smaller ones say GEMM), in the graph's order (what `shares_cores` reads of a
    graph, which a plan read from disk has stored: runtime.build_tables)."""
    found = []
    layouts: _Layouts | None = None
    for n in graph.nodes:
        if n.op.name != "matmul":
            continue
        shape, a = n.out.aval.shape, n.inputs[0].aval.shape
        size = shape[-2] * shape[-1] * a[-1] if len(shape) >= 2 and len(a) >= 2 else 0
        how = GEMM
        if size * math.prod(shape[:-2]) >= DEFAULT_MIN_WORK:
            layouts = layouts or _Layouts(graph)
            how = layouts.taken(n)
        found.append((shape, size, np.dtype(n.out.aval.dtype).name, how))
    return tuple(found)


class _Layouts:
    """Stand-ins of a graph's values as the plan holds them, their strides and which
    share memory, for `plan_rows.gemm_row` and `gemm_bands.may_be_syrk`, the tests the
    interpreter makes of a product's arrays at run time: a view of the plan (reshape,
    transpose, slice, broadcast_to) as NumPy makes it of its input, any other value a
    C-contiguous array of its own (a kernel's or a product's output; an argument, as most
    are passed). A stand-in is a strided view of one element (never read): no memory."""

    def __init__(self, graph: Graph) -> None:
        from fastgrad.runtime.plan_rows import VIEW_ARG  # (the plan's views)

        self.views = {n.out: n for n in graph.nodes if n.op.name in VIEW_ARG}
        self.arg = VIEW_ARG
        self.made: dict[Any, np.ndarray] = {}

    def taken(self, node: Any) -> str:
        """How the interpreter takes the matmul `node` (GEMM, SYRK or NUMPY)."""
        from fastgrad.runtime.plan_rows import gemm_row

        a, b = (self.of(v) for v in node.inputs)
        row = gemm_row(a, b, _fresh(node.out.aval.shape, node.out.aval.dtype), False)
        if row is None:
            return NUMPY  # (or a dimension of 1: a vector product, never cut either)
        _, (_, ta, tb, m, n, _, lda, ldb, _, beta), offsets = row
        start = (a.__array_interface__["data"][0], b.__array_interface__["data"][0])
        for q in range(offsets[0]):
            pa, pb = start[0] + offsets[1 + 3 * q], start[1] + offsets[2 + 3 * q]
            if gemm_bands.may_be_syrk(pa, pb, m, n, ta, tb, lda, ldb, beta):
                return SYRK
        return GEMM

    def of(self, v: Any) -> np.ndarray:
        x = self.made.get(v)
        if x is None:
            node = self.views.get(v)
            if node is not None:
                x = _view(
                    node.op.name, self.of(node.inputs[0]), self.arg[node.op.name](node.params)
                )
            if x is None:
                x = _fresh(v.aval.shape, v.aval.dtype)
            self.made[v] = x
        return x


def _fresh(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A C-contiguous stand-in of `shape` over one element of its own (never read)."""
    item = np.dtype(dtype).itemsize
    strides = [item * math.prod(shape[i + 1 :]) for i in range(len(shape))]
    one = np.zeros(1, dtype)
    return np.lib.stride_tricks.as_strided(one, shape, strides, writeable=False)


def _view(op: str, x: np.ndarray, arg: Any) -> np.ndarray | None:
    """plan_rows.view of a stand-in, or None where it copies (a reshape NumPy
    cannot make a view: its copy is a fresh C-contiguous array)."""
    if op == "reshape":
        try:
            return x.reshape(arg, copy=False)
        except (ValueError, TypeError):  # a copy (TypeError: NumPy < 2.1, asked not)
            return None
    from fastgrad.runtime.plan_rows import view

    return view(op, x, arg)


def shares_cores(plan: Sequence[Any], matmuls: Products) -> bool:
    """Whether the plan's matmuls run on one BLAS thread: all of them matrix-matrix
    products, and either the plan interpreter cuts across the cores most of the work of
    those it takes (of at least DEFAULT_MIN_WORK multiply-adds each, where it may cut:
    `may_cut`), or the plan runs parallel kernels between products of at most
    MIDSIZE_GEMM multiply-adds each. Two thread pools that each wait for work by spinning
    fight over the same cores: the transformer block (bench M2, f32, 2 threads) spent
    121 ms of CPU time per call with both, 21 ms with BLAS on one thread, 18 ms on one
    thread for all (on the loaded 2-core development machine; its quiet run: 67.8 ms a
    call, 3.3x its one-thread CPU time); and BLAS's own threads, beside a core another
    process keeps busy, stalled M2 ~50x. Matrix-vector products (bandwidth-bound, where
    BLAS's threads pay) keep BLAS's threads, and so do plans without parallel kernels
    whose big products would run whole on one core, as NumPy runs them on its threads:
    the cut refuses a matrix times its own transpose (syrk), a product whose operand
    needs a copy (left to NumPy), and one whose bands would change its bits on this
    machine (runtime.gemm_probe). Where some of a plan's big products are cut and others
    run whole, it runs BLAS on one thread if the whole ones have at most WHOLE_SHARE of
    the cut ones' multiply-adds: on one thread a whole product takes about twice its
    time on BLAS's two, while the cut ran bench W4's products in 0.92x NumPy's time on
    its threads (4.71 against 5.14 ms, quiet): so one thread pays only where the whole
    products' time, at most ~0.09 / 0.91 of the cut ones', is won back there.

    The step runner reads the same answer as the interpreter (`may_cut` does not ask
    which runs the plan): it is the reference whose bits the interpreter's products keep,
    and OpenBLAS's own threads sum some elements in another order than its one thread
    (float32, AVX2 kernels). `matmuls`: the plan's graph's `products`."""
    if not matmuls or not all(len(s) >= 2 and min(s[-2:]) > 1 for s, *_ in matmuls):
        return False
    if may_cut():
        cut = whole = 0
        for s, size, dtype, how in matmuls:
            m, n, batch = s[-2], s[-1], math.prod(s[:-2])
            work = size * batch
            if work < DEFAULT_MIN_WORK:
                continue
            if how == GEMM and cut_pieces(dtype, m, n, size // (m * n), batch) > 1:
                cut += work
            else:
                whole += work
        if whole <= WHOLE_SHARE * cut:
            return True
    return (
        any(getattr(s, "parallel", False) for s in plan)  # parallel kernels
        and max(size for _, size, *_ in matmuls) <= MIDSIZE_GEMM
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
