"""Kernels' adapters for the plan interpreter (runtime.vm), built like kernels: on the
background compile thread, so that no call waits for one (or in the calling thread in
sync mode, and for a plan told to wait). One adapter per kernel source and operand
kinds, shared by every plan; its machine code is cached on disk like a kernel's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from fastgrad.compiler.kernel_cache import kernel_key
from fastgrad.core import compile_log
from fastgrad.runtime import background
from fastgrad.runtime.vm import compile_adapter

_LOCK = threading.Lock()
_JOBS: dict[tuple[str, str], AdapterJob] = {}  # (kernel source, adapter source) -> its job


@dataclass
class _Source:
    source: str  # what the compile watchdog names and records when a compile hangs


class AdapterJob:
    """One adapter to compile: the interface of background.Job that the compile thread
    uses (run, drop, done, settled, apart, label, source)."""

    apart = False  # never a child process: an adapter compiles as fast as its kernel

    def __init__(self, kernel_source: str, source: str, kernel: Any):
        self.kernel, self.adapter_source = kernel, source
        self.source = _Source(source)
        self.tag = kernel_key(kernel_source + source)
        self.label = f"adapter of fastgrad_kernel_{kernel_key(kernel_source)}"
        self.address: int | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.settled = threading.Event()
        self._run_lock = threading.Lock()

    def run(self) -> None:
        with self._run_lock:  # once, whichever thread (compile thread or a waiting call)
            if self.done.is_set():
                return
            start = time.perf_counter()
            try:
                adapter = compile_adapter(self.adapter_source, self.kernel, self.tag)
                self.address = int(adapter.address)
                self._adapter = adapter  # keeps its machine code alive
            except Exception as error:  # the plan keeps running its steps one by one
                self.error = error
            seconds = time.perf_counter() - start
            compile_log.log_kernel_ready(self.label, self.error is None, True, seconds)
            self.done.set()
            self.settled.set()

    def drop(self) -> None:
        self.settled.set()


def adapter(kernel_source: str, source: str, kernel: Any, wait: bool) -> AdapterJob:
    """The job building the adapter `source` around `kernel` (compiled from
    `kernel_source`): handed to the compile thread when first asked for, or, with `wait`,
    compiled here if it is not done yet."""
    key = (kernel_source, source)
    with _LOCK:
        job = _JOBS.get(key)
        new = job is None
        if new:
            job = _JOBS[key] = AdapterJob(kernel_source, source, kernel)
    assert job is not None
    if wait:
        job.run()  # nothing to do if the compile thread has built it
    elif new:
        background.submit(job)
    return job
