"""Tiered execution: kernels compile on a background thread while NumPy answers.

In background mode (`config.compile`, the default) each kernel step of a plan carries a
`KernelTier`. Its first run hands the kernel's variants to the compile thread (the serial
one first; for loops large enough to gain from threads, the parallel one after it, and
after every other job queued: all loops get compiled code before any gets threads) and
runs the loop with NumPy (runtime.numpy_tier); every later run asks the tier, which
switches the step to the newest variant that is ready. A compile that fails leaves the
step on NumPy and warns once, naming the kernel. One thread, not a worker process: Numba
compiles one function at a time per process anyway, about half of a compile runs without
the GIL, and on this kind of machine a worker process took 4-12 s to start, longer than
most compiles (docs/architecture.md, the runtime layer). A plan told to wait (`settle`:
`compile`, `warmup`), and every first call in sync mode (`config.compile`), hands its final
kernels to the same thread and waits for them, under the watchdog. A forked child gets a
compile thread of its own (`_Worker.forked`).

The watchdog: a compile running past `config.compile_timeout` is reported once (stderr,
then a warning at the next call of its loop); calls, waiting ones included, answer with
NumPy for it and for the kernels queued behind it (Numba's compiler lock keeps them from
compiling meanwhile), and switch if it ever ends. A Numba compile cannot be stopped inside
the process, so the kernel is recorded on disk and later runs compile it in a separate
process that can be (runtime.slow_kernels), on a thread of its own beside the queue.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.source import KernelSource
from fastgrad.compiler.kernel_cache import compile_kernel, kernel_key, needs_build
from fastgrad.core import compile_log
from fastgrad.core.config import config
from fastgrad.runtime import compile_fork, native_code, numba_load, slow_kernels
from fastgrad.runtime.numpy_tier import NumpyLoop

PENDING, READY, FAILED = "pending", "ready", "failed"
# Element-ops (a loop's ops times its elements, counted as float64's: a float32 loop's
# count half) above which a first call waits for a kernel on disk rather than run its
# loop with NumPy: loading costs Numba's import once (~0.2 s of CPU, 0.4-0.8 s of wall
# time on the loaded 2-core machine), then ~10-25 ms a kernel. NumPy costs ~0.3-1.4 ns an
# element-op in float64, over blocks (runtime.numpy_blocks) or whole (whole arrays fault
# in fresh pages for their temporaries), and about a third of that in float32. Measured
# warm (4 fresh processes each, alternating, load 5): W1 (2^28.5 element-ops, over blocks)
# answered in 0.87-1.10 s waiting against 1.06-1.48 s on NumPy in float64, and in
# 0.86-1.03 s against 0.31-0.67 s in float32 (2^27.5); W2 (2^27.0, whole) in 0.41-0.76 s
# waiting against 0.11-0.46 s on NumPy. W3 is 2^26.5.
IMPORT_WORK, LOAD_WORK = 1 << 28, 1 << 24
DROPPED = "dropped"  # the process exited before its turn: neither built nor failed


class Batch:
    """The kernels one first call handed to the compile thread, reported together once
    the call has returned and all of them are done."""

    def __init__(self, what: str):
        self.what = what
        self.jobs: list[Job] = []
        self.to_build: set[str] = set()  # kernel sources whose machine code is not on disk
        # Steps of an unrolled loop ask for the same kernel at the same argument layouts:
        # one job each (the 599 kernel steps of a T=200 RNN are a few kernels, and 599 jobs
        # cost a warm first call 0.3 s waking the compile thread, and the thread as much).
        self.shared: dict[tuple[Any, ...], Job] = {}
        self.start = time.perf_counter()
        self.lock = threading.Lock()
        self.finished = 0
        self.open = True
        self.after: list[Any] = []  # jobs handed over once the call returns (`submit_after`)

    def add(self, job: Job) -> None:
        with self.lock:
            self.jobs.append(job)

    def job_done(self) -> None:
        with self.lock:
            self.finished += 1
        self._report_if_done()

    def close(self) -> None:
        with self.lock:
            self.open = False
        self._report_if_done()

    def _report_if_done(self) -> None:
        with self.lock:
            if self.open or self.finished < len(self.jobs) or not self.jobs:
                return
            self.open = True  # report once
        if any(job.state == DROPPED for job in self.jobs):
            return  # the process is exiting: nothing will run compiled, nothing failed
        # The steps of an unrolled loop submit the same kernel many times: say each once.
        kernels: dict[tuple[str, str], tuple[bool, bool]] = {}
        for job in self.jobs:
            built, failed = kernels.get((job.source.source, job.label), (False, False))
            kernels[job.source.source, job.label] = (
                built or job.built,
                failed or job.state == FAILED,
            )
        built_count = sum(built for built, _ in kernels.values())
        failed_count = sum(failed for _, failed in kernels.values())
        seconds = time.perf_counter() - self.start
        compile_log.background_done(self.what, len(kernels), built_count, failed_count, seconds)


class Job:
    """One kernel variant to compile for one argument signature."""

    def __init__(self, source: KernelSource, label: str, args: tuple[Any, ...], batch: Batch):
        self.source = source
        self.label = label  # "serial kernel fastgrad_kernel_<key> (loop over (n,))"
        self.args = args  # stand-ins of the kernel's arguments (`stand_in`), typed here
        self.batch = batch
        self.state = PENDING
        self.dispatcher: Any = None
        self.error: BaseException | None = None
        self.built = False
        self.later = False  # a parallel variant behind its serial one: queued last
        # Recorded as slow and not on disk yet: compiled in a child process.
        self.apart = slow_kernels.recorded(source.source) is not None and needs_build(source.source)
        self.done = threading.Event()
        # Set once waiting is pointless: done, overdue, or queued behind an overdue one.
        self.settled = threading.Event()

    def run(self) -> None:
        start = time.perf_counter()
        try:
            numba_load.load(_pause)  # on the compile thread: a first call never waits for it
            import numba

            types = tuple(numba.typeof(a) for a in self.args)
            source = self.source
            if slow_kernels.recorded(source.source) == slow_kernels.HUNG:
                raise RuntimeError("its compile hung in an earlier run")
            if self.apart:
                compiled = slow_kernels.compile_apart(source.source, source.name, types, self.label)
            else:
                compiled = compile_kernel(source.source, source.name, types)
            self.dispatcher, self.built = compiled
            self.state = READY
        except Exception as error:  # reported to the caller, which stays on NumPy
            self.error = error
            self.state = FAILED
        seconds = time.perf_counter() - start
        compile_log.log_kernel_ready(self.label, self.state == READY, self.built, seconds)
        self._end()

    def drop(self) -> None:
        self.state = DROPPED
        self._end()

    def fail(self) -> None:
        """Failed without a compile (its `error` says why)."""
        self.state = FAILED
        self._end()

    def _end(self) -> None:
        self.done.set()
        self.settled.set()
        self.batch.job_done()


class _Worker:
    """The compile thread: jobs run one at a time, in the order they were submitted, each
    under the watchdog; jobs of kernels recorded as slow run apart, each on its own
    thread (their compile runs in a child process)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.queue: deque[Job] = deque()
        # Parallel variants of loops whose serial one is queued too: after every job of
        # `queue`, so that all of a plan's loops run compiled (serial) before any waits
        # for another's parallel variant (bench M4, cold: 13 serial kernels, 8.4 s of
        # CPU, queued among 4 parallel ones, 11.6 s; serial ones had waited up to 60 s).
        self.later: deque[Job] = deque()
        self.thread: threading.Thread | None = None
        self.pending = 0  # jobs queued or running
        self.inflight: dict[Any, None] = {}  # those jobs, in the order they came
        self.stopping = False
        self.overdue: Job | None = None  # the compile running past the timeout, if any
        # First calls under way (on NumPy): the thread starts no job before they return.
        # Importing Numba and loading kernels holds the GIL most of the time, and a warm
        # first call (every kernel on disk) ran 3-5x slower beside it. A call that waits
        # for a kernel (`compile` inside a first call, say) lifts the hold.
        self.first_calls = 0
        self.hurry = False
        self.stale = False  # forked amid a compile or Numba's import: none can run

    def submit(self, job: Job) -> None:
        if self.stale:
            job.error = RuntimeError(
                "nothing compiles in this process: it was forked while a compile in its "
                "parent held Numba's compiler lock (or its import, the import's lock)"
            )
            getattr(job, "fail", job.drop)()
            return
        with self.lock:
            self.pending += 1
            self.inflight[job] = None
            if job.apart:
                name = "fastgrad-compile-apart"
                threading.Thread(target=self._run, args=(job,), name=name, daemon=True).start()
                return
            if self.overdue is not None:
                job.settled.set()  # queued behind a compile that may never end
            queue = self.later if getattr(job, "later", False) else self.queue
            (queue.appendleft if getattr(job, "first", False) else queue.append)(job)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._loop, name="fastgrad-compile", daemon=True
                )
                self.thread.start()
                atexit.register(self.stop)
            self.lock.notify_all()

    def _loop(self) -> None:
        while True:
            with self.lock:
                self.lock.wait_for(
                    lambda: (
                        ((self.queue or self.later) and (not self.first_calls or self.hurry))
                        or self.stopping
                    )
                )
                if not (self.queue or self.later):
                    return
                job = (self.queue or self.later).popleft()
            if self.stopping:  # the interpreter is exiting: pending jobs are dropped
                job.drop()
                self._finished(job)
                continue
            watchdog = threading.Timer(
                config.compile_timeout, self._overdue, (job, time.perf_counter())
            )
            watchdog.daemon = True
            watchdog.start()
            try:
                self._run(job)
            finally:
                watchdog.cancel()

    def _run(self, job: Job) -> None:
        try:
            job.run()
        finally:
            with self.lock:
                if self.overdue is job:
                    self.overdue = None
            self._finished(job)

    def _finished(self, job: Any) -> None:
        with self.lock:
            self.pending -= 1
            self.inflight.pop(job, None)
            self.lock.notify_all()

    def _overdue(self, job: Job, start: float) -> None:
        """The watchdog: `job` has compiled for longer than `config.compile_timeout`."""
        with self.lock:
            if job.done.is_set():
                return
            self.overdue = job
            behind = [*self.queue, *self.later]
        seconds = time.perf_counter() - start
        kernel = isinstance(job, Job)  # adapters and the interpreter never compile apart
        if kernel:
            slow_kernels.record(job.source.source, slow_kernels.SLOW, job.label, seconds)
        size = f"{job.source.source.count(chr(10))} lines of source"
        compile_log.compile_overdue(job.label, size, seconds, getattr(job, "overdue", kernel))
        for waiting in (job, *behind):
            waiting.settled.set()

    def wait_idle(self, timeout: float | None) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: self.pending == 0, timeout)

    def hold(self, change: int) -> None:
        """A first call on NumPy begins (+1) or returns (-1)."""
        with self.lock:
            self.first_calls += change
            if not self.first_calls:
                self.hurry = False
            self.lock.notify_all()

    def paused(self, timeout: float) -> bool:
        """Wait, at most `timeout` seconds, while a first call runs on NumPy and no call
        waits for a job; whether one still does (runtime.numba_load's imports pause)."""
        with self.lock:
            free = self.lock.wait_for(
                lambda: not self.first_calls or self.hurry or self.stopping, timeout
            )
        return not free

    def waiting(self) -> None:
        """A call waits for a job: run jobs now, first calls or not."""
        with self.lock:
            self.hurry = True
            self.lock.notify_all()

    def forked(self) -> None:
        """In a forked child, which has none of its parent's threads (and maybe a lock one
        of them held): start afresh, the jobs queued or compiling in the parent handed to
        a compile thread of the child's own, so that calls waiting for them (sync mode,
        `compile`) are answered. The fork waited for the parent's compile under way to
        release Numba's compiler lock (runtime.compile_fork); where it could not (a compile
        found overdue), the child's lock stays held by a thread it does not have, so
        nothing compiles in the child: its calls, waiting ones too, go on with NumPy at
        once rather than after the watchdog's timeout."""
        jobs = [job for job in self.inflight if not job.done.is_set()]
        self.__init__()  # type: ignore[misc]
        self.stale = compile_fork.holds_stale_lock()
        for job in jobs:
            getattr(job, "forked", int)()  # (a job whose run holds a lock of its own)
            self.submit(job)

    def stop(self) -> None:
        """At exit, finish the compile under way (its machine code is then cached for the
        next process) unless it is overdue, and drop the rest, rather than leave Numba
        mid-compile."""
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
            overdue = self.overdue is not None
        if self.thread is not None and not overdue:
            self.thread.join(timeout=60)


