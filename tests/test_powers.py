"""Constant exponents in fused loops (compiler.codegen.powers): `x ** 4` as multiplies,
`x ** -1.5` with a reciprocal and a square root, against the reference interpreter (NumPy's
pow) at ordinary, tiny, huge, zero, infinite and nan values, in float32 and float64, for
the values and their first and second derivatives; and no `**` left in the kernel. Each
reduced form alone against NumPy at every exponent."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.codegen.powers import MAX_EXPONENT, power_expression, reducible
from fastgrad.runtime.executable import _KernelStep

inf, nan = math.inf, math.nan
REDUCED = [*range(-5, 9), 16, -16, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -4.5, 16.5]
GENERIC = [2.7, -0.3, 17.0]  # still `**`: their derivatives' exponents are not reducible
SPECIAL = [0.0, -0.0, inf, -inf, nan, 1.0, -1.0, 2.0, -3.0, 0.5, 1e-3, 1e30, -1e30]


pytestmark = pytest.mark.usefixtures("compiled_first_call")


def powers_and_derivatives(exponents):
    """x_i ** e_i, their first and second derivatives."""

    def total(*xs):
        return sum(fnp.sum(x**e) for x, e in zip(xs, exponents, strict=True))

    argnums = tuple(range(len(exponents)))
    first = fg.grad(total, argnums=argnums)

    def second(*xs):
        return fg.grad(lambda *xs: sum(fnp.sum(g) for g in first(*xs)), argnums=argnums)(*xs)

    def program(*xs):
        values = tuple(x**e for x, e in zip(xs, exponents, strict=True))
        return values, first(*xs), second(*xs)

    return program


def values(dtype):
    """Arrays of one shape (one compile per program), ordinary and awkward values."""
    finfo = np.finfo(dtype)
    special = [*SPECIAL, float(finfo.tiny), float(finfo.max), float(finfo.smallest_subnormal)]
    width = 32 if dtype == np.float32 else 64
    element = st.one_of(st.sampled_from(special), st.floats(width=width))
    return hnp.arrays(dtype, 6, elements=element)


def assert_like_reference(fused, reference, dtype):
    eps, tiny = np.finfo(dtype).eps, np.finfo(dtype).tiny
    for f, r in zip(fg.pytree.flatten(fused)[0], fg.pytree.flatten(reference)[0], strict=True):
        assert f.dtype == r.dtype == dtype
        # Repeated squaring: a few roundings where pow has one; below the smallest
        # normal number, what the last rounding keeps.
        np.testing.assert_allclose(f, r, rtol=64 * eps, atol=tiny)
        zeros = (f == 0) & (r == 0)
        np.testing.assert_array_equal(np.signbit(f[zeros]), np.signbit(r[zeros]))


@settings(max_examples=3, deadline=None)
@given(
    exponents=st.lists(st.sampled_from(REDUCED + GENERIC), min_size=1, max_size=2),
    dtype=st.sampled_from([np.float32, np.float64]),
    data=st.data(),
)
def test_drawn_exponents_match_reference(exponents, dtype, data):
    xs = [data.draw(values(dtype)) for _ in exponents]
    program = powers_and_derivatives(exponents)
    assert_like_reference(fg.jit(program)(*xs), fg.jit(program, fuse=False)(*xs), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_reduced_form_matches_numpy(dtype):
    """Each generated expression, evaluated on NumPy scalars (IEEE arithmetic, as in the
    kernel), against np.power with a broadcast exponent (the reference interpreter's)."""
    finfo = np.finfo(dtype)
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            np.array([*SPECIAL, finfo.tiny, finfo.max, -finfo.max, finfo.smallest_subnormal]),
            rng.standard_normal(100) * 10.0 ** rng.integers(-37, 37, 100),
        ]
    ).astype(dtype)
    t = "f32" if dtype == np.float32 else "f64"
    exponents = [e / 2 for e in range(-2 * MAX_EXPONENT, 2 * MAX_EXPONENT + 1)]
    assert all(reducible(e) for e in exponents) and not reducible(MAX_EXPONENT + 1)
    for e in exponents:
        source = power_expression("x", e, t)
        assert "**" not in source
        form = eval(f"lambda x: {source}", {"np": np, "f32": np.float32, "f64": np.float64})
        with np.errstate(all="ignore"):
            got = np.array([form(v) for v in x], dtype)
            want = np.power(x, np.broadcast_to(dtype(e), x.shape))
        np.testing.assert_allclose(got, want, rtol=64 * finfo.eps, atol=finfo.tiny, err_msg=e)
        if dtype == np.float32:  # at most two float32 roundings, else one from float64
            with np.errstate(all="ignore"):
                exact = np.power(x.astype(np.float64), e)
            normal = (np.abs(exact) >= finfo.tiny) & (np.abs(exact) <= finfo.max)
            error = np.abs(got[normal] - exact[normal]) / np.abs(exact[normal])
            assert error.max(initial=0) <= 2 * finfo.eps, (e, error.max() / finfo.eps)
        zeros = (got == 0) & (want == 0)
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))


def test_values_at_the_edges():
    """NumPy's values where multiplies and square roots differ from pow if done naively
    (np.power is pow, but a square root for a scalar or broadcast exponent 0.5)."""
    x = np.array([-0.0, 0.0, -inf, inf, nan, -1.0, 1e-310, 1e155])
    exponents = (0, -1, 0.5, -0.5, 1.5, -1.5, -2)
    got = fg.jit(lambda x: tuple(x**e for e in exponents))(x)
    with np.errstate(all="ignore"):
        want = tuple(np.power(x, np.broadcast_to(float(e), x.shape)) for e in exponents)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=4 * np.finfo(np.float64).eps, atol=0)
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


@pytest.mark.parametrize("exponent", [2, 3, 4, -1, -2, 0.5, 1.5, -0.5])
def test_no_pow_left_in_the_kernels(exponent):
    """The value and gradient of sum(x ** e) are multiplies, divisions and square roots."""
    f = fg.jit(fg.value_and_grad(lambda x: fnp.sum(x**exponent)))
    plan = f.lower(np.ones(64)).executable.plan
    sources = [s.source.source for s in plan if isinstance(s, _KernelStep)]
    assert sources and not any("**" in s for s in sources)
