"""fg.random: Threefry's known answers, bit-identical samples on every path (eager, fused,
reference interpreter, any thread count), each distribution's statistics against SciPy at a
fixed key, reparameterized gradients, and clear errors for bad keys and dtypes."""

import random
import subprocess
import sys
import threading
import warnings

import numba
import numpy as np
import pytest
from scipy import stats

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad import random as fr
from fastgrad.ops import sampling, threefry

COVERED = {"random_bits", "random_uniform", "random_normal"}
# tests/test_random_samplers.py tests these.
COVERED |= {"random_exponential", "random_gamma", "random_gamma_grad", "random_gamma_grad2"}
# tests/test_vmap.py tests the samplers of a batch of keys against a loop over the keys.
COVERED |= {f"{name}_keys" for name in ("random_bits", "random_uniform", "random_normal")}
COVERED |= {"random_exponential_keys", "random_gamma_keys"}

KEY = fr.key(1234)


# Known-answer vectors of Threefry-2x32-20 from its authors' Random123 distribution:
# (key, counter) -> output words.
@pytest.mark.parametrize(
    "key,counter,expected",
    [
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
        ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ],
)
def test_threefry_known_answers(key, counter, expected):
    key = np.array(key, np.uint32)
    got = sampling.random_bits(key, (2,), stream=counter[0], base=counter[1])
    np.testing.assert_array_equal(got, np.array(expected, np.uint32))
    if counter[0] == 0:  # the kernel too (its stream is part of its source: compile one)
        traced = fg.jit(lambda k, d: sampling.random_bits(k, (2,), stream=0, base=d))
        np.testing.assert_array_equal(traced(key, np.uint32(counter[1])), got)


def test_transforms_match_numpy_math():
    # The branch-free ln and cos the normal sampler uses, against NumPy's libm.
    rng = np.random.default_rng(0)
    n = np.concatenate(
        [np.arange(1, 2000), rng.integers(1, 2**53, 5000), [2**52, 2**53 - 1, 2**53]]
    )
    k, log_f = threefry.ARRAY["log_int"](n.astype(np.uint64))
    want = np.log(n.astype(np.float64))
    np.testing.assert_allclose(
        k * threefry.LN2_HI + (k * threefry.LN2_LO + log_f), want, rtol=4e-16
    )
    u = np.concatenate([rng.random(5000), np.arange(16) / 16])
    np.testing.assert_allclose(threefry.ARRAY["cos_turns"](u), np.cos(2 * np.pi * u), atol=1e-15)
    cos, sin = threefry.ARRAY["sincos_turns"](u)  # float64 normals' pair: both halves
    np.testing.assert_allclose(sin, np.sin(2 * np.pi * u), atol=1e-15)
    np.testing.assert_array_equal(cos, threefry.ARRAY["cos_turns"](u))
    # float32's: ln of odd m < 2^32 times 2^-32 (near 1 too), cos of 24-bit turns.
    m = np.concatenate([np.arange(1, 4001, 2), 2**32 - 1 - 2 * np.arange(2000)])
    m = np.concatenate([m, rng.integers(0, 2**31, 5000) * 2 + 1]).astype(np.uint64)
    log_u = threefry.ARRAY["log_odd_f32"](m)
    want = np.log(m * 2.0**-32)
    assert log_u.dtype == np.float32
    np.testing.assert_allclose(log_u, want, rtol=4e-7)
    u32 = np.concatenate([rng.integers(0, 2**24, 5000), np.arange(16) * 2**20]) * 2.0**-24
    cos = threefry.ARRAY["cos_turns_f32"](u32.astype(np.float32))
    assert cos.dtype == np.float32
    np.testing.assert_allclose(cos, np.cos(2 * np.pi * u32), atol=2e-7)


