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


def test_values_made_of_reductions_over_the_first_axis_come_after_the_blocks():
    """A parameter's gradient, a sum over the rows times constants (bench M4's means):
    made after the blocks from their partial sums, so the loop runs blocked (it ran
    whole). A value that mixes such a sum with blocked values still runs whole (above)."""
    rng = np.random.default_rng(5)
    x, mu = rng.standard_normal((37, 1, 2)), rng.standard_normal((3, 2))

    def loss(mu, x):
        d = x - mu
        return fnp.sum(d * d * 0.5)

    d = x - mu
    expected = [np.sum(d * d * 0.5), -np.sum(d, axis=0)]
    assert_tiers_agree(fg.value_and_grad(loss), (mu, x), expected, block=8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("axis", [(2,), (1, 2), (-1,)])
def test_short_trailing_reductions_by_slices(name, axis, dtype):
    """The tier's reductions over a few trailing elements (runtime.numpy_reductions) by
    ufunc calls over slices, against NumPy's reduce: nan and infinities propagate alike,
    sums within rounding; leading axes, long rows, few rows and integers keep the reduce."""
    from fastgrad.runtime import numpy_reductions

    x = np.random.default_rng(6).standard_normal((1500, 3, 4)).astype(dtype)
    x[0, 1, 2], x[1, 0, 0], x[2, 2, 3], x[3, 1, 1] = np.nan, np.inf, -np.inf, 0.0
    fast = numpy_reductions._short(numpy_reductions._UFUNCS[name], x, axis, True)
    assert fast is not None
    impl = numpy_reductions.tier_impl(name, getattr(np, name))
    out = impl(x, axis=axis, keepdims=False)
    expected = getattr(np, name)(x, axis=axis)
    assert out.dtype == expected.dtype and fast.shape == np.expand_dims(expected, axis).shape
    if name in ("max", "min"):
        np.testing.assert_array_equal(out, expected)
    else:  # n terms: within n eps of the sum (product) of magnitudes
        scale = getattr(np, name)(np.abs(x).astype(np.float64), axis=axis)
        bound = 12 * np.finfo(dtype).eps * np.where(np.isfinite(scale), scale, 0)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
        np.testing.assert_array_equal(out[np.isinf(expected)], expected[np.isinf(expected)])
        finite = np.isfinite(expected)
        assert np.all(np.abs(out[finite] - expected[finite]) <= bound[finite])
    for ufunc, value, axes in [
        (np.add, x, (0,)),  # a leading axis
        (np.add, np.ones((2000, 32)), (1,)),  # rows longer than SHORT
        (np.add, np.ones((10, 4)), (1,)),  # fewer outputs than MANY
        (np.add, np.ones((2000, 4), np.int64), (1,)),  # integers (their sum's own dtype)
    ]:
        assert numpy_reductions._short(ufunc, value, axes, False) is None


def test_blocks_on_two_threads_give_the_bits_of_one(monkeypatch):
    """Half the blocks run on a second thread where the process may use two; each block
    is computed as alone and partial sums are combined in block order: the same bits."""
    import threading

    rng = np.random.default_rng(7)
    x, y = rng.standard_normal(301), rng.standard_normal(301)
    monkeypatch.setattr(numpy_blocks, "numba_threads", lambda: 2)
    threads = set()
    block_op = numpy_blocks.BlockedLoop._block_op

    def spied(self, *args):
        threads.add(threading.get_ident())
        return block_op(self, *args)

    monkeypatch.setattr(numpy_blocks.BlockedLoop, "_block_op", spied)
    two, blocked, _ = first_call(fg.value_and_grad(w1, argnums=(0, 1)), (x, y), 8)
    assert blocked and len(threads) == 2
    monkeypatch.setattr(numpy_blocks, "TWO_THREADS", 1 << 40)
    threads.clear()
    one, _, _ = first_call(fg.value_and_grad(w1, argnums=(0, 1)), (x, y), 8)
    assert len(threads) == 1
    for a, b in zip(fg.pytree.flatten(two)[0], fg.pytree.flatten(one)[0], strict=True):
        np.testing.assert_array_equal(a, b)


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


def test_a_blocked_loop_writes_into_its_steps_buffers(monkeypatch):
    """A loop run over blocks writes the outputs the plan keeps in buffers of its own
    straight into them, not into fresh arrays the step then copies (bench M4's first call
    copied 96 MB in float32, 192 MB in float64)."""
    from fastgrad.runtime import plan_steps

    copied = []

    class Counting:  # NumPy as the kernel steps see it, copyto counted
        def __getattr__(self, name):
            return getattr(np, name)

        def copyto(self, to, source, **options):
            copied.append(to.nbytes)
            np.copyto(to, source, **options)

    monkeypatch.setattr(plan_steps, "np", Counting())
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((64, 4)), rng.standard_normal((4, 3))

    def f(x, w):  # tanh(x * 2) feeds a product: kept in a buffer of the plan's
        return fnp.sum(fnp.tanh(x * 2.0) @ w)

    h = np.tanh(x * 2.0)
    expected = [np.sum(h @ w), (1 - h * h) * 2.0 * np.sum(w, axis=1), h.T @ np.ones((64, 3))]
    vg = fg.value_and_grad(f, argnums=(0, 1))
    first_call(vg, (x, w), 1 << 40)
    assert copied  # whole loops' results are copied into the buffers
    copied.clear()
    (value, (dx, dw)), blocked, whole = first_call(vg, (x, w), 8)
    assert blocked > 0 and whole == 0 and not copied, copied
    for got, want in zip([value, dx, dw], expected, strict=True):
        np.testing.assert_allclose(got, want, **TOL)