_WORKER = _Worker()
# First, so that a child releases Numba's compiler lock before its compile thread starts.
# (A compile found overdue may never release it; in a child forked amid one, none will.)
compile_fork.register(
    lambda: getattr(_WORKER, "overdue", None) is not None or getattr(_WORKER, "stale", False)
)
if hasattr(os, "register_at_fork"):  # the worker of the moment (a test may install its own)
    os.register_at_fork(after_in_child=lambda: getattr(_WORKER, "forked", int)())


class _Batches(threading.local):
    """The first calls under way in the running thread, innermost last."""

    def __init__(self) -> None:
        self.open: list[Batch] = []


_batches = _Batches()


@contextmanager
def first_run(what: str) -> Iterator[Batch]:
    """Collect the kernels handed to the compile thread during a first call of `what`;
    once the call has returned, say how many build (fastgrad.core.compile_log), and again
    when they are all done."""
    batch = Batch(what)
    _batches.open.append(batch)
    worker = _WORKER
    getattr(worker, "hold", int)(1)  # (a test's stand-in may have no hold)
    try:
        yield batch
    finally:
        getattr(worker, "hold", int)(-1)
        _batches.open.remove(batch)
        for job in batch.after:  # (unless a call waiting for one handed it over)
            if job not in getattr(worker, "inflight", ()) and not job.settled.is_set():
                worker.submit(job)
        compile_log.background_started(what, len(batch.to_build))
        batch.close()


