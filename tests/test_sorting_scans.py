"""Sorting and scans (ops.sorting, ops.cumulative): sort, argsort, partition, argmax/argmin,
cumsum, cumprod, diff, gradient against NumPy on hypothesis shapes (size-0 and size-1 axes
included), with derivatives at orders 1 and 2; the tie conventions; the compiled kernels."""

import numpy as np
import pytest
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.testing import check_grads
from numpy_check import assert_rejected, shapes, table_tests, values


def _axis(draw, ndim, none=True):
    if ndim == 0:
        return None
    choices = st.integers(-ndim, ndim - 1)
    return draw(st.none() | choices if none else choices)


def sort(draw):
    # Distinct values: at a tie the gradient follows a convention finite differences cannot
    # see (test_sort_ties_follow_the_stable_order pins it).
    x = draw(values(draw(shapes(min_dims=1)), unique=True))
    axis = _axis(draw, x.ndim)
    return (lambda x: fnp.sort(x, axis)), (lambda x: np.sort(x, axis)), (x,)


def argsort(draw):
    x = draw(values(draw(shapes(min_dims=1))))
    axis = _axis(draw, x.ndim)
    return (
        (lambda x: fnp.argsort(x, axis, stable=True)),
        (lambda x: np.argsort(x, axis, stable=True)),
        (x,),
    )


def partition(draw):
    x = draw(values(draw(shapes(min_dims=1, min_side=1)), unique=True))
    axis = _axis(draw, x.ndim, none=False)
    kth = draw(st.lists(st.integers(0, x.shape[axis] - 1), min_size=1, max_size=2, unique=True))
    # Only the kth places are fixed by the definition; compare the sorted halves too.
    k = max(kth)

    def ours(x):
        p = fnp.partition(x, kth, axis)
        before, after = fnp.split(p, [k, k + 1], axis)[::2]
        return fnp.take(p, kth, axis), fnp.sort(before, axis), fnp.sort(after, axis)

    def theirs(x):
        p = np.partition(x, kth, axis)
        before, after = np.split(p, [k, k + 1], axis)[::2]
        return np.take(p, kth, axis), np.sort(before, axis), np.sort(after, axis)

    return ours, theirs, (x,)


def arg_extremum(draw):
    x = draw(values(draw(shapes(min_side=1))))
    axis = _axis(draw, x.ndim)
    keepdims = draw(st.booleans())
    name = draw(st.sampled_from(["argmax", "argmin"]))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (
        (lambda x: ours(x, axis, keepdims=keepdims)),
        (lambda x: theirs(x, axis, keepdims=keepdims)),
        (x,),
    )


def cumsum(draw):
    x = draw(values(draw(shapes())))
    axis = _axis(draw, x.ndim)
    return (lambda x: fnp.cumsum(x, axis)), (lambda x: np.cumsum(x, axis)), (x,)


def cumprod(draw):
    shape = draw(shapes(max_side=6))
    x = draw(values(shape, 0.5, 1.5))
    x = np.where(draw(values(shape)) > 1.5, 0.0, x)  # zeros: the derivative is still exact
    axis = _axis(draw, x.ndim)
    return (lambda x: fnp.cumprod(x, axis)), (lambda x: np.cumprod(x, axis)), (x,)


def diff(draw):
    x = draw(values(draw(shapes(min_dims=1))))
    axis = _axis(draw, x.ndim, none=False)
    n = draw(st.integers(0, 3))
    edge = tuple(x.shape[: axis % x.ndim]) + (1,) + tuple(x.shape[axis % x.ndim + 1 :])
    if draw(st.booleans()):
        return (lambda x: fnp.diff(x, n, axis)), (lambda x: np.diff(x, n, axis)), (x,)
    p, a = draw(values(edge)), 0.5
    return (
        (lambda x, p: fnp.diff(x, n, axis, prepend=p, append=a)),
        (lambda x, p: np.diff(x, n, axis, prepend=p, append=a)),
        (x, p),
    )


def gradient(draw):
    shape = draw(shapes(min_dims=1, max_dims=2, min_side=3))
    x = draw(values(shape))
    edge_order = draw(st.integers(1, 2))
    axis = draw(st.integers(0, x.ndim - 1))
    if draw(st.booleans()):
        spacing = np.cumsum(draw(values((shape[axis],), 0.5, 2.0)))  # uneven coordinates
    else:
        spacing = np.array(draw(st.floats(0.5, 2.0)))
    return (
        (lambda x, h: fnp.gradient(x, h, axis=axis, edge_order=edge_order)),
        (lambda x, h: np.gradient(x, h, axis=axis, edge_order=edge_order)),
        (x, spacing),
    )


