"""Building arrays (ops.construction, asarray/array/stack of nested lists) and the
elementwise compositions (deg2rad, rad2deg, sinc): values against NumPy, traced values
inside, derivatives at orders 1 and 2; the compiled kernels; clear errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.testing import check_grads
from numpy_check import check_case, shapes, table_tests, values


def linspace(draw):
    shape = draw(shapes(max_dims=2))
    start, stop = draw(values(shape)), draw(values(draw(st.sampled_from([(), shape]))))
    num = draw(st.integers(0, 6))
    endpoint = draw(st.booleans())
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    return (
        (lambda a, b: fnp.linspace(a, b, num, endpoint, axis=axis)),
        (lambda a, b: np.linspace(a, b, num, endpoint, axis=axis)),
        (start, stop),
    )


def linspace_retstep(draw):
    num = draw(st.integers(2, 5))
    return (
        (lambda a, b: fnp.linspace(a, b, num, retstep=True)),
        (lambda a, b: np.linspace(a, b, num, retstep=True)),
        (draw(values(())), draw(values(()))),
    )


def logspace(draw):
    num = draw(st.integers(0, 5))
    base = draw(st.floats(1.5, 10))
    return (
        (lambda a, b: fnp.logspace(a, b, num, base=base)),
        (lambda a, b: np.logspace(a, b, num, base=base)),
        (draw(values(())), draw(values((2,)))),
    )


def meshgrid(draw):
    count = draw(st.integers(1, 3))
    xs = [draw(values(draw(shapes(min_dims=1, max_dims=1)))) for _ in range(count)]
    indexing = draw(st.sampled_from(["xy", "ij"]))
    sparse = draw(st.booleans())
    return (
        (lambda *xs: fnp.meshgrid(*xs, indexing=indexing, sparse=sparse)),
        (lambda *xs: np.meshgrid(*xs, indexing=indexing, sparse=sparse)),
        tuple(xs),
    )


def full(draw):
    shape = draw(shapes())
    return (lambda v: fnp.full(shape, v)), (lambda v: np.full(shape, v)), (draw(values(())),)


def nested(draw):
    shape = draw(shapes(max_dims=2, max_side=3))
    x, y = draw(values(shape)), draw(values(shape))
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    return (
        (lambda x, y: fnp.stack([[x, y * 2], [1.5 * x, y]], axis)),
        (lambda x, y: np.stack(np.asarray([[x, y * 2], [1.5 * x, y]], x.dtype), axis)),
        (x, y),
    )


def array_ndmin(draw):
    x = draw(values(draw(shapes(max_dims=2))))
    ndmin = draw(st.integers(0, 4))
    return (lambda x: fnp.array(x, ndmin=ndmin)), (lambda x: np.array(x, ndmin=ndmin)), (x,)


@pytest.mark.parametrize("name", ["deg2rad", "rad2deg", "radians", "degrees", "sinc"])
@given(data=st.data())
def test_elementwise_compositions(name, data):
    x = data.draw(values(data.draw(shapes()), -3.0, 3.0))
    check_case(getattr(fnp, name), getattr(np, name), (x,))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_degree_conversions_are_numpys_bit_for_bit(dtype):
    x = np.random.default_rng(0).standard_normal(1000).astype(dtype) * 400
    for name in ("deg2rad", "rad2deg"):
        np.testing.assert_array_equal(getattr(fnp, name)(x), getattr(np, name)(x))
        np.testing.assert_array_equal(fg.jit(getattr(fnp, name))(x), getattr(np, name)(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decimals", [0, 2, -1])
def test_round_is_numpys_bit_for_bit(dtype, decimals):
    x = (np.random.default_rng(1).standard_normal(500) * 100).astype(dtype)
    expected = np.round(x, decimals)
    np.testing.assert_array_equal(fnp.round(x, decimals), expected)
    np.testing.assert_array_equal(fg.jit(lambda x: fnp.around(x, decimals))(x), expected)
    assert not fg.grad(lambda x: fnp.sum(fnp.round(x, decimals)))(x).any()


def test_sinc_derivatives_are_exact_at_zero():
    # sinc(x) = 1 - (pi x)^2 / 6 + ...: sinc''(0) = -pi^2 / 3, sinc'''(0) = 0.
    second = fg.grad(fg.grad(fnp.sinc))(0.0)
    np.testing.assert_allclose(second, -(np.pi**2) / 3, rtol=1e-15)
    assert fg.grad(fg.grad(fg.grad(fnp.sinc)))(0.0) == 0.0
    check_grads(fnp.sinc, (np.array([0.0, 0.049, 0.051, -2.5]),), order=3, modes=("fwd", "rev"))


@pytest.mark.parametrize("name", ["remainder", "fmod", "floor_divide"])
def test_integer_division_matches_numpy(name):
    x, y = np.arange(-7, 8), np.array([3, -2, 5])[:, None]
    expected = getattr(np, name)(x, y)
    np.testing.assert_array_equal(getattr(fnp, name)(x, y), expected)
    np.testing.assert_array_equal(fg.jit(getattr(fnp, name))(x, y), expected)


def test_remainder_gradient_uses_numpys_quotient():
    # 1 // 0.1 is 9 in NumPy (floor(1 / 0.1) would be 10): the gradient follows NumPy.
    g = fg.grad(lambda y: fnp.remainder(1.0, y))(0.1)
    assert g == -np.floor_divide(1.0, 0.1)


rng = np.random.default_rng(4)
FUSED = {
    "linspace": (
        lambda a, b: fnp.linspace(a, b, 7) ** 2,
        lambda a, b: np.linspace(a, b, 7) ** 2,
        (np.array(0.5), np.array([1.0, 3.0])),
    ),
    "meshgrid": (
        lambda x, y: fnp.meshgrid(x, y)[0] * fnp.meshgrid(x, y)[1],
        lambda x, y: np.meshgrid(x, y)[0] * np.meshgrid(x, y)[1],
        (rng.standard_normal(3), rng.standard_normal(4)),
    ),
    "stack": (
        lambda a, b: fnp.asarray([[a, 0.0], [b, a * b]]),
        lambda a, b: np.asarray([[a, 0.0], [b, a * b]], a.dtype),
        (np.array(1.5), np.array(-0.5)),
    ),
    "sinc": (
        lambda x: fnp.sinc(x) + fnp.deg2rad(x) * fnp.rad2deg(x),
        lambda x: np.sinc(x) + np.deg2rad(x) * np.rad2deg(x),
        (np.array([0.0, 0.01, 0.7, -2.0]),),
    ),
}
BUILDERS = (
    linspace, linspace_retstep, logspace, meshgrid, full, nested, array_ndmin,
)  # fmt: skip
test_matches_numpy_with_gradients, test_compiled = table_tests(BUILDERS, FUSED)


def test_elementwise_compositions_fuse_into_one_loop():
    from fastgrad.compiler.fusion import Call

    steps = fg.jit(lambda x: fnp.sum(fnp.sinc(x) * fnp.deg2rad(x))).lower(np.ones(5))
    assert not [s for s in steps.executable.steps if isinstance(s, Call)]


def test_arange_with_traced_endpoints_is_rejected():
    with pytest.raises(TypeError, match="static n"):
        fg.jit(lambda n: fnp.arange(n))(np.array(3))
    np.testing.assert_array_equal(fnp.arange(1, 7, 2), np.arange(1, 7, 2))


def test_meshgrid_rejects_a_bad_indexing():
    with pytest.raises(ValueError, match="indexing"):
        fnp.meshgrid(np.ones(2), indexing="yx")
