"""compiler.passes.fold_transposes in the whole plan: a product transposed in its last two
axes is computed as the product of the transposed operands, so the gradient of attention's
`q @ swapaxes(k)` with respect to k is written in k's layout and the reshape to rows that
reads it is a view, not a copy (bench M2). Results against NumPy written by hand (no
fastgrad code) and the reference interpreter. 12 cases, ~3 s warm."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime.plan_steps import _ViewStep

TOL = {np.float32: 2e-5, np.float64: 1e-12}


@pytest.fixture(autouse=True)
def sync() -> Any:
    before = config.compile
    config.update("compile", "sync")
    yield
    config.update("compile", before)


def _attention(x: Any, wq: Any, wk: Any) -> Any:
    """sum(softmax-free scores): the scores' gradient flows to k through swapaxes."""
    q, k = x @ wq, x @ wk
    s = q @ fnp.swapaxes(k, -1, -2)
    return fnp.sum(s * s) * 0.5


def _attention_numpy(x: np.ndarray, wq: np.ndarray, wk: np.ndarray) -> tuple[Any, ...]:
    q, k = x @ wq, x @ wk
    s = q @ np.swapaxes(k, -1, -2)
    dq = s @ k
    dk = np.swapaxes(s, -1, -2) @ q
    rows = x.reshape(-1, x.shape[-1])
    return (
        0.5 * np.sum(s * s),
        rows.T @ dq.reshape(-1, dq.shape[-1]),
        rows.T @ dk.reshape(-1, dk.shape[-1]),
    )


def _matmul_parents(graph: Any) -> list[str]:
    """The ops whose output a transpose of `graph` reads, where that op is a product."""
    made = {id(n.out): n.op.name for n in graph.nodes}
    return [
        made[id(n.inputs[0])]
        for n in graph.nodes
        if n.op.name == "transpose" and made.get(id(n.inputs[0])) == "matmul"
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("runtime", ["steps", "vm"])
def test_the_key_gradient_of_attention_is_no_copy(dtype: Any, runtime: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 8)).astype(dtype)
    wq, wk = (rng.standard_normal((8, 8)).astype(dtype) * 0.3 for _ in range(2))
    config.update("runtime", runtime)
    try:
        f = fg.jit(fg.value_and_grad(_attention, argnums=(1, 2)))
        value, (gq, gk) = f(x, wq, wk)
        value, (gq, gk) = f(x, wq, wk)
        executable = f.lower(x, wq, wk).executable
    finally:
        config.update("runtime", "vm")
    want = _attention_numpy(x.astype(np.float64), wq.astype(np.float64), wk.astype(np.float64))
    for got, w in zip((value, gq, gk), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=TOL[dtype], atol=TOL[dtype] * 10)
    assert _matmul_parents(executable.graph) == []
    # no reshape reads a transposed view (which NumPy's reshape copies)
    views = [s for s in executable.plan if isinstance(s, _ViewStep)]
    transposed = {s.out for s in views if s.op == "transpose"}
    assert [s for s in views if s.op == "reshape" and s.ins[0] in transposed] == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("a_shape", "b_shape", "axes"),
    [
        ((5, 7), (7, 3), (1, 0)),  # 2-D
        ((4, 5, 7), (4, 7, 3), (0, 2, 1)),  # batched
        ((4, 5, 7), (7, 3), (0, 2, 1)),  # a batch times one matrix
        ((2, 4, 5, 7), (4, 7, 3), (0, 1, 3, 2)),  # broadcast batch axes
        ((4, 5, 7), (4, 7, 3), (2, 1, 0)),  # not a swap of the last two: kept
    ],
)
def test_transposed_products_against_numpy(dtype: Any, a_shape: Any, b_shape: Any, axes: Any):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(a_shape).astype(dtype)
    b = rng.standard_normal(b_shape).astype(dtype)

    def f(a: Any, b: Any) -> Any:
        return (fnp.transpose(a @ b, axes) * 2.0 + 1.0,)

    jf = fg.jit(f)
    got = jf(a, b)
    want = (np.transpose(a @ b, axes) * 2.0 + 1.0,)
    reference = fg.jit(f, fuse=False)(a, b)
    for g, w, r in zip(got, want, reference, strict=True):
        np.testing.assert_allclose(g, w, rtol=TOL[dtype], atol=TOL[dtype] * 10)
        np.testing.assert_allclose(g, r, rtol=TOL[dtype], atol=TOL[dtype] * 10)
    graph = jf.lower(a, b).executable.graph
    swaps = axes == (*range(len(axes) - 2), len(axes) - 1, len(axes) - 2)
    assert _matmul_parents(graph) == ([] if swaps else ["matmul"])
