"""The NumPy tier over blocks of rows (runtime.numpy_blocks) against the same tier over
whole arrays, and against plain NumPy written out by hand: sizes just below, at and above
a multiple of the block, broadcast operands, reductions over each axis (the one over the
first axis made of per-block partials), outputs of each level, and size 0. The block is
shrunk to a few elements so that small arrays span many blocks; no kernel compiles (the
compile thread is replaced by a queue nobody releases), so the whole file takes ~2 s.
The whole-array tier itself is checked against the kernels in tests/test_tiers.py.
"""

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime import background, numpy_blocks

TOL = {"rtol": 1e-12, "atol": 1e-12}


class Held:
    """The compile thread, never run: every loop stays on NumPy."""

    def __init__(self):
        self.jobs = []

    def submit(self, job):
        self.jobs.append(job)


@pytest.fixture(autouse=True)
def held(monkeypatch):
    monkeypatch.setattr(background, "_WORKER", Held())
    monkeypatch.setattr(fg.config, "compile", "background")


def first_call(fun, args, block):
    """`fun`'s first call (on NumPy) with blocks of `block` elements, how many of its
    loops ran blocked and how many whole."""
    saved = numpy_blocks.BLOCK
    numpy_blocks.BLOCK = block
    try:
        jitted = fg.jit(fun)
        out = jitted(*args)
    finally:
        numpy_blocks.BLOCK = saved
    (traced,) = jitted._cache.values()
    tiers = [s.tier for s in traced.executable.plan if getattr(s, "tier", None)]
    blocked = sum(t.numpy_loop.blocked is not None for t in tiers)
    return out, blocked, len(tiers) - blocked


def assert_tiers_agree(fun, args, expected, block=8, blocked=True, whole=False):
    """Both tiers give `expected`; with blocks of `block` elements some loops run blocked
    (or none), and some whole (or none)."""
    reference, none, _ = first_call(fun, args, 1 << 40)
    split, count, unblocked = first_call(fun, args, block)
    assert none == 0
    assert (count > 0) == blocked and (unblocked > 0) == whole
    for a, b, c in zip(
        fg.pytree.flatten(split)[0], fg.pytree.flatten(reference)[0], expected, strict=True
    ):
        np.testing.assert_allclose(a, b, **TOL)
        np.testing.assert_allclose(a, c, **TOL)


def w1(x, y):
    return fnp.sum(fnp.tanh(x * y + fnp.sin(x)) * fnp.exp(-y * y) / (1.25 + x * x))


def w1_expected(x, y):
    t = np.tanh(x * y + np.sin(x))
    e, d = np.exp(-y * y), 1.25 + x * x
    dt = (1 - t * t) * e / d
    return [
        np.sum(t * e / d),
        dt * (y + np.cos(x)) - t * e * 2 * x / (d * d),
        dt * x - 2 * y * t * e / d,
    ]


@pytest.mark.parametrize("n", [15, 16, 17, 47, 48, 49])
def test_a_chain_and_its_gradient_across_block_boundaries(n):
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    vg = fg.value_and_grad(w1, argnums=(0, 1))
    assert_tiers_agree(vg, (x, y), w1_expected(x, y))


@pytest.mark.parametrize("shape", [(7, 3), (9, 2), (16, 1), (5, 5)])
def test_broadcast_operands_and_reductions_over_each_axis(shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape)
    b = rng.standard_normal(shape[1])  # along the last axis
    c = rng.standard_normal((shape[0], 1))  # along the first

    def f(x, b, c):
        z = fnp.tanh(x * b + c) * 0.5
        return (
            z,  # elementwise
            fnp.sum(z, axis=1),  # over the last axis: rows of the blocked axis
            fnp.max(z * z, axis=1, keepdims=True),
            fnp.sum(fnp.exp(z), axis=0),  # over the first axis: partial sums per block
            fnp.min(z - c, axis=0),
            fnp.prod(1.0 + 0.1 * z, axis=0, keepdims=True),
            fnp.sum(z * z),
        )

    z = np.tanh(x * b + c) * 0.5
    expected = [
        z,
        z.sum(1),
        (z * z).max(1, keepdims=True),
        np.exp(z).sum(0),
        (z - c).min(0),
        (1.0 + 0.1 * z).prod(0, keepdims=True),
        (z * z).sum(),
    ]
    # A square loop's (n,) operand could be a row of the reduction or a broadcast along
    # the last axis: a loop reading one runs whole.
    assert_tiers_agree(f, (x, b, c), expected, block=4, whole=shape[0] == shape[1])


