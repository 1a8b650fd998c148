"""fastgrad.numpy's insert, apply_along_axis, apply_over_axes, polyfit, set operations and
integer functions (bitwise ops, shifts, gcd, lcm): values against NumPy (eager and jitted,
float32 and float64 or integer dtypes, hypothesis shapes), derivatives of orders 1 and 2 in
both modes against finite differences, the operators on traced integers, and errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.tracing import TracerError
from fastgrad.testing import strategies as fst
from oracle import check_derivatives, check_values

# Registry records these tests exercise, for test_structural's coverage check.
COVERED = {"bitwise_and", "bitwise_or", "bitwise_xor", "invert", "left_shift", "right_shift",
           "bitwise_count", "gcd", "lcm"}  # fmt: skip

RNG = np.random.default_rng(0)
A = RNG.normal(size=(3, 4))


# ---------------------------------------------------------------- insert


@st.composite
def insertions(draw):
    """(arr, obj, values, axis) that numpy.insert accepts."""
    shape = draw(fst.shapes(min_dims=1, max_dims=3, max_side=3))
    axis = draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    n = int(np.prod(shape)) if axis is None else shape[axis]
    kind = draw(st.sampled_from(["int", "list", "slice"]))
    if kind == "int":
        obj = draw(st.integers(-n, n))
    elif kind == "list":
        obj = draw(st.lists(st.integers(-n, n), min_size=1, max_size=3))
    else:
        obj = slice(draw(st.integers(0, n)), None, draw(st.integers(1, 2)))
    arr = draw(fst.arrays(shape, np.float64, "real"))
    probe = np.insert(np.zeros(shape), obj, 0.0, axis)
    added = probe.size - arr.size if axis is None else probe.shape[axis] - shape[axis]
    if kind == "int" or draw(st.booleans()):
        values = draw(fst.arrays((), np.float64, "real"))  # one value, broadcast
    elif axis is None:
        values = draw(fst.arrays((added,), np.float64, "real"))
    else:
        vshape = list(shape)
        vshape[axis] = added
        values = draw(fst.arrays(tuple(vshape), np.float64, "real"))
    return arr, obj, values, axis


@settings(max_examples=40, deadline=None)
@given(case=insertions())
def test_insert_matches_numpy(case):
    arr, obj, values, axis = case
    for dtype in (np.float32, np.float64):
        args = (arr.astype(dtype), values.astype(dtype))
        check_values(lambda a, v: fnp.insert(a, obj, v, axis),
                     lambda a, v: np.insert(a, obj, v, axis), args, dtype)  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "values", "axis"),
    [(1, 5.0, 1), ([0, 2, 2], np.array([7.0, 8.0, 9.0]), 1), (2, np.ones((3, 1)), 1),
     (slice(0, 3), -1.0, 0), (3, np.array([1.0, 2.0]), None), (1, np.arange(4.0), 0),
     ([-1, 1], A[:, :2], 1)],
)  # fmt: skip
def test_insert_values_and_derivatives(obj, values, axis):
    check_values(lambda a, v: fnp.insert(a, obj, v, axis),
                 lambda a, v: np.insert(a, obj, v, axis), (A, values), np.float64)  # fmt: skip
    check_derivatives(lambda a, v: fnp.insert(a, obj, v, axis), (A, np.asarray(values)))


# ---------------------------------------------------------------- apply_along_axis, _over_axes


APPLIED = {
    "scaled": (lambda v: v * v.sum(), lambda v: v * v.sum(), 0),
    "outer": (lambda v: fnp.outer(v, v), lambda v: np.outer(v, v), 1),
    "reduce": (fnp.sum, np.sum, -1),
    "sort": (fnp.sort, np.sort, 0),
}


@pytest.mark.parametrize("name", sorted(APPLIED))
def test_apply_along_axis(name):
    ours, theirs, axis = APPLIED[name]
    for dtype in (np.float32, np.float64):
        check_values(lambda a: fnp.apply_along_axis(ours, axis, a),
                     lambda a: np.apply_along_axis(theirs, axis, a), (A.astype(dtype),),
                     dtype)  # fmt: skip
    check_derivatives(lambda a: fnp.apply_along_axis(ours, axis, a), (A,))


@pytest.mark.parametrize("axes", [0, [0, 1], [1, -2]])
def test_apply_over_axes(axes):
    pairs = [(fnp.sum, np.sum), (fnp.mean, np.mean),
             (lambda a, axis: fnp.max(a, axis, keepdims=True), np.max)]  # fmt: skip
    for ours, theirs in pairs:
        check_values(lambda a, f=ours: fnp.apply_over_axes(f, a, axes),
                     lambda a, f=theirs: np.apply_over_axes(f, a, axes), (A,),
                     np.float64)  # fmt: skip
    check_derivatives(lambda a: fnp.apply_over_axes(fnp.mean, a, axes), (A,))


# ---------------------------------------------------------------- polyfit


@pytest.mark.parametrize("deg", [0, 1, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_polyfit(deg, weighted):
    x, y, w = RNG.normal(size=6), RNG.normal(size=(6, 2)), RNG.uniform(0.5, 2.0, 6)
    kw = {"w": w} if weighted else {}
    for ys in (y[:, 0], y):
        for dtype in (np.float32, np.float64):  # (NumPy's result is float64 in both)
            typed = {"w": w.astype(dtype)} if weighted else {}
            check_values(lambda x, y, typed=typed: fnp.polyfit(x, y, deg, **typed),
                         lambda x, y: np.polyfit(x, y, deg, **kw),
                         (x.astype(dtype), ys.astype(dtype)), dtype,
                         rtol=2e-3 if dtype == np.float32 else 1e-9)  # fmt: skip
        check_derivatives(lambda x, y: fnp.polyfit(x, y, deg, **kw), (x, ys))
    c, residuals, rank, s, rcond = fnp.polyfit(x, y[:, 0], deg, full=True, **kw)
    expected = np.polyfit(x, y[:, 0], deg, full=True, **kw)
    np.testing.assert_allclose(residuals, expected[1], rtol=1e-9)
    assert int(rank) == expected[2] and rcond == expected[4]
    np.testing.assert_allclose(s, expected[3], rtol=1e-9)


def test_polyfit_errors():
    with pytest.raises(NotImplementedError, match="cov=True"):
        fnp.polyfit(np.arange(3.0), np.arange(3.0), 1, cov=True)
    with pytest.raises(ValueError, match="x must be 1-D"):
        fnp.polyfit(np.ones((2, 2)), np.ones(2), 1)
    with pytest.raises(ValueError, match="deg must be at least 0"):
        fnp.polyfit(np.arange(3.0), np.arange(3.0), -1)


# ---------------------------------------------------------------- set operations


@given(a=hnp.arrays(np.int64, st.integers(0, 6), elements=st.integers(-3, 3)),
       b=hnp.arrays(np.int64, st.integers(0, 6), elements=st.integers(-3, 3)))  # fmt: skip
def test_set_operations_match_numpy(a, b):
    for name in ("union1d", "intersect1d", "setdiff1d", "setxor1d"):
        np.testing.assert_array_equal(getattr(fnp, name)(a, b), getattr(np, name)(a, b))
    ours = fnp.intersect1d(a, b, return_indices=True)
    for got, want in zip(ours, np.intersect1d(a, b, return_indices=True), strict=True):
        np.testing.assert_array_equal(got, want)


def test_set_operations_need_concrete_arrays():
    with pytest.raises(TracerError, match="union1d: the shape of its result depends on"):
        fg.jit(lambda x: fnp.union1d(x, np.array([1.0])))(np.array([2.0]))
    # Differentiate through the values by indexing with the positions.
    a, b = np.array([3.0, 1.0, 2.0]), np.array([2.0, 3.0])
    _, ia, _ = fnp.intersect1d(a, b, return_indices=True)
    grad = fg.grad(lambda a: fnp.sum(a[ia] ** 2))(a)
    np.testing.assert_array_equal(grad, [6.0, 0.0, 4.0])


# ---------------------------------------------------------------- integers

BINARY = ["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "gcd", "lcm"]
UNARY = ["invert", "bitwise_not", "bitwise_invert", "bitwise_count"]


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
@pytest.mark.parametrize("name", BINARY + UNARY)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_integer_functions_match_numpy(name, dtype, data):
    nin = 2 if name in BINARY else 1
    shapes = data.draw(fst.broadcastable_shapes(nin, max_side=3))
    high = 7 if "shift" in name else 50
    low = 0 if "shift" in name or dtype == np.uint8 else -50
    xs = [data.draw(hnp.arrays(dtype, s, elements=st.integers(low, high))) for s in shapes]
    expected = getattr(np, name)(*xs)
    for fun in (getattr(fnp, name), fg.jit(getattr(fnp, name))):
        got = fun(*xs)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_operators_on_traced_integers_and_booleans():
    a, b = np.array([12, 10, 7]), np.array([6, 3, 5])

    def ops(a, b):
        return a & b, a | b, a ^ b, ~a, a << 1, b >> 1, 3 & a, 1 << b, (a > 5) & (b > 4), ~(a > 5)

    for got, want in zip(fg.jit(ops)(a, b), ops(a, b), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    with pytest.raises(TypeError, match="bitwise_and: expected integers or booleans, got float"):
        fg.jit(lambda x: x & x)(np.ones(2))
    with pytest.raises(TypeError, match="gcd: expected integers"):
        fnp.gcd(np.ones(2), 2)


def test_integer_functions_have_no_gradient():
    def f(x):
        parity = fnp.bitwise_and(fnp.floor(x).astype(np.int64), 1)
        return fnp.sum(fnp.where(parity == 1, x * x, x))

    x = np.array([1.5, 2.5, 3.25])
    np.testing.assert_allclose(fg.grad(f)(x), [3.0, 1.0, 6.5])
    np.testing.assert_array_equal(fg.vmap(lambda a: fnp.gcd(a, 6))(np.array([4, 9, 5])), [2, 3, 1])