def _pause(timeout: float) -> bool:
    paused = getattr(_WORKER, "paused", None)  # (a test's stand-in may have none)
    return paused is not None and paused(timeout)


def load_numba() -> None:
    """Numba's import and registry load (runtime.numba_load), paused for first calls when
    made on the compile thread (another job than a kernel's may be the first to need it);
    on another thread (an inline job, which needs Numba loaded already) never paused: it
    would wait for the first call it is part of."""
    on_thread = threading.current_thread() is getattr(_WORKER, "thread", None)
    numba_load.load(_pause if on_thread else None)


def submit(job: Any) -> None:
    """Hand the compile thread a job of another kind than a kernel's (a kernel's adapter
    for the plan interpreter, runtime.adapters): anything with Job's `run`, `drop`,
    `done`, `settled`, `apart`, `label` and `source`. It runs in turn (a `first` one ahead
    of the queue: runtime.native_plan.Load), under the watchdog."""
    _WORKER.submit(job)


def submit_after(job: Any) -> None:
    """`submit` once the first call under way in this thread returns (at once outside
    one): behind every kernel the call hands over, parallel variants included."""
    batches = _batches.open
    if batches:
        batches[-1].after.append(job)
    else:
        _WORKER.submit(job)


def wait_for(job: Any) -> None:
    """Wait for a job handed to the compile thread (`submit`) until it is done, or the
    watchdog finds it, or one ahead of it, overdue (`job.settled`)."""
    worker = _WORKER
    inflight = getattr(worker, "inflight", None)  # (a test's stand-in may have none)
    if inflight is not None and job not in inflight and not job.settled.is_set():
        worker.submit(job)  # handed to a compile thread since replaced (a test's)
    getattr(worker, "waiting", int)()
    job.settled.wait()


