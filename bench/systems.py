"""The systems a workload runs on: fastgrad, hand-written NumPy and Numba, and peers.

Each system says which modules it needs, how to turn NumPy inputs into its own arrays,
how to build a value-and-gradient function for a workload, and how to wait for and read
back a result. All imports happen inside methods: only the child process that runs a
system imports it.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .workloads import Workload

# Comma-separated module names to treat as not installed. It exists so that tests can
# exercise the "peer not installed" path without uninstalling anything.
HIDE_ENV = "FASTGRAD_BENCH_HIDE"


@dataclass(frozen=True)
class Ops:
    """The handful of array functions the workload losses call."""

    sum: Any
    mean: Any
    max: Any  # max(x, axis=, keepdims=)
    logsumexp: Any  # logsumexp(x, axis=)
    tanh: Any
    sin: Any
    exp: Any
    stop_gradient: Any
    arange: Any
    softplus: Any = None  # D1 only, which only fastgrad runs of the autodiff systems
    normal: Any = None  # R1 only: normal(key, shape, dtype)
    scan: Any = None  # S1-S5 (loops): fastgrad and JAX only
    checkpoint: Any = None
    sqrt: Any = None  # the models group (models.py): fastgrad, JAX and PyTorch
    swapaxes: Any = None  # swapaxes(x, axis1, axis2)


class NotApplicable(Exception):
    """The system has no version of this workload (reported as skipped)."""


def bind(workload: Workload, ops: Ops):
    """The workload's loss with `ops` filled in, keeping a real signature and name."""
    loss = functools.partial(workload.loss, ops)
    loss.__name__ = workload.loss.__name__
    return loss


class System:
    name = ""
    title = ""
    modules: tuple[str, ...] = ()  # needed to run; checked before spawning a child
    install = ""  # how a user gets it
    peer = True  # False only for fastgrad itself
    # Measured warm too: a second fresh process on the compile cache the first one filled
    # (`cache_env`). The others have no compile cache a second process could read.
    warm = False

    def cache_env(self, directory: str) -> dict[str, str]:
        """Environment that keeps the system's compile cache in `directory`, which the
        bench empties per run (default: none)."""
        return {}

    def setup(self, threads: int) -> dict:
        """Import and configure; return {"version": ..., "threads": ...}."""
        raise NotImplementedError

    def build(self, workload: Workload):
        """Return fn(*inputs) -> (value, gradients) for the workload's argnums."""
        raise NotImplementedError

    def inputs(self, workload: Workload, size: int, dtype: np.dtype) -> tuple:
        """The workload's inputs, made where this system keeps them (here: in memory)."""
        return workload.make_inputs(size, dtype, np.random.default_rng(0))

    def convert(self, workload: Workload, inputs: tuple) -> tuple:
        return inputs

    def settle(self, fn, args) -> None:
        """Finish whatever the first call left compiling (default: nothing)."""

    def details(self, fn, args) -> dict:
        """Figures beyond the timings, measured after the steady state (default: none)."""
        return {}

    def close(self) -> None:
        """Release what setup started."""

    def sync(self, out) -> None:
        """Wait until `out` is computed (for systems that run asynchronously)."""

    def to_numpy(self, out) -> tuple[float, list[np.ndarray]]:
        value, grads = out
        return float(value), [np.asarray(g) for g in grads]


class Fastgrad(System):
    name, title, peer = "fastgrad", "fastgrad jit(value_and_grad)", False
    modules = ("fastgrad",)
    install = "pip install fastgrad"
    warm = True

    def cache_env(self, directory):
        return {"FASTGRAD_CACHE_DIR": directory}  # kernels and plans

    def setup(self, threads):
        import fastgrad as fg
        import fastgrad.numpy as fnp

        self.fg = fg
        self.ops = Ops(
            sum=fnp.sum,
            mean=fnp.mean,
            max=fnp.max,
            logsumexp=fnp.logsumexp,
            tanh=fnp.tanh,
            sin=fnp.sin,
            exp=fnp.exp,
            stop_gradient=fg.stop_gradient,
            arange=np.arange,
            softplus=fnp.softplus,
            normal=fg.random.normal,
            scan=fg.scan,
            checkpoint=fg.checkpoint,
            sqrt=fnp.sqrt,
            swapaxes=fnp.swapaxes,
        )
        return {"version": _dist_version("fastgrad"), "threads": threads}

    def build(self, workload):
        fg = self.fg
        loss = bind(workload, self.ops)
        if workload.transform == "hvp":
            return fg.jit(_hvp(fg.jvp, fg.value_and_grad(loss)))
        if workload.transform == "per_example":
            vg = fg.value_and_grad(loss, argnums=workload.argnums)
            return fg.jit(_per_example(fg.vmap, vg, workload.argnums, self.ops.sum))
        return fg.jit(fg.value_and_grad(loss, argnums=workload.argnums))

    def settle(self, fn, args):
        # A first call runs on NumPy while kernels compile in the background; the steady
        # state is that of the compiled kernels.
        self.fg.warmup(fn, *args)


