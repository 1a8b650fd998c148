"""A big matrix read once by both of its products (compiler.readonce, codegen.products),
with the size rule lowered so that small programs take it: values and gradients against
NumPy in float64 (both dtypes, row counts below, at and past a block, every form of
both products, a transposed or strided X, row vectors and scalars in r's cone), the
plan's shape, the step runner's bits from the interpreter, the plan stored and read
back, one thread's bits from two; programs the rule leaves to BLAS. ~20 s warm."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import readonce
from fastgrad.compiler.codegen.products import block_rows
from fastgrad.compiler.fusion import Loop
from fastgrad.core.config import config
from test_plan_cache import _plan_form, _same_bits, _three_ways
from test_tiers import held, plan  # noqa: F401  (a fixture)


@pytest.fixture(autouse=True)
def small(compiled_first_call: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every matrix is big enough; the kernels run (sync compiles); the runtime restored."""
    monkeypatch.setattr(readonce, "MIN_BYTES", 0)
    monkeypatch.setattr(readonce, "MIN_COLUMNS", 2)  # (short rows reach every case)
    before = config.runtime, config.plan_cache
    config.update("plan_cache", False)  # (plans on disk do not know the lowered rule)
    yield
    config.update("runtime", before[0])
    config.update("plan_cache", before[1])


def _fused(f: Callable[..., Any], *args: np.ndarray) -> int:
    """How many of the plan's loops read a matrix once."""
    steps = fg.jit(f).lower(*args).executable.steps
    return sum(isinstance(s, Loop) and readonce.form(s) is not None for s in steps)


def _logistic(w: Any, x: Any, y: Any) -> Any:
    z = x @ w
    return fnp.mean(fnp.logaddexp(0.0, z) - y * z)


def _logistic_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """_logistic's value and gradient in w, in float64."""
    w, x, y = (a.astype(np.float64) for a in (w, x, y))
    z = x @ w
    r = (1.0 / (1.0 + np.exp(-z)) - y) / len(z)
    return float(np.mean(np.logaddexp(0.0, z) - y * z)), x.T @ r


TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _inputs(n: int, k: int, dtype: Any, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k)).astype(dtype)
    y = (rng.random(n) < 0.5).astype(dtype)
    w = (rng.standard_normal(k) * 0.3).astype(dtype)
    return w, x, y


def _close(got: np.ndarray, want: np.ndarray, dtype: Any) -> None:
    got = np.asarray(got)
    assert got.dtype == dtype
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got.astype(np.float64) - want).max() <= TOL[dtype] * scale


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 7, 33, 301, 2 * block_rows(10, 8) + 5])
def test_logistic_gradient(dtype: Any, n: int) -> None:
    """bench M5's loss at odd row counts, fewer rows than a block among them: one loop
    reads x once, and the value and gradient are float64 NumPy's within rounding."""
    w, x, y = _inputs(n, 10, dtype)
    f = fg.value_and_grad(_logistic)
    assert _fused(f, w, x, y) == 1
    value, grad = fg.jit(f)(w, x, y)
    want_value, want_grad = _logistic_grad(w, x, y)
    _close(value, np.asarray(want_value), dtype)
    _close(grad, want_grad, dtype)


def _forms(first: str, transposed: bool, extra: bool) -> Callable[..., Any]:
    """A function of (v, a, y, s) whose gradient in v reads X twice: z by `first`
    ("X @ v" or "v @ X.T"), the backward product the VJP of that spelling (X.T @ r or
    r @ X); X = a, or a.T where `transposed`. With `extra`, a second row vector s and a
    scalar in r's cone."""

    def f(v: Any, a: Any, y: Any, s: Any) -> Any:
        x = a.T if transposed else a
        z = x @ v if first == "X @ v" else v @ x.T
        loss = fnp.logaddexp(0.0, z) - y * z
        if extra:
            loss = loss * s + 0.5 * fnp.tanh(z) * s
        return fnp.sum(loss)

    return f