def wait_idle(timeout: float | None = None) -> bool:
    """Wait until every kernel handed to the compile thread so far is compiled (or has
    failed); False if `timeout` seconds passed first.

    >>> wait_idle(timeout=60)
    True
    """
    return _WORKER.wait_idle(timeout)


def stand_in(arg: Any) -> Any:
    """What the compile thread types in place of a kernel argument: an array becomes a view
    of one element with the array's dtype, shape, strides and writeability (all that Numba's
    type of it reads), so a queued job holds none of the caller's memory; anything else is
    kept.

    >>> a = np.zeros((3, 4))[:, ::2]
    >>> s = stand_in(a)
    >>> (s.shape, s.strides, s.flags.c_contiguous, s.flags.writeable, np.shares_memory(s, a))
    ((3, 2), (32, 16), False, True, False)
    """
    if not isinstance(arg, np.ndarray):
        return arg
    one = np.empty(1, arg.dtype)
    return np.lib.stride_tricks.as_strided(
        one, arg.shape, arg.strides, writeable=arg.flags.writeable
    )


def layout(arg: Any) -> tuple[Any, ...]:
    """All that Numba's type of a kernel argument (or of its `stand_in`) may depend on:
    dtype, shape, strides, and of its flags writeable and aligned (`flags.num` masked: one
    flags object, not two; ~0.25 us, not 0.86, asked for each argument of each kernel step
    of a first call). An argument's and its stand-in's agree but for an unaligned array's
    `aligned` (a stand-in is aligned): jobs keyed by the arguments' layouts are at worst
    shared less."""
    if isinstance(arg, np.ndarray):
        return (arg.dtype, arg.shape, arg.strides, arg.flags.num & _KEPT_FLAGS)
    return (type(arg), getattr(arg, "dtype", None))


