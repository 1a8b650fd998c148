"""A loop that makes a row value (a softmax's row sum, a layer norm's root) stores that
value, not its broadcast, for a later loop to read (`compiler.row_loads`): bench M2's
softmax stored its row sums and its second layer norm its roots broadcast to (8, 128, 128)
for their backward loops, a full array written and read back for 128 values a row.
Oracles: the reference interpreter (each op by NumPy) and NumPy written by hand; the step
runner's and the plan interpreter's bits agree; finite differences in float64. ~6 s warm.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.executable import _KernelStep
from test_fusion_roots import _run, sync  # noqa: F401  (sync: an autouse fixture)

TOL = {np.float32: 3e-5, np.float64: 1e-12}


def attention(w: Any, v: Any, x: Any) -> Any:
    s = x @ w
    p = fnp.exp(s - fg.stop_gradient(fnp.max(s, axis=-1, keepdims=True)))
    p = p / fnp.sum(p, axis=-1, keepdims=True)
    return fnp.sum((p @ v) ** 2)


def attention_numpy(w: np.ndarray, v: np.ndarray, x: np.ndarray) -> float:
    s = x @ w
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    return float(np.sum((p @ v) ** 2))


def norm_mlp(w: Any, gain: Any, x: Any) -> Any:
    """A residual, then a layer norm: its forward loop makes the root of each row."""
    y = x + x @ w
    d = y - fnp.mean(y, axis=-1, keepdims=True)
    h = d / fnp.sqrt(fnp.mean(d * d, axis=-1, keepdims=True) + 1e-5) * gain
    return fnp.sum((h @ w) ** 2)


def norm_mlp_numpy(w: np.ndarray, gain: np.ndarray, x: np.ndarray) -> float:
    y = x + x @ w
    d = y - y.mean(axis=-1, keepdims=True)
    h = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5) * gain
    return float(np.sum((h @ w) ** 2))


def _inputs(f: Any, dtype: Any) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 24, 32)).astype(dtype)
    w = (0.2 * rng.standard_normal((32, 32))).astype(dtype)
    second = (1 + 0.1 * rng.standard_normal(32)) if f is norm_mlp else rng.standard_normal((32, 8))
    return w, second.astype(dtype), x


def _broadcasts_stored(jf: Any, args: tuple[np.ndarray, ...]) -> list[tuple[int, ...]]:
    """Shapes of the broadcasts of row values that the plan's loops store."""
    found = []
    for step in jf.lower(*args).executable.plan:
        if isinstance(step, _KernelStep):
            made = {id(n.out): n for n in step.loop.nodes}
            for v in step.loop.outputs:
                n = made[id(v)]
                if n.op.name == "broadcast_to" and id(n.inputs[0]) in made:
                    found.append(v.aval.shape)
    return found


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("f", "oracle"), [(attention, attention_numpy), (norm_mlp, norm_mlp_numpy)]
)
def test_a_row_value_is_stored_not_its_broadcast(f: Any, oracle: Any, dtype: Any):
    args = _inputs(f, dtype)
    steps, jf = _run(f, args, "steps")
    vm, _ = _run(f, args, "vm")
    assert _broadcasts_stored(jf, args) == []
    reference = fg.jit(fg.value_and_grad(f, argnums=(0, 1)), fuse=False)(*args)
    for a, b, r in zip(steps, vm, [reference[0], *reference[1]], strict=True):
        assert np.array_equal(a, b)  # the interpreter gives the step runner's bits
        np.testing.assert_allclose(a, r, rtol=TOL[dtype], atol=TOL[dtype] * np.abs(r).max())
    want = oracle(*(a.astype(np.float64) for a in args))
    np.testing.assert_allclose(steps[0], want, rtol=TOL[dtype])


@pytest.mark.parametrize("f", [attention, norm_mlp])
def test_row_loads_keep_second_derivatives(f: Any):
    rng = np.random.default_rng(4)
    w = 0.2 * rng.standard_normal((5, 5))
    second = 1 + 0.1 * rng.standard_normal(5) if f is norm_mlp else rng.standard_normal((5, 3))
    fg.testing.check_grads(f, (w, second, rng.standard_normal((2, 3, 5))), order=2, modes=("rev",))