class FastgradLoop(Fastgrad):
    """Per-example gradients the way one writes them without vmap: the jitted gradient
    of one example, called in a Python loop (V1 only)."""

    name, title, peer = "fastgrad-loop", "fastgrad jit(value_and_grad), a loop per example", False

    def build(self, workload):
        if workload.transform != "per_example":
            raise NotApplicable("only per-example workloads")
        fg, params = self.fg, len(workload.argnums)
        one = fg.jit(fg.value_and_grad(bind(workload, self.ops), argnums=workload.argnums))

        def loop(*args):
            outs = [one(*args[:params], *ex) for ex in zip(*args[params:], strict=True)]
            grads = tuple(np.stack(g) for g in zip(*(g for _, g in outs), strict=True))
            return sum(float(v) for v, _ in outs), grads

        loop.one, loop.params = one, params
        return loop

    def settle(self, fn, args):
        self.fg.warmup(fn.one, *args[: fn.params], *(a[0] for a in args[fn.params :]))


class HandNumpy(System):
    name, title = "numpy", "hand-written NumPy forward + backward"
    modules = ("numpy",)
    install = "pip install numpy"

    def setup(self, threads):
        return {"version": np.__version__, "threads": None}

    def build(self, workload):
        from . import hand_numpy

        if workload.key not in hand_numpy.IMPLEMENTATIONS:
            raise NotApplicable("no hand-written NumPy version")
        return hand_numpy.IMPLEMENTATIONS[workload.key]


class HandNumba(System):
    name, title = "numba", "hand-fused Numba prange loop"
    modules = ("numba",)
    install = "pip install numba"

    def setup(self, threads):
        import numba

        return {"version": numba.__version__, "threads": numba.config.NUMBA_NUM_THREADS}

    def build(self, workload):
        from . import hand_numba

        if workload.key not in hand_numba.IMPLEMENTATIONS:
            why = hand_numba.NOT_APPLICABLE.get(workload.key, "no hand-fused version")
            raise NotApplicable(why)
        return hand_numba.IMPLEMENTATIONS[workload.key]


class Autograd(System):
    name, title = "autograd", "HIPS autograd value_and_grad"
    modules = ("autograd",)
    install = "pip install autograd"

    def setup(self, threads):
        import autograd
        import autograd.numpy as anp
        from autograd.tracer import getval

        try:  # autograd's logsumexp lives in its scipy wrappers
            from autograd.scipy.special import logsumexp
        except ImportError:  # no scipy: the usual stable formula does the same

            def logsumexp(x, axis=None):
                m = getval(anp.max(x, axis=axis, keepdims=True))
                return anp.log(anp.sum(anp.exp(x - m), axis=axis)) + anp.squeeze(m, axis)

        self.autograd = autograd
        self.ops = Ops(
            sum=anp.sum,
            mean=anp.mean,
            max=anp.max,
            logsumexp=logsumexp,
            tanh=anp.tanh,
            sin=anp.sin,
            exp=anp.exp,
            stop_gradient=getval,  # the raw value carries no gradient
            arange=np.arange,
        )
        return {"version": _dist_version("autograd"), "threads": None}

    def build(self, workload):
        if workload.transform != "value_and_grad":
            raise NotApplicable(f"no {workload.transform} here")
        return self.autograd.value_and_grad(bind(workload, self.ops), argnum=workload.argnums)