_KEPT_FLAGS = 0x100 | 0x400  # NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE


def loading_beats_numpy(work: int, sources: Sequence[str]) -> bool:
    """Whether a first call should wait for the kernels `sources` rather than run `work`
    element-ops with NumPy: their machine code is on disk, so is that of every kernel this
    first call has handed the compile thread so far (none would compile ahead of them),
    and the work exceeds what loading costs (Numba's import included, if not done yet)."""
    if work < (LOAD_WORK if numba_load.imported("numba") else IMPORT_WORK):
        return False
    batches = _batches.open
    if batches and batches[-1].to_build:
        return False
    return not any(needs_build(source) for source in sources)


class KernelTier:
    """What a kernel step runs until its final kernel is ready: NumPy, then each variant
    of its kernel as the compile thread finishes it."""

    def __init__(self, numpy_loop: NumpyLoop, variants: Sequence[KernelSource], shape: Any):
        self.numpy_loop = numpy_loop
        # Serial first, the last one final (only the final one where it is on disk).
        self.variants = list(variants)
        self.stored = list(variants)  # all of them (`variants` may keep the final one only)
        self.shape = shape
        self.jobs: list[Job] | None = None
        self.warned = False
        self.lock = threading.Lock()
        self.wait = False  # set by Executable.settle: the next call waits for the kernels
        self.native: Any = None  # the kernel loaded without Numba; False: none (not asked)
        self.loading: Any = None  # the final kernel loading without Numba: native_plan.Load

    def answer(self, step: Any, env: list[Any], bound: Any = ()) -> bool:
        """Run the step's loop with NumPy and return True while no kernel is ready; else
        install the newest ready kernel as `step.kernel` and return False (the step then
        runs it). With `wait` (or `config.compile == "sync"`) the final kernel comes first:
        the call waits for it, unless the watchdog finds its compile overdue."""
        wait = self.wait or config.compile == "sync"
        on = (loading := self.loading) and loading.answer(self, step, env, bound)
        if on is not None:  # its stored kernel loads on the compile thread, or did
            return on  # type: ignore[no-any-return]
        if (
            self.jobs is None
            and not wait
            and self._loading_beats_numpy()
            and native_code.for_tier(self, step, env) is None  # faster than waiting for Numba
        ):
            wait = self.wait = True
        if self.jobs is None:
            with self.lock:  # threads making the same first call submit the jobs once
                if self.jobs is None:
                    if len(self.variants) > 1 and not needs_build(self.variants[-1].source):
                        # On disk, the final variant loads about as fast as the serial one
                        # (~10-25 ms of the compile thread's CPU each): only it, then.
                        self.variants = self.variants[-1:]
                    self.jobs = self._submit(step, env, self.variants[-1:] if wait else None)
        jobs = self.jobs
        assert jobs is not None
        if wait:
            getattr(_WORKER, "waiting", int)()
            for job in jobs:
                job.settled.wait()
                if job.built and job.state == READY:
                    compile_log.kernel_built()  # the waiting call's notice counts it
        ready = [job for job in jobs if job.state == READY]
        failed = [job for job in jobs if job.state == FAILED]
        late = [job for job in jobs if job.state == PENDING and job.settled.is_set()]
        if (failed or (late and not ready)) and not self.warned:
            self.warned = True
            if failed:
                job, error = failed[0], failed[0].error
                why = f"failed ({type(error).__name__}: {error}); this loop runs with NumPy"
            else:
                job = late[0]
                why = (
                    f"has not finished within compile_timeout ({config.compile_timeout:g} s)"
                    "; this loop runs with NumPy until it does"
                )
            warnings.warn(
                f"fastgrad: compiling the {job.label} {why}", RuntimeWarning, stacklevel=2
            )
        if ready:
            step.kernel = ready[-1].dispatcher
            if all(job.state != PENDING for job in jobs):
                step.tier = None  # settled: later calls ask nothing
            return False
        if (native := native_code.for_tier(self, step, env)) is not None:  # before Numba's import
            step.kernel = native
            return False
        self.numpy_loop.run(env, bound)  # still compiling, overdue, or every variant failed
        return True

    def _loading_beats_numpy(self) -> bool:
        """Whether to wait for the final kernel rather than run the loop with NumPy: its
        machine code is on disk, so is that of every kernel this first call has handed the
        thread so far (none would compile ahead of it), and the loop does more work than
        loading takes (Numba's import, if not done yet, then a few ms a kernel), counted
        as float64's (`IMPORT_WORK`)."""
        small = self.numpy_loop.size * math.prod(self.shape) * 2 < LOAD_WORK  # (16-byte items)
        return not small and loading_beats_numpy(self._work(), [self.variants[-1].source])

    def _work(self, ops: int = 0) -> int:
        """The loop's element-ops (or `ops` ops' over its elements), counted as float64's."""
        loop = self.numpy_loop
        itemsize = max((op[3].itemsize for op in loop.ops if op[3].kind in "fc"), default=8)
        return (ops or loop.size) * math.prod(self.shape) * itemsize // 8

    def _submit(self, step: Any, env: list[Any], waiting: list[KernelSource] | None) -> list[Job]:
        """Hand the variants to the compile thread: all of them, or only `waiting`, those
        a waiting call waits for."""
        variants = self.variants if waiting is None else waiting
        # Arguments and their stand-ins only for a job not shared yet: an unrolled loop's
        # steps share a few (T=200 RNN: 599 steps, 6 jobs; 5,192 stand-ins cost ~40 ms of
        # its first call, its steps' arguments and their layouts ~6).
        layouts = step.layouts(env)
        args: tuple[Any, ...] | None = None
        batches = _batches.open
        batch = batches[-1] if batches else Batch(f"a loop over {self.shape}")
        jobs = []
        for source in variants:
            signature = (source.source, *layouts)
            job = batch.shared.get(signature)
            if job is None:  # (a label's sha256 of the source: ~10 us, once per job)
                final = source is self.variants[-1]
                kind = "parallel" if final and step.parallel else "serial"
                key = kernel_key(source.source)
                label = f"{kind} kernel fastgrad_kernel_{key} (loop over {self.shape})"
                args = args or tuple(map(stand_in, step.arguments(env)))
                job = batch.shared[signature] = Job(source, label, args, batch)
                job.later = waiting is None and source is not variants[0]
                if needs_build(source.source):
                    batch.to_build.add(source.source)
                batch.add(job)
                _WORKER.submit(job)
            jobs.append(job)
        if not batches and waiting is None:  # a waiting call's notice reports its own
            batch.close()
        return jobs