def _numpy_forms(v, a, y, s, transposed, extra):  # type: ignore[no-untyped-def]
    v, a, y, s = (t.astype(np.float64) for t in (v, a, y, s))
    x = a.T if transposed else a
    z = x @ v
    r = 1.0 / (1.0 + np.exp(-z)) - y
    if extra:
        r = r * s + 0.5 * (1.0 - np.tanh(z) ** 2) * s
    return x.T @ r


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("first", ["X @ v", "v @ X.T"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("extra", [False, True])
def test_forms(dtype: Any, first: str, transposed: bool, extra: bool) -> None:
    """Both spellings of the first product (so both of the second), X as an array or
    the transpose of one, a row vector and a scalar in r's cone besides y."""
    n, k = 203, 9
    rng = np.random.default_rng(1)
    a = rng.standard_normal((k, n) if transposed else (n, k)).astype(dtype)
    v = (rng.standard_normal(k) * 0.3).astype(dtype)
    y = (rng.random(n) < 0.5).astype(dtype)
    s = rng.random(n).astype(dtype)
    g = fg.grad(_forms(first, transposed, extra))
    assert _fused(g, v, a, y, s) == 1
    _close(fg.jit(g)(v, a, y, s), _numpy_forms(v, a, y, s, transposed, extra), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_matrix(dtype: Any) -> None:
    """X a strided view of the argument (every other column): read through its strides."""
    w, x, y = _inputs(150, 16, dtype)
    wide = np.repeat(x, 2, axis=1)

    def f(w: Any, wide: Any, y: Any) -> Any:
        return _logistic(w, wide[:, ::2], y)

    g = fg.value_and_grad(f)
    assert _fused(g, w, wide, y) == 1
    for layout in (wide, np.asfortranarray(wide)):  # (another layout: a plan of its own)
        results = []
        for runtime in ("steps", "vm"):
            config.update("runtime", runtime)
            jitted = fg.jit(g)
            for _ in range(3):  # (lowered for the interpreter after the first calls)
                value, grad = jitted(w, layout, y)
            _close(grad, _logistic_grad(w, x, y)[1], dtype)
            results.append((value, grad))
        _same_bits(*results)


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 300),
    k=st.integers(2, 40),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_random_shapes(n: int, k: int, dtype: Any, seed: int) -> None:
    w, x, y = _inputs(n, k, dtype, seed)
    value, grad = fg.jit(fg.value_and_grad(_logistic))(w, x, y)
    want_value, want_grad = _logistic_grad(w, x, y)
    _close(value, np.asarray(want_value), dtype)
    _close(grad, want_grad, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_step_runner_bits(dtype: Any) -> None:
    """The interpreter's bits are the step runner's (one kernel, both runners)."""
    w, x, y = _inputs(777, 12, dtype)
    results = []
    for runtime in ("steps", "vm"):
        config.update("runtime", runtime)
        f = fg.jit(fg.value_and_grad(_logistic))
        for _ in range(3):  # (lowered for the interpreter after the first calls)
            out = f(w, x, y)
        results.append(out)
    _same_bits(*results)


def test_bits_do_not_depend_on_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows enough for the parallel kernel (2^18): its bits are the serial kernel's."""
    from fastgrad.runtime import executable

    w, x, y = _inputs(1 << 18, 3, np.float32)
    f = fg.value_and_grad(_logistic)
    parallel = fg.jit(f)(w, x, y)
    monkeypatch.setattr(executable, "numba_threads", lambda: 1)
    serial = fg.jit(f)(w, x, y)
    _same_bits(parallel, serial)


def test_stored_plan(plans: Path) -> None:
    """The plan stores and reads back as it was built, with the same bits."""
    w, x, y = _inputs(101, 5, np.float64)
    f = fg.value_and_grad(_logistic)
    fresh, saved, loaded = _three_ways(plans, f, (w, x, y))
    assert _plan_form(loaded.executable) == _plan_form(fresh.executable)
    assert loaded.kernels == fresh.kernels
    _same_bits(fresh.executable([w, x, y]), loaded.executable([w, x, y]))
    _same_bits(fg.jit(f)(w, x, y), fresh.executable([w, x, y]))


def test_left_to_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone product (the forward pass), a Gram-like X.T @ (X @ v) with nothing between,
    a product whose r is not elementwise in z, rows shorter than MIN_COLUMNS, and any
    matrix below the size rule."""
    w, x, y = _inputs(64, 8, np.float64)
    assert _fused(_logistic, w, x, y) == 0
    assert _fused(lambda w, x: x.T @ (x @ w), w, x) == 0
    assert _fused(lambda w, x: x.T @ fnp.cumsum(x @ w), w, x) == 0
    assert _fused(fg.value_and_grad(lambda w, x: fnp.sum(fnp.sort(x @ w) ** 2)), w, x) == 0
    monkeypatch.setattr(readonce, "MIN_COLUMNS", 8)  # rows of 8: just long enough
    assert _fused(fg.value_and_grad(_logistic), w, x, y) == 1
    monkeypatch.setattr(readonce, "MIN_COLUMNS", 9)  # rows too short
    assert _fused(fg.value_and_grad(_logistic), w, x, y) == 0
    monkeypatch.setattr(readonce, "MIN_COLUMNS", 2)
    monkeypatch.setattr(readonce, "MIN_BYTES", x.nbytes + 1)
    assert _fused(fg.value_and_grad(_logistic), w, x, y) == 0


def test_numpy_tier(held: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # noqa: F811
    """While its kernel compiles, the loop runs its nodes with NumPy (the products
    np.matmul's, r's cone NumPy's ufuncs): float64 NumPy's values within rounding."""
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))  # nothing on disk
    w, x, y = _inputs(97, 6, np.float64)
    f = fg.jit(fg.value_and_grad(_logistic))
    value, grad = f(w, x, y)
    steps = [s for s in plan(f).plan if hasattr(s, "tier")]
    assert held.jobs and all(s.kernel is None for s in steps)  # no kernel ran: NumPy did
    want_value, want_grad = _logistic_grad(w, x, y)
    _close(value, np.asarray(want_value), np.float64)
    _close(grad, want_grad, np.float64)


def test_square_matrix_vector_read_by_the_cone() -> None:
    """A square X whose v is also a row vector of r's cone (elementwise with z)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 40))
    w = rng.standard_normal(40) * 0.2

    def f(w: Any, x: Any) -> Any:
        z = x @ w
        return fnp.sum(fnp.tanh(z) * w)

    g = fg.grad(f)
    assert _fused(g, w, x) == 1
    z = x @ w
    want = x.T @ ((1.0 - np.tanh(z) ** 2) * w) + np.tanh(z)
    _close(fg.jit(g)(w, x), want, np.float64)
