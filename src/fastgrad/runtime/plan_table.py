"""Lower an arena's settled steps to segments for the plan interpreter (runtime.vm): each
run of kernel steps becomes one call into compiled code; any other step (a matmul, a
view, a library call, a loop, a kernel with index checks) stays a host step, the arena's
own prepared call. A segment whose operands are not C-contiguous arrays of the kernel's
dtype at a call runs its steps one by one instead: never a wrong answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from fastgrad.compiler.codegen.adapter import FLOATS, adapter_source
from fastgrad.compiler.kernel_cache import kernel_key
from fastgrad.runtime.arena import staggered_empty
from fastgrad.runtime.vm import KERNEL, compile_adapter, run_steps

_ADAPTERS: dict[tuple[Any, ...], Any] = {}  # (kernel key, adapter source) -> C function
_COMPILING = threading.Lock()


def _adapter_address(step: Any, operands: list[tuple[int, str]]) -> int:
    scalars = [np.asarray(s).dtype.name for s in step.scalars]
    source = adapter_source(len(step.sizes), scalars, operands)
    key = (kernel_key(step.source.source), source)
    with _COMPILING:
        adapter = _ADAPTERS.get(key)
        if adapter is None:
            tag = kernel_key(key[0] + source)
            adapter = _ADAPTERS[key] = compile_adapter(source, step.kernel, tag)
    return int(adapter.address)


def _lowerable(step: Any) -> bool:
    """A kernel step whose kernel is loaded and final, with no index checks to run."""
    source = getattr(step, "source", None)
    return (
        source is not None
        and step.kernel is not None
        and step.tier is None
        and not step.checks
        and all(v.aval.dtype.name in _DTYPES for v in [*source.inputs, *source.outputs])
    )


_DTYPES = ("float64", "float32", "int64", "int32", "bool")


class _Table:
    """The step table under construction, shared by a plan's segments."""

    def __init__(self, env: list[Any], static: AbstractSet[int]):
        self.env, self.static = env, static
        self.code: list[int] = []
        self.starts: list[int] = []
        self.floats: list[float] = []
        self.adapters: list[int] = []
        self.pointer: dict[int, int] = {}  # env slot -> index in the pointer table
        self.fixed: dict[int, int] = {}  # pointer index -> address known once for all

    def index(self, slot: int) -> int:
        return self.pointer.setdefault(slot, len(self.pointer))

    def static_operand(self, slot: int, dtype: np.dtype) -> bool:
        """Record a fixed slot's address; False if the kernel cannot see it as it is."""
        value = self.env[slot]
        if not (
            isinstance(value, np.ndarray) and value.flags.c_contiguous and value.dtype == dtype
        ):
            return False
        self.fixed[self.index(slot)] = value.ctypes.data
        return True

    def scalar(self, value: Any) -> int:
        if np.asarray(value).dtype.name in FLOATS:
            self.floats.append(float(value))
            return len(self.floats) - 1
        return int(value)


