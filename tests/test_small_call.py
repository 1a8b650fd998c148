"""The small-call path (runtime.small_call): a jitted function whose plan the interpreter
runs as one segment, called again with the same argument layouts, runs as one generated
function. Its results are the step runner's bits, always fresh arrays (arguments
returned are copied, on every path); it runs kernels' index checks and returns views;
other layouts, plans that return constants, and calls racing from other threads take the
arena's path and agree; small loops take few chunks, large ones as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import config
from fastgrad.runtime.executable import MAX_CHUNKS, MIN_CHUNK, PARALLEL_THRESHOLD, _KernelStep
from fastgrad.testing import strategies as fst


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


def test_read_only_arguments_do_not_compile_the_interpreter_again() -> None:
    """A read-only array is another Numba type: the small call runs the entry compiled for
    its segment (the dispatcher compiled the interpreter inside the call, ~0.5-0.9 s)."""
    from fastgrad.runtime.vm import run_steps

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((2, 16))
    jf = fg.jit(fg.value_and_grad(_loss, argnums=(0, 1)))
    expected = jf(x, y)  # lowered for writable arrays
    kinds = len(run_steps.overloads)
    x.flags.writeable = y.flags.writeable = False
    for _ in range(4):  # the small call is built from these calls' read-only arguments
        value, (gx, gy) = jf(x, y)
        _same_bits([expected[0], *expected[1]], [value, gx, gy])
    assert all(callable(small) for small in _small(jf))
    assert len(run_steps.overloads) == kinds


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


def _owned(outs: Any, *args: np.ndarray) -> None:
    """Every output is an array of the caller's own: no memory shared with an argument."""
    for out in outs:
        assert type(out) is np.ndarray
        assert not any(np.shares_memory(out, a) for a in args if out.size and a.size)


@pytest.mark.parametrize(
    "f",
    [
        lambda x: (fnp.exp(x), x),  # an argument returned as it is
        lambda x: (fnp.tanh(x).T, fnp.sum(x)),  # a view of a fresh result
        lambda x: (x.T, fnp.sin(x)),  # a view of an argument
        lambda x: (x[1], fnp.reshape(fnp.cos(x), (3, 2)), x),  # two views and the argument
        lambda x, y: (fnp.sin(x), y),  # an argument the plan does not read
    ],
)
def test_plans_returning_views_and_arguments_take_the_small_path(f: Any) -> None:
    args = [np.linspace(-1, 1, 6).reshape(2, 3), np.ones(2)][: f.__code__.co_argcount]
    jf = fg.jit(f)
    expected = _steps(f, *args)
    for _ in range(4):
        out = jf(*args)
        _same_bits(expected, out)
        _owned(out, *args)
    assert all(callable(small) for small in _small(jf))
    for a in jf(*args):
        a[...] = 7.0  # the caller owns what it receives: later calls do not see it
    _same_bits(expected, jf(*args))
    assert np.array_equal(args[0], np.linspace(-1, 1, 6).reshape(2, 3))


def test_plans_returning_constants_take_the_arena_path() -> None:
    def f(x: Any) -> Any:
        return fnp.sin(x), fnp.zeros(3)

    x = np.linspace(-1, 1, 6).reshape(2, 3)
    jf = fg.jit(f)
    expected = _steps(f, x)
    for _ in range(3):
        _same_bits(expected, jf(x))
    assert False in _small(jf)
    for a in jf(x):
        a[...] = 7.0
    _same_bits(expected, jf(x))


@pytest.mark.parametrize("runtime", ["steps", "vm", "reference"])
def test_an_argument_returned_is_a_copy(runtime: str) -> None:
    """JAX returns new arrays, torch.compile the argument itself; fastgrad's outputs are
    always fresh (runtime.ownership), so an argument returned is copied, on every path."""
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    config.update("runtime", "vm" if runtime == "reference" else runtime)
    try:
        for f in [lambda x: x, lambda x: x.T, lambda x: (x, x)]:
            jf = fg.jit(f, fuse=runtime != "reference")
            for _ in range(3):
                out = jf(x)
                outs = out if isinstance(out, tuple) else (out,)
                _owned(outs, x)
                _same_bits([f(x)] if not isinstance(out, tuple) else f(x), outs)
    finally:
        config.update("runtime", "vm")


