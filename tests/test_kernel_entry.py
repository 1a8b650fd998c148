"""Kernels called by their native address (runtime.kernel_entry): one adapter per kernel
signature serves every kernel of it, and the interpreter's results stay the step
runner's bits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from numba import njit

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime import adapters
from fastgrad.runtime.kernel_entry import entry_address, kernel_signature
from fastgrad.runtime.plan_table import Segment


@pytest.fixture(autouse=True)
def settings() -> Iterator[None]:
    saved = {name: getattr(config, name) for name in ("compile", "runtime")}
    config.update("compile", "sync")
    yield
    for name, value in saved.items():
        config.update(name, value)


def _run(f: Any, runtime: str, *args: Any) -> Any:
    config.update("runtime", runtime)
    jf = fg.jit(f)
    out = [jf(*args) for _ in range(3)]
    assert all(np.array_equal(a, out[0]) for a in out)
    return jf, out[0]


def _adapters() -> set[Any]:
    return {k for k in adapters._JOBS if isinstance(k, str)}


def test_kernels_of_one_signature_share_an_adapter() -> None:
    x = np.linspace(-1, 1, 7)
    programs = [lambda x: fnp.sin(x) * x, lambda x: fnp.exp(x) - fnp.cos(x)]
    before = _adapters()
    for f in programs:
        jf, value = _run(f, "vm", x)
        arena = jf.lower(x).executable.arena
        assert any(isinstance(call, Segment) for call in arena.calls)
        assert np.array_equal(value, _run(f, "steps", x)[1])
    # Both kernels take (size, chunks, x, out) as float64 vectors: one adapter at most
    # (none if an earlier test built it).
    assert len(_adapters() - before) <= 1


def test_entry_address_needs_the_signature_compiled() -> None:
    @njit
    def scale(n: int, chunks: int, s: Any, x: Any, y: Any) -> None:
        for i in range(n):
            y[i] = s * x[i]

    signature = kernel_signature(1, ["float32"], [(1, "float32"), (1, "float32")])
    assert signature is not None
    assert entry_address(scale, signature) is None
    scale.compile(signature)
    assert isinstance(entry_address(scale, signature), int)
    assert kernel_signature(1, ["float16"], []) is None  # no adapter takes it