def _samplers(dtype):
    return {
        "uniform": lambda k, x: fr.uniform(k, x.shape, dtype) * x,
        "uniform_range": lambda k, x: fr.uniform(k, x.shape, dtype, minval=-2.0, maxval=x),
        "normal": lambda k, x: x + fr.normal(k, x.shape, dtype),
        "bernoulli": lambda k, x: fr.bernoulli(k, x / 4, x.shape),
        "randint": lambda k, x: fr.randint(k, x.shape, -3, 9),
        "bits": lambda k, x: fr.bits(k, x.shape),
        "split": lambda k, x: fr.split(k, 4),
        "fold_in": lambda k, x: fr.fold_in(k, 7),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_bits_on_every_path(dtype):
    samplers = _samplers(dtype)

    def fun(k, x):  # one function, so that the samples of one shape share a kernel
        return {name: sample(k, x) for name, sample in samplers.items()}

    x = np.linspace(0.5, 3.0, 12, dtype=dtype).reshape(3, 4)
    eager = fun(KEY, x)
    fused = fg.jit(fun)(KEY, x)
    reference = fg.jit(fun, fuse=False)(KEY, x)
    again = fg.jit(fun)(KEY, x)
    for name, value in eager.items():
        value = np.asarray(value)
        for got in (fused[name], reference[name], again[name]):
            assert got.dtype == value.dtype, name
            np.testing.assert_array_equal(got, value, err_msg=name)


def test_samples_fuse_into_one_loop_with_their_use():
    def f(k, x, b):
        z = fr.normal(k, x.shape)
        return z, fnp.sum(x * z + b, axis=1)  # a reduction and a broadcast: not a flat loop

    x, b = np.ones((3, 5)), np.arange(5.0)
    lowered = fg.jit(f).lower(KEY, x, b)
    assert "1 fused loop(s), 0 library call(s)" in lowered.explain()
    z, s = fg.jit(f)(KEY, x, b)
    np.testing.assert_array_equal(z, fr.normal(KEY, (3, 5)))
    np.testing.assert_allclose(s, (x * z + b).sum(axis=1), rtol=1e-14)


def test_sample_at_a_later_position_of_a_bigger_array():
    # A sample's element i does not depend on the shape it is drawn in.
    np.testing.assert_array_equal(fr.normal(KEY, (6,)), fr.normal(KEY, (2, 3)).ravel())
    np.testing.assert_array_equal(fr.uniform(KEY, (4,)), fr.uniform(KEY, (9,))[:4])


@pytest.mark.parametrize("sampler", [fr.uniform, fr.normal])
def test_same_bits_at_any_thread_count(sampler):
    n = (1 << 18) + 1  # large enough for the parallel kernel; odd: normals' last pair is half
    f = fg.jit(lambda k: sampler(k, (n,)) * 2.0)
    expected = np.asarray(sampler(KEY, (n,))) * 2.0
    before = numba.get_num_threads()
    try:
        for threads in {1, before}:
            numba.set_num_threads(threads)
            np.testing.assert_array_equal(f(KEY), expected)
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("n", [2, 5, 1001])
def test_normal_pairs_in_one_step(n, monkeypatch):
    # A loop over a float64 normal's consecutive elements computes each Box-Muller pair
    # once (codegen.pairs); a loop over rows computes it per element: the same bits, at
    # even and odd sizes, with a reduction in the loop or not.
    monkeypatch.setattr(fg.config, "compile", "sync")

    def f(k, x):
        z = fr.normal(k, x.shape)
        return x * z, fnp.sum(z * z)

    x = np.linspace(0.5, 2.0, n)
    lowered = fg.jit(f).lower(KEY, x)
    assert any("normal_pair_f64(" in k for k in lowered.kernels)
    z = fr.normal(KEY, (n,))
    scaled, total = fg.jit(f)(KEY, x)
    np.testing.assert_array_equal(scaled, x * z)
    np.testing.assert_allclose(total, np.sum(z * z), rtol=1e-13)
    rows = fg.jit(lambda k: fnp.max(fr.normal(k, (n, 3)), axis=1))(KEY)  # no pair step
    np.testing.assert_array_equal(rows, fr.normal(KEY, (n, 3)).max(axis=1))
    np.testing.assert_array_equal(fr.normal(KEY, (n, 3)).ravel()[:n], z)


def test_normal_pairs_are_independent():
    # Elements 2j and 2j + 1 are r cos and r sin of one uniform angle: uncorrelated, and
    # their squares sum to r^2, exponential with mean 2 (both fail if a half repeats).
    z = fr.normal(fr.key(12), (N,)).reshape(-1, 2)
    assert abs(np.corrcoef(z.T)[0, 1]) < 4 / np.sqrt(N / 2)
    assert stats.kstest(np.sum(z * z, axis=1), stats.expon(scale=2.0).cdf).pvalue > 1e-3
    assert (
        stats.kstest(np.arctan2(z[:, 1], z[:, 0]), stats.uniform(-np.pi, 2 * np.pi).cdf).pvalue
        > 1e-3
    )


def test_keys():
    np.testing.assert_array_equal(fr.key(42), np.array([0, 42], np.uint32))
    np.testing.assert_array_equal(fr.key(2**32 + 5), np.array([1, 5], np.uint32))
    np.testing.assert_array_equal(fr.key(-1), np.array([2**32 - 1] * 2, np.uint32))
    keys = fr.split(KEY, 5)
    assert keys.shape == (5, 2) and keys.dtype == np.uint32
    assert len({tuple(k) for k in keys} | {tuple(KEY)}) == 6
    np.testing.assert_array_equal(fr.split(KEY, 5)[:2], fr.split(KEY))  # a prefix
    folded = [tuple(fr.fold_in(KEY, d)) for d in range(5)]
    assert len(set(folded)) == 5
    # fold_in with traced data (a loop index) gives what a Python int gives.
    traced = fg.jit(lambda k, d: fr.fold_in(k, d))
    np.testing.assert_array_equal(traced(KEY, np.int64(3)), fr.fold_in(KEY, 3))
    # Different keys, different samples.
    a, b = (fr.normal(k, (8,)) for k in fr.split(KEY))
    assert not np.any(a == b)


# ---------------------------------------------------------------- statistics

N = 20_000


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_uniform_statistics(dtype):
    x = fr.uniform(fr.key(0), (N,), dtype)
    assert x.dtype == dtype and x.min() >= 0 and x.max() < 1
    assert stats.kstest(x, stats.uniform.cdf).pvalue > 1e-3
    assert abs(x.mean() - 0.5) < 4 * np.sqrt(1 / 12 / N)
    y = fr.uniform(fr.key(1), (N,), dtype, minval=-3.0, maxval=5.0)
    assert y.min() >= -3 and y.max() < 5
    assert stats.kstest(y, stats.uniform(-3, 8).cdf).pvalue > 1e-3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normal_statistics(dtype):
    x = fr.normal(fr.key(2), (N,), dtype).astype(np.float64)
    assert stats.kstest(x, stats.norm.cdf).pvalue > 1e-3
    assert abs(x.mean()) < 4 / np.sqrt(N)
    assert abs(x.var() - 1) < 4 * np.sqrt(2 / N)
    assert abs(stats.skew(x)) < 4 * np.sqrt(6 / N)
    assert abs(stats.kurtosis(x)) < 4 * np.sqrt(24 / N)


def test_normal_tails():
    # Box-Muller from 53-bit uniforms reaches far into the tails; check their mass.
    x = fr.normal(fr.key(3), (400_000,))
    for t in (2.0, 3.0, 4.0):
        expected = 2 * stats.norm.sf(t) * x.size
        assert abs(np.sum(np.abs(x) > t) - expected) < 5 * np.sqrt(expected) + 1


def test_bernoulli_and_randint_statistics():
    p = np.array([0.1, 0.5, 0.9])
    b = fr.bernoulli(fr.key(4), p, (N, 3))
    assert b.dtype == np.bool_
    np.testing.assert_allclose(b.mean(axis=0), p, atol=4 * np.sqrt(0.25 / N))
    r = fr.randint(fr.key(5), (N,), -2, 5)
    assert r.dtype == np.int64 and r.min() == -2 and r.max() == 4
    counts = np.bincount(r + 2, minlength=7)
    assert stats.chisquare(counts).pvalue > 1e-3
    np.testing.assert_array_equal(fr.randint(KEY, (4,), 3, 3), np.full(4, 3))


def test_bits_statistics():
    w = fr.bits(fr.key(6), (N,))
    assert w.dtype == np.uint32
    ones = np.unpackbits(w.view(np.uint8)).mean()
    assert abs(ones - 0.5) < 4 * np.sqrt(0.25 / (32 * N))


# ---------------------------------------------------------------- gradients


def test_reparameterized_gradients():
    def loss(params, k):
        mu, log_sigma, lo, hi = params
        z = mu + fnp.exp(log_sigma) * fr.normal(k, (50,))
        u = fr.uniform(k, (50,), minval=lo, maxval=hi)
        return fnp.sum(z**2) + fnp.sum(u * z)

    params = (0.3, -0.2, -1.0, 2.0)
    grads = fg.grad(loss)(params, KEY)
    z0 = fr.normal(KEY, (50,))
    u0 = fr.uniform(KEY, (50,))
    sigma = np.exp(-0.2)
    z = 0.3 + sigma * z0
    u = -1.0 + 3.0 * u0
    expected = (
        np.sum(2 * z + u),
        np.sum((2 * z + u) * sigma * z0),
        np.sum((1 - u0) * z),
        np.sum(u0 * z),
    )
    np.testing.assert_allclose(grads, expected, rtol=1e-12)
    fg.testing.check_grads(lambda p: loss(p, KEY), (params,), order=2)


# ---------------------------------------------------------------- errors


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="key must be a uint32 array of shape \\(2,\\)"):
        fr.normal(np.zeros(3, np.uint32), (2,))
    with pytest.raises(TypeError, match="key must have dtype uint32"):
        fr.normal(np.array([0, 1]), (2,))
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        fr.uniform(KEY, (2,), np.int32)
    with pytest.raises(TypeError, match="randint: dtype must be an integer"):
        fr.randint(KEY, (2,), 0, 3, dtype=np.float64)
    with pytest.raises(ValueError, match="negative"):
        fr.normal(KEY, (2, -1))
    with pytest.raises(fg.TracerError, match="seed"):
        fg.jit(lambda s: fr.key(s))(np.int64(3))


