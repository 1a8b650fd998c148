"""Calls from several threads at once give the results one thread gets.

Each test runs with a tiny switch interval, so that threads interleave inside tracing and
compiling rather than between whole calls (before, 4 threads calling an un-jitted
value_and_grad failed 896 calls in 4000, and a jitted function met another thread's
graph: "graph takes 13 inputs, got 9").
"""

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime.background import wait_idle

THREADS = 4


@pytest.fixture(autouse=True)
def tiny_switch_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def loss(w, x):
    return fnp.sum(fnp.tanh(x @ w) ** 2) + 0.5 * fnp.mean(fnp.exp(-w * w))


def _inputs(i: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    n = 3 + i % 7  # a new shape on most calls
    return rng.standard_normal((n, 2)), rng.standard_normal((5, n))


def _bits(result) -> bytes:
    value, grads = result
    return np.asarray(value).tobytes() + np.asarray(grads).tobytes()


def _in_threads(call, n_calls: int) -> list[bytes]:
    """`call(i)` for i in range(n_calls), from THREADS threads started together."""
    start = threading.Barrier(THREADS)

    def work(t: int) -> list[tuple[int, bytes]]:
        start.wait()
        return [(i, _bits(call(i))) for i in range(t, n_calls, THREADS)]

    with ThreadPoolExecutor(THREADS) as pool:
        chunks = list(pool.map(work, range(THREADS)))
    return [bits for _, bits in sorted(pair for chunk in chunks for pair in chunk)]


def test_unjitted_value_and_grad_from_threads():
    f = fg.value_and_grad(loss)
    expected = [_bits(f(*_inputs(i))) for i in range(200)]
    assert _in_threads(lambda i: f(*_inputs(i)), 200) == expected


def test_one_jitted_function_with_a_new_shape_each_call():
    calls = 120
    expected = [_bits(fg.jit(fg.value_and_grad(loss))(*_inputs(i))) for i in range(calls)]
    shared = fg.jit(fg.value_and_grad(loss))  # cold: every thread traces new shapes
    assert _in_threads(lambda i: shared(*_inputs(i)), calls) == expected


def test_a_new_jitted_function_each_call():
    calls = 80
    expected = [_bits(fg.value_and_grad(loss)(*_inputs(i))) for i in range(calls)]

    def call(i):
        return fg.jit(fg.value_and_grad(loss), fuse=False)(*_inputs(i))

    assert _in_threads(call, calls) == expected


def test_first_calls_from_threads_in_background_mode(monkeypatch):
    """Threads making a jitted function's first calls while its kernels compile in the
    background: NumPy answers, then kernels, and every answer is close to one thread's."""
    monkeypatch.setattr(config, "compile", "background")
    monkeypatch.setattr(config, "compile_notice", False)
    calls = 80
    reference = fg.jit(fg.value_and_grad(loss), fuse=False)
    expected = [reference(*_inputs(i)) for i in range(calls)]
    shared = fg.jit(fg.value_and_grad(lambda w, x: loss(w, x) * 1.0))
    results: dict[int, tuple] = {}
    lock = threading.Lock()

    def call(i):
        result = shared(*_inputs(i))
        with lock:
            results[i] = result
        return result

    _in_threads(call, calls)
    assert wait_idle(timeout=300)
    for i, (value, grads) in sorted(results.items()):
        assert np.allclose(value, expected[i][0], rtol=1e-12, atol=1e-12)
        assert np.allclose(grads, expected[i][1], rtol=1e-12, atol=1e-12)
