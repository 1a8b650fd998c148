"""The small-call path (runtime.small_call): a jitted function whose plan the interpreter
runs as one segment, called again with the same argument layouts, runs as one generated
function. Its results are the step runner's bits, always fresh arrays; other layouts,
plans that return views, arguments or constants, and calls racing from other threads
take the arena's path and agree; small loops take few chunks, large ones as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime.executable import MAX_CHUNKS, MIN_CHUNK, PARALLEL_THRESHOLD, _KernelStep


@pytest.fixture(scope="module", autouse=True)
def sync_vm() -> Iterator[None]:
    before = config.compile, config.runtime
    config.update("compile", "sync")
    config.update("runtime", "vm")
    yield
    config.update("compile", before[0])
    config.update("runtime", before[1])


def _loss(x: Any, y: Any) -> Any:
    return fnp.sum(fnp.tanh(x * y + fnp.sin(x)) * fnp.exp(-y * y) / (1 + x * x))


def _small(jf: Any) -> list[Any]:
    """The small calls of `jf`'s fast entries (None: not decided yet; False: none)."""
    return [entry.small for entry in jf._fast.values()]


def _steps(f: Any, *args: Any) -> Any:
    config.update("runtime", "steps")
    try:
        return fg.jit(f)(*args)
    finally:
        config.update("runtime", "vm")


def _same_bits(a: Any, b: Any) -> None:
    for x, y in zip(a, b, strict=True):
        assert type(x) is type(y) is np.ndarray and x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True), (x, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_value_and_grad_runs_as_one_small_call(dtype: Any) -> None:
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(16).astype(dtype) for _ in range(2))
    vg = fg.value_and_grad(_loss, argnums=(0, 1))
    expected = _steps(vg, x, y)
    jf = fg.jit(vg)
    seen = []
    for _ in range(4):  # settle and lower, decide, then small calls
        value, (gx, gy) = jf(x, y)
        _same_bits([expected[0], *expected[1]], [value, gx, gy])
        seen.append((value, gx, gy))
    assert all(callable(small) for small in _small(jf))
    # Fresh arrays at every call, none shared with another call's.
    ids = [id(a) for call in seen for a in call]
    assert len(set(ids)) == len(ids)
    assert value.shape == () and not any(np.shares_memory(value, g) for g in (gx, gy))


def test_other_layouts_take_the_arena_path() -> None:
    def f(x: Any, y: Any) -> Any:
        return fnp.exp(x) * y, fnp.sum(fnp.sin(x) * y, axis=1)

    x = np.linspace(-1, 1, 12).reshape(4, 3)
    y = np.linspace(0, 2, 3)
    jf = fg.jit(f)
    for _ in range(3):
        jf(x, y)
    assert any(callable(small) for small in _small(jf))
    strided = np.linspace(-1, 1, 24).reshape(4, 6)[:, ::2]
    for args in [(strided, y), (np.asfortranarray(x), y), (x, y), (x.astype(np.float32), y)]:
        for _ in range(3):
            _same_bits(_steps(f, *args), jf(*args))
    # The strided layout got a fast entry of its own, which the segment was not built for.
    assert False in _small(jf)


@pytest.mark.parametrize(
    "f",
    [
        lambda x: (fnp.exp(x), x),  # an argument returned as it is
        lambda x: (fnp.tanh(x).T, fnp.sum(x)),  # a view of a fresh result
        lambda x: (fnp.sin(x), fnp.zeros(3)),  # a constant
    ],
)
def test_plans_returning_what_they_do_not_allocate_take_the_arena_path(f: Any) -> None:
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    jf = fg.jit(f)
    expected = _steps(f, x)
    for _ in range(3):
        for a, b in zip(expected, jf(x), strict=True):
            assert np.array_equal(a, b)
    assert False in _small(jf)
    first = jf(x)
    for out in first:
        if out is not x:  # the caller's own argument comes back as it is
            out[...] = 7.0  # the caller owns what it receives: later calls do not see it
    for a, b in zip(expected, jf(x), strict=True):
        assert np.array_equal(a, b)


def test_calls_racing_from_threads_agree() -> None:
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(16).astype(np.float32) for _ in range(2))
    vg = fg.value_and_grad(_loss, argnums=(0, 1))
    expected = _steps(vg, x, y)
    jf = fg.jit(vg)
    for _ in range(3):
        jf(x, y)
    failures = []

    def work() -> None:
        for _ in range(300):
            value, grads = jf(x, y)
            if not (
                np.array_equal(value, expected[0])
                and all(np.array_equal(a, b) for a, b in zip(grads, expected[1], strict=True))
            ):
                failures.append(value)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.parametrize("n", [16, 3000, PARALLEL_THRESHOLD])
def test_small_loops_take_few_chunks(n: int) -> None:
    x = np.linspace(-1, 1, n)
    jf = fg.jit(fg.grad(lambda x: fnp.sum(fnp.sin(x) * x)))
    (step,) = [s for s in jf.lower(x).executable.plan if isinstance(s, _KernelStep)]
    assert step.nchunks == max(1, min(MAX_CHUNKS, n // MIN_CHUNK))
    np.testing.assert_allclose(jf(x), np.sin(x) + x * np.cos(x), rtol=1e-12, atol=1e-15)