# ---------------------------------------------------------------- global generators


def test_global_generators_used_while_tracing_warn_once():
    def noisy(x):
        return x + np.random.normal()

    f = fg.jit(noisy)
    with pytest.warns(UserWarning, match="noisy used np.random while it was traced.*fg.random"):
        first = f(np.zeros(2))
    np.testing.assert_array_equal(f(np.zeros(2)), first)  # frozen: the reason for the warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(np.ones(3))  # traced again, for a new shape: no second warning
        fg.jit(lambda x: x + fr.normal(KEY, x.shape))(np.zeros(2))


def test_the_random_module_is_checked_while_the_process_has_one_thread():
    # In a fresh process: this one runs other threads (a Dask client's, compile threads).
    code = (
        "import random, numpy as np, fastgrad as fg, fastgrad.numpy as fnp\n"
        "def loss(x):\n"
        "    return fnp.sum(x * random.random())\n"
        "fg.grad(loss)(np.ones(2))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "loss used the random module" in result.stderr


def test_another_threads_draws_are_not_the_traced_functions():
    # A library drawing from `random` in its own thread (a Dask client does) while a
    # function is traced: no warning, the function drew nothing.
    stop = threading.Event()

    def draw():
        while not stop.is_set():
            random.random()

    thread = threading.Thread(target=draw, daemon=True)
    thread.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(20):
                fg.grad(lambda x: fnp.sum(fnp.sin(x) * 3.0))(np.ones(2))
    finally:
        stop.set()
        thread.join()


# ---------------------------------------------------------------- derived distributions


def test_gumbel_and_categorical_statistics():
    g = fr.gumbel(fr.key(7), (N,))
    assert stats.kstest(g, stats.gumbel_r.cdf).pvalue > 1e-3
    p = np.array([0.2, 0.5, 0.3])
    draws = fr.categorical(fr.key(8), np.log(p), shape=(N,))
    assert stats.chisquare(np.bincount(draws, minlength=3), N * p).pvalue > 1e-3
    # A batch along axis 0, and a compiled run of the same draws (argmax of the same noise).
    logits = np.log(np.array([[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]])).T
    eager = fr.categorical(fr.key(9), logits, axis=0, shape=(2000, 3))
    np.testing.assert_allclose(eager.mean(axis=0), [0.1, 0.9, 0.5], atol=0.05)
    jitted = fg.jit(lambda k, z: fr.categorical(k, z, axis=0, shape=(2000, 3)))(fr.key(9), logits)
    assert np.mean(jitted == eager) > 0.999  # ties in the last ulp may differ


def test_truncated_normal_statistics_and_gradient():
    lo, hi = -0.5, 1.5
    x = fr.truncated_normal(fr.key(10), lo, hi, (N,))
    assert x.min() >= lo and x.max() <= hi
    assert stats.kstest(x, stats.truncnorm(lo, hi).cdf).pvalue > 1e-3
    fg.testing.check_grads(
        lambda a, b: fnp.sum(fr.truncated_normal(KEY, a, b, (20,))), (-0.5, 1.5), order=1
    )


def test_multivariate_normal_statistics():
    mean = np.array([1.0, -2.0, 0.5])
    a = np.array([[1.0, 0.0, 0.0], [0.5, 1.0, 0.0], [-0.3, 0.2, 0.7]])
    cov = a @ a.T
    x = fr.multivariate_normal(fr.key(11), mean, cov, (N,))
    assert x.shape == (N, 3)
    np.testing.assert_allclose(x.mean(axis=0), mean, atol=5 * np.sqrt(cov.diagonal().max() / N))
    np.testing.assert_allclose(np.cov(x.T), cov, atol=0.05)
    with pytest.raises(ValueError, match="cov must have shape"):
        fr.multivariate_normal(KEY, mean, np.eye(2))
