"""The plan interpreter's machine code (runtime.vm), built like kernels: on the background
compile thread, under its watchdog, so that no call waits for it (in sync mode, and for a
plan told to wait, the call waits for the thread, as long as the watchdog lets it):
kernels' adapters, one per kernel signature (scalar dtypes, operands' ranks and dtypes)
whatever the kernel, the kernels' addresses for them, and the interpreter itself for each
new kind of argument tuple; shared by every plan, cached on disk like kernels.

A plan's first call queues its kernels' adapters and the interpreter's loop behind its
kernels (`ahead`): they are built by the time the kernels are, and lowering the plan
finds them ready. This module imports Numba only in its jobs (on the compile thread).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastgrad.compiler.kernel_cache import kernel_key
from fastgrad.core import compile_log
from fastgrad.core.config import config
from fastgrad.runtime import background

_LOCK = threading.Lock()
_JOBS: dict[Any, CompileJob] = {}  # what a job builds -> the job
_AHEAD: set[tuple[Any, ...]] = set()  # kernels whose adapter `ahead` has queued
_LOOP = ("interpreter loop",)  # the key of the interpreter loop's job


def compile_adapter(source: str, tag: str) -> Any:
    """runtime.vm's `compile_adapter`, imported (with Numba) when a job first needs it."""
    from fastgrad.runtime.vm import compile_adapter as compile_now

    return compile_now(source, tag)


@dataclass
class _Source:
    source: str  # what the compile watchdog names and records when a compile hangs


class CompileJob:
    """One piece of the interpreter's machine code to build: the interface of
    background.Job that the compile thread uses (run, drop, done, settled, apart, label,
    source). `build()` returns the object to keep alive and its address (or 0)."""

    apart = False  # never a child process: these compile as fast as a kernel
    later = False  # queued behind every kernel (runtime.background): built ahead

    def __init__(self, label: str, source: str, build: Callable[[], tuple[Any, int]]):
        self.label, self.source, self.build = label, _Source(source), build
        self.address: int | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.settled = threading.Event()
        self._run_lock = threading.Lock()

    def run(self) -> None:
        with self._run_lock:  # once, whichever thread (compile thread, or an inline entry)
            if self.done.is_set():
                return
            start = time.perf_counter()
            try:
                background.load_numba()  # once, without SciPy's linalg package
                self._built, self.address = self.build()
            except Exception as error:  # the plan keeps running its steps one by one
                self.error = error
            seconds = time.perf_counter() - start
            compile_log.log_kernel_ready(self.label, self.error is None, True, seconds)
            self.done.set()
            self.settled.set()

    def drop(self) -> None:
        self.settled.set()

    def forked(self) -> None:
        """In a forked child, before the job is handed to the child's compile thread: the
        parent's compile thread may have held the run lock at the fork (waiting there for
        Numba's compiler lock, runtime.compile_fork), and the child has no such thread."""
        self._run_lock = threading.Lock()


def _job(
    key: Any,
    wait: bool,
    make: Callable[[], CompileJob],
    inline: bool = False,
    later: bool = False,
) -> CompileJob:
    """The job for `key`, made by `make` when first asked for and handed to the compile
    thread (`later`: once the first call under way has handed over its kernels, and
    behind them all); with `wait`, waited for there, under
    the watchdog (a compile that runs past `config.compile_timeout` leaves the job settled
    but not done: its plan runs step by step). `inline` jobs compile nothing, take no
    compiler lock and run here at once."""
    with _LOCK:
        job = _JOBS.get(key)
        new = job is None
        if new:
            job = _JOBS[key] = make()
            job.later = later
    assert job is not None
    if inline:
        job.run()  # nothing to do if done already
    elif new:
        (background.submit_after if later else background.submit)(job)
    if wait:
        background.wait_for(job)
    return job


def adapter(source: str, wait: bool, later: bool = False) -> CompileJob:
    """The job building the adapter `source` (one per kernel signature, serving every
    kernel of it), its machine code cached under a key of the source."""

    def build() -> tuple[Any, int]:
        from fastgrad.runtime.kernel_entry import source_tag

        compiled = compile_adapter(source, kernel_key(source + source_tag()))
        return compiled, int(compiled.address)

    label = f"kernel adapter {kernel_key(source)[:12]}"
    return _job(source, wait, lambda: CompileJob(label, source, build), later=later)