class Jax(System):
    name, title = "jax", "JAX jit(value_and_grad)"
    modules = ("jax", "jaxlib")
    install = "pip install jax"
    warm = True

    def cache_env(self, directory):
        # JAX's persistent compilation cache, read from these variables at import. By
        # default it skips executables that compiled in under 1 s, and small ones: here
        # every executable is stored, as fastgrad stores every kernel.
        return {
            "JAX_ENABLE_COMPILATION_CACHE": "1",
            "JAX_COMPILATION_CACHE_DIR": directory,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
        }

    def setup(self, threads):
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)  # else float64 silently becomes float32
        self.jax = jax
        self.ops = Ops(
            sum=jnp.sum,
            mean=jnp.mean,
            max=jnp.max,
            logsumexp=jax.nn.logsumexp,
            tanh=jnp.tanh,
            sin=jnp.sin,
            exp=jnp.exp,
            stop_gradient=jax.lax.stop_gradient,
            arange=jnp.arange,
            normal=jax.random.normal,  # the key: JAX's raw uint32[2] form
            scan=jax.lax.scan,
            checkpoint=jax.checkpoint,
            softplus=jax.nn.softplus,
            sqrt=jnp.sqrt,
            swapaxes=jnp.swapaxes,
        )
        # XLA's CPU backend picks its own thread pool size.
        return {"version": jax.__version__, "threads": None}

    def convert(self, workload, inputs):
        return tuple(self.jax.block_until_ready(self.jax.device_put(a)) for a in inputs)

    def build(self, workload):
        jax = self.jax
        loss = bind(workload, self.ops)
        if workload.transform == "hvp":
            return jax.jit(_hvp(jax.jvp, jax.value_and_grad(loss)))
        if workload.transform == "per_example":
            vg = jax.value_and_grad(loss, argnums=workload.argnums)
            return jax.jit(_per_example(jax.vmap, vg, workload.argnums, self.ops.sum))
        return jax.jit(jax.value_and_grad(loss, argnums=workload.argnums))

    def sync(self, out):
        self.jax.block_until_ready(out)


class TorchEager(System):
    name, title = "torch", "PyTorch eager, autograd.grad"
    modules = ("torch",)
    install = "pip install torch"

    def setup(self, threads):
        import torch

        torch.set_num_threads(threads)  # the same thread count as the Numba systems
        self.torch = torch
        self.ops = Ops(
            sum=_torch_reduction(torch.sum),
            mean=_torch_reduction(torch.mean),
            max=_torch_reduction(torch.amax),
            logsumexp=lambda x, axis: torch.logsumexp(x, dim=axis),
            tanh=torch.tanh,
            sin=torch.sin,
            exp=torch.exp,
            stop_gradient=lambda x: x.detach(),
            arange=torch.arange,
            softplus=torch.nn.functional.softplus,
            sqrt=torch.sqrt,
            swapaxes=torch.swapaxes,
        )
        return {"version": torch.__version__, "threads": torch.get_num_threads()}

    def convert(self, workload, inputs):
        # from_numpy shares memory; only the differentiated inputs require grad
        tensors = tuple(self.torch.from_numpy(a) for a in inputs)
        if workload.transform == "value_and_grad":  # torch.func's transforms need none
            for i in workload.argnums:
                tensors[i].requires_grad_(True)
        return tensors

    def forward(self, workload):
        return bind(workload, self.ops)

    def hvp(self, workload):
        func = self.torch.func
        grad_and_value = func.grad_and_value(bind(workload, self.ops))

        def value_and_hvp(x, v):
            (_, value), (hvp, _) = func.jvp(grad_and_value, (x,), (v,))
            return value, (hvp,)

        return value_and_hvp

    def build(self, workload):
        if workload.transform == "hvp":
            return self.hvp(workload)
        forward = self.forward(workload)
        grad = self.torch.autograd.grad

        def value_and_grad(*args):
            value = forward(*args)
            grads = grad(value, [args[i] for i in workload.argnums])
            return value.detach(), grads

        return value_and_grad

    def to_numpy(self, out):
        value, grads = out
        return float(value), [g.detach().numpy() for g in grads]


class TorchCompile(TorchEager):
    name, title = "torch-compile", "PyTorch torch.compile forward, compiled backward"
    warm = True

    def cache_env(self, directory):
        # Inductor's FX graph cache and AOTAutograd's cache (the compiled forward and
        # backward, their C++ kernels) live under TORCHINDUCTOR_CACHE_DIR. Dynamo's trace
        # of the Python function is not cached across processes, so a warm first call
        # still traces.
        return {
            "TORCHINDUCTOR_CACHE_DIR": directory,
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        }

    def forward(self, workload):
        # The compiled forward also compiles its backward (AOTAutograd) on first call.
        return self.torch.compile(bind(workload, self.ops))

    def hvp(self, workload):
        return self.torch.compile(super().hvp(workload))