def test_a_row_reduction_read_again_and_its_gradient():
    """logsumexp(x) - max(x) over the last axis: the row max and sum are read within the
    loop (the gradient is softmax less the one-hot of the max)."""
    x = np.random.default_rng(3).standard_normal((11, 4))

    def loss(x):
        z = x - fnp.max(x, axis=1, keepdims=True)
        return fnp.sum(fnp.log(fnp.sum(fnp.exp(z), axis=1)) * fnp.arange(11.0))

    z = x - x.max(1, keepdims=True)
    soft = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    w = np.arange(11.0)
    top = x == x.max(1, keepdims=True)
    expected = [np.sum(np.log(np.exp(z).sum(1)) * w), (soft - top) * w[:, None]]
    assert_tiers_agree(fg.value_and_grad(loss), (x,), expected, block=8)


def test_a_reduction_over_the_first_axis_read_again_runs_whole():
    """A softmax over the first axis: its loops that read the column sums run whole."""
    x = np.random.default_rng(4).standard_normal((20, 3))
    w = np.arange(3.0)

    def loss(x):
        e = fnp.exp(x - fnp.max(x, axis=0))
        return fnp.sum(e / fnp.sum(e, axis=0) * w)

    e = np.exp(x - x.max(0))
    soft = e / e.sum(0)
    expected = [np.sum(soft * w), soft * (w - np.sum(soft * w, axis=0))]
    assert_tiers_agree(fg.value_and_grad(loss), (x,), expected, block=4, whole=True)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0)])
def test_size_zero(shape):
    x = np.ones(shape)

    def f(x):
        return fnp.sum(fnp.sin(x) * 2.0, axis=0), fnp.cos(x) + 1.0

    expected = [np.zeros(shape[1:]), np.cos(x) + 1.0]
    assert_tiers_agree(f, (x,), expected, blocked=False, whole=True)


def test_float32_stays_float32():
    x = np.linspace(-2, 2, 37, dtype=np.float32)
    out, blocked, whole = first_call(lambda x: (fnp.tanh(x) * 2, fnp.sum(x * x)), (x,), 8)
    assert (blocked, whole) == (1, 0)
    assert out[0].dtype == np.float32 and out[1].dtype == np.float32
    np.testing.assert_allclose(out[0], np.tanh(x) * 2, rtol=1e-6)
    np.testing.assert_allclose(out[1], np.sum(x * x), rtol=1e-6)


def test_a_whole_loop_writes_into_a_value_a_reduction_has_read():
    """A ufunc's result read by a reduction and then by a ufunc: the last ufunc writes into
    it (a reduction's result is fresh memory, never a view of what it read)."""

    def softmax(x):
        e = fnp.exp(x)
        return e / fnp.sum(e, axis=1, keepdims=True)

    x = np.linspace(-1, 1, 12).reshape(3, 4)
    jitted = fg.jit(softmax)
    np.testing.assert_allclose(jitted(x), np.exp(x) / np.exp(x).sum(1, keepdims=True), **TOL)
    (traced,) = jitted._cache.values()
    (loop,) = [s.tier.numpy_loop for s in traced.executable.plan if getattr(s, "tier", None)]
    names = [getattr(impl, "__name__", "") for impl, *_ in loop.ops]
    assert loop.ops[names.index("divide")][4] == names.index("exp"), names


def test_the_whole_loop_tier_writes_large_results_into_memory_nobody_holds(monkeypatch):
    """Softmax cross-entropy's gradient (W2's loop: a scatter_add among ufuncs) over
    4 MiB arrays, on NumPy: large results go into memory of the run's own pool
    (runtime.recycling's rule), the row-shifted logits' memory serving scatter_add's
    target once dead, so a run makes 2 blocks, not 3; every result kept from earlier
    calls stays as it was."""
    from fastgrad.runtime import numpy_tier, recycling

    # A loop this large would wait for its kernel once that is on disk: stay on NumPy.
    monkeypatch.setattr(background.KernelTier, "_loading_beats_numpy", lambda self: False)
    pools = []

    class Counted(recycling.Pool):
        def __init__(self):
            super().__init__()
            pools.append(self)

    monkeypatch.setattr(numpy_tier, "Pool", Counted)

    def loss(logits, labels):
        z = logits - fg.stop_gradient(fnp.max(logits, axis=1, keepdims=True))
        return fnp.mean(fnp.logsumexp(z, axis=1) - z[np.arange(z.shape[0]), labels])

    def expected(logits, labels):
        z = logits - logits.max(1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
        rows = np.arange(len(z))
        p[rows, labels] -= 1
        return np.mean(np.log(np.exp(z).sum(1)) - z[rows, labels]), p / len(z)

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 1024, 512)
    f = fg.jit(fg.value_and_grad(loss))
    kept = []
    for _ in range(3):
        logits = rng.standard_normal((512, 1024))
        kept.append((logits, f(logits, labels)))
    block = 512 * 1024 * 8 + 4096 + 64  # staggered_empty's block for one 4 MiB value
    assert [pool.held for pool in pools] == [2 * block] * 3
    for logits, (value, grad) in kept:
        want_value, want_grad = expected(logits, labels)
        np.testing.assert_allclose(value, want_value, **TOL)
        np.testing.assert_allclose(grad, want_grad, **TOL)