def ahead(step: Any) -> None:
    """At a plan's first call, when the kernel step `step` (runtime.plan_steps) has handed
    its kernel to the compile thread: queue behind it the adapter the plan interpreter
    will call it through, and (once per process) the interpreter's loop, so that they are
    built (a cold adapter ~0.1-0.2 s, the loop ~1.5-2.5 s; warm, loads of a few ms) while
    the kernels are and lowering, after them, does not wait for them in turn. The kinds
    of argument tuples the interpreter is compiled for are known only when lowering."""
    if config.runtime != "vm":
        return  # plans run step by step: no adapter is ever asked for
    # Asked once per kernel: the 599 kernel steps of a T=200 RNN are a few kernels.
    key = (step.source.source, len(step.sizes), *map(type, step.scalars))
    if key in _AHEAD:
        return
    _AHEAD.add(key)
    shape = step.adapter_signature()
    if shape is not None:
        from fastgrad.compiler.codegen.adapter import adapter_source

        adapter(adapter_source(*shape), False, later=True)
    _job(_LOOP, False, _interpreter_loop, later=True)


def _interpreter_loop() -> CompileJob:
    def build() -> tuple[Any, int]:
        from fastgrad.runtime.vm import table_function

        return None, table_function()

    return CompileJob("plan interpreter's loop", "plan interpreter's loop", build)


def entry(kernel: Any, kernel_source: str, signature: tuple[Any, ...], wait: bool) -> CompileJob:
    """The job finding the address of `kernel` (compiled from `kernel_source`) for the
    argument types an adapter hands it (runtime.kernel_entry): at once when Numba has
    compiled it for them, as it mostly has (the step runner called it so), else after a
    compile on the compile thread."""

    def build() -> tuple[Any, int]:
        from fastgrad.runtime.kernel_entry import entry_address

        # compile() takes Numba's compiler lock even for a signature it has: an inline job
        # would then wait on the calling thread behind an overdue compile (or, in a child
        # forked during one, forever)
        if signature not in kernel.overloads:
            kernel.compile(signature)
        address = entry_address(kernel, signature)
        if address is None:
            raise RuntimeError(f"no C entry for {kernel_key(kernel_source)} at {signature}")
        return kernel, address

    label = f"entry of fastgrad_kernel_{kernel_key(kernel_source)}"
    key = ("entry", kernel_source, signature)
    inline = signature in kernel.overloads
    return _job(key, wait, lambda: CompileJob(label, kernel_source, build), inline)


def interpreter(arrays: tuple[np.ndarray, ...], wait: bool) -> CompileJob:
    """The job compiling `run_steps` for the kind of tuple `arrays` is (a new kind costs
    a compile of the interpreter, which no call should wait for either)."""
    import numba

    kind = numba.typeof(arrays)
    signature = (numba.typeof(np.zeros(1, np.int64)), numba.int64, kind)

    def build() -> tuple[Any, int]:
        from fastgrad.runtime.vm import run_steps, table_function

        table_function()  # the loop itself, compiled (or loaded) once for all kinds
        return run_steps.compile(signature), 0

    label = f"plan interpreter for {kind}"
    return _job(("interpreter", str(kind)), wait, lambda: CompileJob(label, str(kind), build))


def vector_rows(wait: bool) -> CompileJob:
    """The job compiling (or loading) the C function that runs the interpreter's rows for
    products with a dimension of 1 (runtime.vm_vectors), once for all plans."""
    from fastgrad.runtime.vm_vectors import vector_function

    def build() -> tuple[Any, int]:
        return None, vector_function()

    return _job("vector rows", wait, lambda: CompileJob("vector rows", "vector rows", build))


def product_worker(wait: bool) -> CompileJob:
    """The job compiling (or loading) the loop of the worker that cuts matrix products
    across the cores and the cut itself (runtime.gemm_split.build, ~0.9 and ~2.4 s of CPU
    cold), then starting the worker; once per process, asked for when a plan is lowered
    with a product big enough to cut (products run whole, compiled, meanwhile). Queued
    behind the kernels, adapters and the interpreter's loop already queued, and behind
    the interpreter that lowering then asks for (queued ahead of these); a plan told to
    wait waits for it after its interpreter."""

    def build() -> tuple[Any, int]:
        from fastgrad.runtime import gemm_split

        # A plan lowered without Numba asks for the worker before any lowering has made
        # the cut's state (runtime.plan_table): made here, as lowering with Numba would.
        if not gemm_split.state_address():
            return None, 0  # (no semaphores here: products are not cut)
        return None, gemm_split.build()

    label = "product worker (its loop and the cut)"
    make = lambda: CompileJob(label, label, build)  # noqa: E731
    return _job("product worker", wait, make, later=True)