class Dask(Fastgrad):
    """fastgrad.dask.value_and_grad on a LocalCluster of `workers` processes, which split
    the machine's threads; the data is made and kept on the workers (D1 only)."""

    modules = ("fastgrad", "dask", "distributed")
    install = "pip install 'fastgrad[dask]'"
    peer = True
    warm = False  # the workers compile cold (cache_env); D1 measures the cluster's calls

    def __init__(self, workers: int):
        self.workers = workers
        self.name = f"dask-{workers}"
        self.title = f"fastgrad.dask, {workers} worker process(es)"

    def setup(self, threads):
        import distributed

        info = super().setup(threads)
        per_worker = str(max(1, threads // self.workers))
        names = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        self.cluster = distributed.LocalCluster(
            n_workers=self.workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            env={name: per_worker for name in names},
        )
        self.client = distributed.Client(self.cluster)
        return {**info, "version": _dist_version("distributed"), "threads": int(per_worker)}

    def inputs(self, workload, size, dtype):
        import dask
        import dask.array as da
        import distributed

        from .workloads import DASK_FEATURES, dask_chunk, dask_chunk_rows, dask_params

        if workload.key != "D1":
            raise NotApplicable("fastgrad.dask runs the D1 workload only")
        xs, ys = [], []
        for i, rows in enumerate(dask_chunk_rows(size)):
            x, y = dask.delayed(dask_chunk, nout=2)(i, rows, dtype)
            xs.append(da.from_delayed(x, (rows, DASK_FEATURES), dtype))
            ys.append(da.from_delayed(y, (rows,), dtype))
        x, y = self.client.persist([da.concatenate(xs), da.concatenate(ys)])
        distributed.wait([x, y])
        return dask_params(dtype), x, y

    def build(self, workload):
        import fastgrad.dask

        return fastgrad.dask.value_and_grad(bind(workload, self.ops), argnums=workload.argnums)

    def settle(self, fn, args):
        """Nothing: the workers compile, and the first call already waited for them."""

    def details(self, fn, args):
        from .dask_timing import per_call_breakdown

        return {"breakdown": per_call_breakdown(self.client, fn, args)}

    def close(self):
        self.client.close()
        self.cluster.close()


def _hvp(jvp, value_and_grad):
    """fn(x, v) -> (loss(x), (loss''(x) v,)): forward mode through the gradient, with the
    system's own `jvp` and `value_and_grad` of the loss."""

    def value_and_hvp(x, v):
        (value, _), (_, hvp) = jvp(value_and_grad, (x,), (v,))
        return value, (hvp,)

    return value_and_hvp


def _torch_reduction(fn):
    def reduce(x, axis=None, keepdims=False):
        return fn(x) if axis is None else fn(x, dim=axis, keepdim=keepdims)

    return reduce


def _dist_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        Fastgrad(),
        FastgradLoop(),
        HandNumpy(),
        HandNumba(),
        Autograd(),
        Jax(),
        TorchEager(),
        TorchCompile(),
        Dask(1),
        Dask(2),
    )
}
# The peers compared by default; the Dask systems run only in the workloads that name them.
PEERS = tuple(name for name, s in SYSTEMS.items() if s.peer and not isinstance(s, Dask))


def _per_example(vmap, value_and_grad, argnums, total):
    """value_and_grad of one example mapped over the leading axis of the inputs outside
    `argnums`; the values summed."""

    def per_example(*args):
        axes = tuple(None if i in argnums else 0 for i in range(len(args)))
        values, grads = vmap(value_and_grad, in_axes=axes)(*args)
        return total(values), grads

    return per_example


# ---------------------------------------------------------------- availability


def hidden_modules() -> set[str]:
    return {m.strip() for m in os.environ.get(HIDE_ENV, "").split(",") if m.strip()}


def missing_module(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` that cannot be imported, found without importing it."""
    hidden = hidden_modules()
    for module in modules:
        if module in hidden or importlib.util.find_spec(module) is None:
            return module
    return None


class _HideFinder(importlib.abc.MetaPathFinder):
    def __init__(self, hidden: set[str]):
        self.hidden = hidden

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.hidden:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def hide_modules() -> None:
    """Make the modules named in FASTGRAD_BENCH_HIDE fail to import in this process."""
    hidden = hidden_modules()
    if hidden:
        sys.meta_path.insert(0, _HideFinder(hidden))
