"""The plan interpreter (config.runtime = "vm") against the step runner: random programs and
their gradients give the same bits either way, float32 and float64; arguments the kernels
cannot see as they are (not contiguous) run the steps one by one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime.plan_table import Segment
from fastgrad.testing import strategies as fst


@pytest.fixture(scope="module")
def sync() -> Iterator[None]:
    before = config.compile, config.runtime
    config.update("compile", "sync")
    yield
    config.update("compile", before[0])
    config.update("runtime", before[1])


def _jitted(f: Any, runtime: str) -> Any:
    """`fg.jit(f)` whose plans (built at a first call with new shapes) use `runtime`."""
    jf = fg.jit(f)

    def call(*args: Any) -> Any:
        config.update("runtime", runtime)
        try:
            return jf(*args)
        finally:
            config.update("runtime", "steps")

    call.lower = jf.lower  # type: ignore[attr-defined]
    return call


def _segments(jf: Any, args: Any) -> int:
    arena = jf.lower(*args).executable.arena
    return sum(isinstance(call, Segment) for call in arena.calls)


def _same_bits(a: Any, b: Any) -> None:
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True), (x, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_random_programs_give_the_step_runners_bits(sync: None, dtype: Any, data: Any) -> None:
    program = data.draw(fst.programs(max_steps=4))
    xs = data.draw(st.tuples(*(fst.arrays(s, dtype, "real") for s in program.shapes)))

    def value_and_grads(*args: Any) -> Any:
        n = len(args)
        value, grads = fg.value_and_grad(lambda *a: fnp.sum(program(*a)), argnums=tuple(range(n)))(
            *args
        )
        return (program(*args), value, *grads)

    steps, vm = _jitted(value_and_grads, "steps"), _jitted(value_and_grads, "vm")
    expected = steps(*xs)
    for _ in range(2):  # the first call settles the plan, the next ones run the table
        _same_bits(expected, vm(*xs))
    assert _segments(vm, xs) >= 1
    other = [x * 0.5 for x in xs]
    _same_bits(steps(*other), vm(*other))


def test_kernels_run_as_segments_and_fall_back_on_strided_arguments(sync: None) -> None:
    def f(x: Any, y: Any) -> Any:
        a = fnp.tanh(x) * y + 1.0
        return fnp.sum(a * a, axis=0), fnp.exp(-a)

    x, y = np.linspace(-1, 1, 12).reshape(4, 3), np.linspace(0, 1, 3)
    steps, vm = _jitted(f, "steps"), _jitted(f, "vm")
    _same_bits(steps(x, y), vm(x, y))
    assert _segments(vm, (x, y)) >= 1
    strided = np.linspace(-1, 1, 24).reshape(4, 6)[:, ::2]  # not contiguous: host steps
    _same_bits(steps(strided, y), vm(strided, y))
    _same_bits(steps(x, y), vm(x, y))  # and back


def test_segments_between_host_steps(sync: None) -> None:
    """Kernels around matmuls and views: segments read what host steps wrote, and a
    kernel reading a transposed buffer (not contiguous) stays a host step."""

    def f(a: Any, w: Any) -> Any:
        h = fnp.tanh(a @ w)
        return fnp.sum(fnp.exp(h.T) * fnp.sin(w), axis=1), (h * h) @ w.T

    a, w = np.linspace(-1, 1, 9).reshape(3, 3), np.linspace(0, 1, 9).reshape(3, 3)
    for dtype in (np.float32, np.float64):
        steps, vm = _jitted(f, "steps"), _jitted(f, "vm")
        args = (a.astype(dtype), w.astype(dtype))
        for _ in range(3):
            _same_bits(steps(*args), vm(*args))
        assert _segments(vm, args) >= 1


def test_runtime_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="runtime"):
        config.update("runtime", "fast")
