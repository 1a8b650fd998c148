"""A loop stores one costly value (a tanh) instead of two or more cheap functions of it
that a later loop reads back (fusion's `_store_roots`): a GELU between two products (bench
M2's MLP) stores t = tanh(...) for its backward loop, not `1 + t` and `t * t`. Oracles:
NumPy written by hand and the reference interpreter; the step runner's and the plan
interpreter's bits agree. 8 cases, ~4 s warm."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime.executable import _KernelStep

C = math.sqrt(2 / math.pi)
TOL = {np.float32: 3e-5, np.float64: 1e-12}


@pytest.fixture(autouse=True)
def sync() -> Any:
    before = config.compile, config.runtime
    config.update("compile", "sync")
    yield
    config.update("compile", before[0])
    config.update("runtime", before[1])


def gelu_mlp(w1: Any, w2: Any, x: Any) -> Any:
    h = x @ w1
    return fnp.sum((0.5 * h * (1 + fnp.tanh(C * (h + 0.044715 * h**3)))) @ w2)


def gelu_mlp_numpy(w1: np.ndarray, w2: np.ndarray, x: np.ndarray) -> tuple[Any, ...]:
    h = x @ w1
    t = np.tanh(C * (h + 0.044715 * h**3))
    g = 0.5 * h * (1 + t)
    dg = np.ones((x.shape[0], w2.shape[1])) @ w2.T
    dh = dg * (0.5 * (1 + t) + 0.5 * h * (1 - t * t) * C * (1 + 3 * 0.044715 * h * h))
    return np.sum(g @ w2), x.T @ dh, g.T @ np.ones((x.shape[0], w2.shape[1]))


def tanh_gate(w1: Any, w2: Any, x: Any) -> Any:
    """h * (1 + tanh(h)): its backward reads `1 + t` and tanh's `t * t`."""
    h = x @ w1
    return fnp.sum((h * (1 + fnp.tanh(h))) @ w2)


def tanh_gate_numpy(w1: np.ndarray, w2: np.ndarray, x: np.ndarray) -> tuple[Any, ...]:
    h = x @ w1
    t = np.tanh(h)
    y = h * (1 + t)
    dy = np.ones((x.shape[0], w2.shape[1])) @ w2.T
    dh = dy * ((1 + t) + h * (1 - t * t))
    return np.sum(y @ w2), x.T @ dh, y.T @ np.ones((x.shape[0], w2.shape[1]))


def _stores(f: Any, args: tuple[Any, ...], op: str) -> list[str]:
    """The ops making what the loop computing `op` stores."""
    executable = f.lower(*args).executable
    (loop,) = [
        s.loop
        for s in executable.plan
        if isinstance(s, _KernelStep) and any(n.op.name == op for n in s.loop.nodes)
    ]
    made = {id(n.out): n.op.name for n in loop.nodes}
    return sorted(made[id(v)] for v in loop.outputs)


def _run(f: Any, args: tuple[Any, ...], runtime: str) -> tuple[list[np.ndarray], Any]:
    config.update("runtime", runtime)
    jf = fg.jit(fg.value_and_grad(f, argnums=(0, 1)))
    jf(*args)
    value, grads = jf(*args)
    return [np.asarray(value), *grads], jf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("f", "oracle", "op", "stored"),
    [
        (gelu_mlp, gelu_mlp_numpy, "tanh", ["multiply", "tanh"]),
        (tanh_gate, tanh_gate_numpy, "tanh", ["multiply", "tanh"]),
    ],
)
def test_one_costly_value_is_stored(f: Any, oracle: Any, op: str, stored: list, dtype: Any):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((32, 16)).astype(dtype)
    w1 = (rng.standard_normal((16, 64)) * 0.25).astype(dtype)
    w2 = (rng.standard_normal((64, 8)) * 0.25).astype(dtype)
    steps, jf = _run(f, (w1, w2, x), "steps")
    vm, _ = _run(f, (w1, w2, x), "vm")
    reference = fg.jit(fg.value_and_grad(f, argnums=(0, 1)), fuse=False)(w1, w2, x)
    want = oracle(*(a.astype(np.float64) for a in (w1, w2, x)))
    for a, b, r, w in zip(steps, vm, [reference[0], *reference[1]], want, strict=True):
        assert np.array_equal(a, b)
        for other in (w, r):  # sums of products of magnitude ~1e3: relative to the norm
            assert np.linalg.norm(a - other) <= TOL[dtype] * np.linalg.norm(other)
    # the forward loop stores the activation's output (read by a product) and the costly
    # value itself, not `1 + t` and `t * t` (or `1 + e` and `e * e`) beside it
    assert _stores(jf, (w1, w2, x), op) == stored