rng = np.random.default_rng(1)
A = rng.standard_normal((3, 4))
FUSED = {
    "sort": (lambda x: fnp.sort(x, 0) * 2, lambda x: np.sort(x, 0) * 2, (A,)),
    "argsort": (lambda x: fnp.argsort(x), np.argsort, (A,)),
    "partition": (lambda x: fnp.partition(x, 2)[:, 2], lambda x: np.partition(x, 2)[:, 2], (A,)),
    "cumsum": (lambda x: fnp.cumsum(x, 1) ** 2, lambda x: np.cumsum(x, 1) ** 2, (A,)),
    "cumprod": (lambda x: fnp.cumprod(x), np.cumprod, (A,)),
    "diff": (lambda x: fnp.diff(x, 2), lambda x: np.diff(x, 2), (A,)),
    "gradient": (lambda x: fnp.gradient(x), np.gradient, (A,)),
}
BUILDERS = (
    sort, argsort, partition, arg_extremum, cumsum, cumprod, diff, gradient,
)  # fmt: skip
test_matches_numpy_with_gradients, test_compiled = table_tests(BUILDERS, FUSED)


def test_sort_ties_follow_the_stable_order():
    # Equal values keep their order: the first of them gets the first sorted place.
    x = np.array([2.0, 1.0, 2.0, 1.0])
    g = fg.grad(lambda x: fnp.sum(fnp.sort(x) * np.array([1.0, 2.0, 3.0, 4.0])))(x)
    np.testing.assert_array_equal(g, [3.0, 1.0, 4.0, 2.0])
    t = fg.jvp(fnp.sort, (x,), (np.array([10.0, 20.0, 30.0, 40.0]),))[1]
    np.testing.assert_array_equal(t, [20.0, 40.0, 10.0, 30.0])


def test_max_and_min_ties_split_the_gradient():
    x = np.array([[3.0, 1.0, 3.0], [0.0, 0.0, 0.0]])
    g = fg.grad(lambda x: fnp.sum(fnp.max(x, axis=1)))(x)
    np.testing.assert_allclose(g, [[0.5, 0, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    g = fg.jit(fg.grad(lambda x: fnp.min(x)))(x)
    np.testing.assert_allclose(g, [[0, 0, 0], [1 / 3, 1 / 3, 1 / 3]])


def test_cumprod_gradient_is_exact_at_zeros():
    x = np.array([2.0, 0.0, 3.0, 0.0, 5.0])
    # d/dx_i of sum(cumprod(x)): the sum over j >= i of the product of x_k, k <= j, k != i.
    expected = [1.0, 2.0 + 6.0, 0.0, 0.0, 0.0]
    np.testing.assert_array_equal(fg.grad(lambda x: fnp.sum(fnp.cumprod(x)))(x), expected)
    check_grads(lambda x: fnp.cumprod(x), (x,), order=3, modes=("fwd", "rev"))


def test_argsort_and_argmax_have_no_gradient():
    x = np.array([0.3, -1.0, 2.0])
    assert fg.grad(lambda x: fnp.sum(x * fnp.argsort(x)))(x).tolist() == [1.0, 0.0, 2.0]
    assert fg.grad(lambda x: x[fnp.argmax(x)])(x).tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda x: fnp.sort(x, 2), ValueError, "out of bounds"),
        (lambda x: fnp.sort(x, kind="bogus"), ValueError, "kind"),
        (lambda x: fnp.partition(x, 3), ValueError, "kth 3 is out of bounds"),
        (lambda x: fnp.cumsum(x, -3), ValueError, "out of bounds"),
        (lambda x: fnp.diff(x, -1), ValueError, "non-negative"),
        (lambda x: fnp.gradient(x[:, :1]), ValueError, "at least 2"),
        (lambda x: fnp.gradient(x, edge_order=3), ValueError, "edge_order"),
        (lambda x: fnp.gradient(x, 1.0, 2.0, 3.0), TypeError, "one per axis"),
        (lambda x: fnp.argmax(x, 2), ValueError, "out of bounds"),
    ],
)
def test_bad_arguments_get_clear_errors(call, error, match):
    assert_rejected(call, error, match, np.ones((2, 3)))