def test_index_checks_run_in_the_small_call() -> None:
    """A gather by an argument's indices (the MLP's cross-entropy) takes the small path,
    and an index out of bounds raises NumPy's IndexError there too."""

    def loss(z: Any, labels: Any) -> Any:
        return fnp.sum(fnp.tanh(z)[np.arange(4), labels])

    vg = fg.value_and_grad(loss)
    z = np.linspace(-1, 1, 12).reshape(4, 3).astype(np.float32)
    labels = np.array([0, 2, 1, -1])
    expected = _steps(vg, z, labels)
    jf = fg.jit(vg)
    for _ in range(4):
        value, grad = jf(z, labels)
        _same_bits([expected[0], expected[1]], [value, grad])
    assert all(callable(small) for small in _small(jf))
    bad = np.array([0, 3, 1, 0])
    with pytest.raises(IndexError, match="index 3 is out of bounds for axis 1 with size 3"):
        jf(z, bad)
    _same_bits([expected[0], expected[1]], list(jf(z, labels)))


def test_alternating_layouts_agree() -> None:
    """The latest call's small call is tried first: another layout, another dtype or
    another structure between calls takes its own path, and back."""

    def f(x: Any, y: Any) -> Any:
        return fnp.exp(x) * y

    a = (np.linspace(-1, 1, 6).reshape(2, 3), np.linspace(0, 1, 3))
    b = (a[0].astype(np.float32), a[1].astype(np.float32))
    c = (np.asfortranarray(a[0]), a[1])
    d = (a[0], 2.0)  # a Python scalar: not the fast path
    jf = fg.jit(f)
    for args in [a, b, a, c, a, d, a, b, b, a, c, c, a, d, d] * 2:
        _same_bits([_steps(f, *args)], [jf(*args)])
    assert sum(callable(small) for small in _small(jf)) == 2  # a and b; c is not one segment


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


def _laid_out(x: np.ndarray, layout: str) -> np.ndarray:
    """`x`'s values in memory laid out as `layout` says."""
    if layout == "F":
        return np.asfortranarray(x)
    if x.ndim and layout == "strided":  # every other element of a wider array
        wide = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    if x.ndim and layout == "reversed":  # negative strides
        return np.ascontiguousarray(x[::-1])[::-1]
    return np.ascontiguousarray(x)


def _fill(outs: Any) -> None:
    """Write into every array a call returned, as a caller owning them may."""
    for out in outs:
        out[...] = 7.0


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_random_programs_and_layouts_give_the_step_runners_bits(data: Any) -> None:
    program = data.draw(fst.programs(max_steps=4))
    n = len(program.shapes)
    dtypes = data.draw(st.lists(st.sampled_from([np.float32, np.float64]), min_size=n, max_size=n))
    xs = [data.draw(fst.arrays(s, d, "real")) for s, d in zip(program.shapes, dtypes, strict=True)]
    layouts = data.draw(
        st.lists(st.sampled_from(["C", "F", "strided", "reversed"]), min_size=n, max_size=n)
    )
    args = [_laid_out(x, layout) for x, layout in zip(xs, layouts, strict=True)]

    def f(*a: Any) -> Any:
        value, grads = fg.value_and_grad(lambda *b: fnp.sum(program(*b)), argnums=tuple(range(n)))(
            *a
        )
        out = program(*a)
        return (out, fnp.transpose(out), value, *grads, a[0])  # a view, and an argument

    expected = _steps(f, *args)
    jf = fg.jit(f)
    for _ in range(4):  # settle, lower, decide on the small call, run it
        outs = jf(*args)
        _same_bits(expected, outs)
        _owned(outs, *args)
        _fill(outs)
    event("small call" if any(map(callable, _small(jf))) else "arena path")
    other = [a * 0.5 for a in args]
    _same_bits(_steps(f, *other), jf(*other))
    _same_bits(expected, jf(*args))


@pytest.mark.parametrize("shapes", [[(0, 3), ()], [(), ()], [(0,), (0,)]])
def test_size_zero_and_zero_d_arguments(shapes: list[tuple[int, ...]]) -> None:
    def f(x: Any, s: Any) -> Any:
        value, (gx, gs) = fg.value_and_grad(
            lambda x, s: fnp.sum(fnp.sin(x) * s) + fnp.sum(s * s), argnums=(0, 1)
        )(x, s)
        return value, gx, gs, fnp.exp(x).T, x

    args = [np.full(shape, 0.5) for shape in shapes]
    args[1] = args[1].astype(np.float32)
    expected = _steps(f, *args)
    jf = fg.jit(f)
    for _ in range(4):
        outs = jf(*args)
        _same_bits(expected, outs)
        _owned(outs, *args)
        _fill(outs)