class Segment:
    """Steps `first` .. `first + count - 1` of the table, run by one call into the
    interpreter after the arguments they read are checked and their fresh outputs are
    allocated."""

    def __init__(self, table: _Table, first: int, host: Sequence[Callable[[], None]]):
        self.table, self.first, self.count = table, first, 0
        self.host = list(host)  # the same steps, one by one
        self.reads: list[tuple[int, int, np.dtype]] = []  # (slot, pointer, dtype)
        self.fresh: list[tuple[Any, ...]] = []  # (shape, dtype, k, view, slot, pointer)
        self.known: set[int] = set()  # dynamic slots whose address this segment sets
        self.env = table.env

    def add(self, step: Any, call: Callable[[], None]) -> bool:
        """Append a kernel step; False (nothing added) if it cannot run here."""
        table = self.table
        operands: list[tuple[int, str]] = []
        row: list[int] = [*step.sizes, step.nchunks, *map(table.scalar, step.scalars)]
        reads: list[tuple[int, int, np.dtype]] = []
        fresh_outputs: list[tuple[Any, ...]] = []
        for var, slot, reshape in zip(step.source.inputs, step.ins, step._reshape_in, strict=True):
            shape = (var.aval.size,) if reshape else var.aval.shape
            dtype = var.aval.dtype
            if slot in table.static:
                if not table.static_operand(slot, dtype):
                    return False
            elif slot not in self.known and all(slot != r[0] for r in reads):
                reads.append((slot, table.index(slot), dtype))  # an argument, or a host's
            operands.append((len(shape), dtype.name))
            row += [table.index(slot), *shape]
        fresh = {k: entry for k, *entry in step._fresh}
        for k, ((shape, dtype), slot, buffer) in enumerate(
            zip(step.allocations, step.outs, step._buffers, strict=True)
        ):
            if buffer is not None:
                if not table.static_operand(buffer, dtype):
                    return False
                row += [table.index(buffer), *shape]
            else:
                _, _, view, _ = fresh[k]
                fresh_outputs.append((shape, dtype, k, view, slot, table.index(slot)))
                row += [table.index(slot), *shape]
            operands.append((len(shape), dtype.name))
        table.starts.append(len(table.code))
        table.code += [KERNEL, len(table.adapters), *row]
        table.adapters.append(_adapter_address(step, operands))
        self.reads += reads
        self.fresh += fresh_outputs
        self.known.update(entry[0] for entry in reads)
        self.known.update(entry[4] for entry in fresh_outputs)
        self.host.append(call)
        self.count += 1
        return True

    def finish(self, arrays: tuple[np.ndarray, ...]) -> None:
        """Take the finished table's arrays (shared by the plan's segments)."""
        self.code, self.starts, self.floats, self.addresses, self.ptrs = arrays
        indices = [index for _, index, _ in self.reads] + [entry[5] for entry in self.fresh]
        self.indices = np.array(indices or [len(self.ptrs) - 1], np.int64)  # or the scratch

    def __call__(self) -> None:
        env = self.env
        arrays = []
        for slot, _, dtype in self.reads:
            value = env[slot]
            if not (
                isinstance(value, np.ndarray) and value.flags.c_contiguous and value.dtype == dtype
            ):
                for call in self.host:
                    call()
                return
            arrays.append(value)
        for shape, dtype, k, view, slot, _ in self.fresh:
            buffer = staggered_empty(shape, dtype, k)
            env[slot] = buffer if view is None else buffer.reshape(view)
            arrays.append(buffer)
        if not arrays:  # the interpreter takes one tuple kind at least: a scratch address
            arrays.append(self.ptrs)
        run_steps(
            self.code,
            self.starts,
            self.first,
            self.count,
            self.ptrs,
            self.floats,
            self.addresses,
            self.indices,
            tuple(arrays),
        )


def lower(
    steps: Sequence[Any],
    calls: Sequence[Callable[[], None]],
    env: list[Any],
    static: AbstractSet[int],
) -> list[Callable[[], None]]:
    """The calls of an arena whose steps are settled (`calls[i]` runs `steps[i]` on
    `env`), with each run of kernels made one call into the interpreter."""
    table = _Table(env, static)
    out: list[Callable[[], None]] = []
    segments: list[Segment] = []
    segment: Segment | None = None
    for step, call in zip(steps, calls, strict=True):
        if _lowerable(step):
            if segment is None:
                segment = Segment(table, len(table.starts), [])
            if segment.add(step, call):
                if segment.count == 1:
                    segments.append(segment)
                    out.append(segment)
                continue
        segment = None
        out.append(call)
    ptrs = np.zeros(len(table.pointer) + 1, np.int64)  # the last: a scratch entry
    for index, address in table.fixed.items():
        ptrs[index] = address
    arrays = (
        np.array(table.code, np.int64),
        np.array(table.starts, np.int64),
        np.array(table.floats or [0.0], np.float64),
        np.array(table.adapters, np.int64),
        ptrs,
    )
    for segment in segments:
        segment.finish(arrays)
    return out
