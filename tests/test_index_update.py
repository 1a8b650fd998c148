"""`x.at[idx].set/add/multiply/min/max`: values against NumPy's in-place updates, and
derivatives in both arguments at repeated indices and ties, with JAX's conventions.

(test_structural.py checks every update primitive's gradients to second order against
finite differences; here the conventions where finite differences say nothing.)
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.testing import check_grads

rng = np.random.default_rng(1)
X = rng.standard_normal((4, 3))
UFUNCS = {"add": np.add, "multiply": np.multiply, "min": np.minimum, "max": np.maximum}


def numpy_update(x, index, method, v):
    out = x.copy()
    if method == "set":
        out[index] = v
    else:
        UFUNCS[method].at(out, index, v)
    return out


INDICES = [
    (1, ()),
    ((slice(1, 3), 0), (2,)),
    ((Ellipsis, -1), (4,)),
    ((slice(None, None, -2), slice(1, None)), (2, 2)),
    (np.array([3, 0, 3]), (3, 3)),  # a repeated row
    ((np.array([[0], [2]]), np.array([1, 2, 1])), (2, 3)),  # broadcast index arrays
    ((slice(None), np.array([2, 2])), (4, 2)),
    (X > 0.5, None),  # a concrete boolean mask
]


@pytest.mark.parametrize("method", ["set", "add", "multiply", "min", "max"])
@pytest.mark.parametrize("case", range(len(INDICES)))
def test_matches_numpy_in_place_updates(method, case):
    index, shape = INDICES[case]
    shape = X[index].shape if shape is None else shape
    v = rng.standard_normal(shape)
    expected = numpy_update(X, index, method, v)
    for fuse in (True, False):
        got = fg.jit(lambda x, v: getattr(x.at[index], method)(v), fuse=fuse)(X, v)
        np.testing.assert_allclose(got, expected, rtol=1e-15)


def test_values_broadcast_and_take_the_array_dtype():
    x = np.zeros((3, 2), np.float32)
    got = fg.jit(lambda x: x.at[:, 1].set(2.0))(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [[0, 2], [0, 2], [0, 2]])
    got = fg.jit(lambda x, v: x.at[1:].add(v))(x, np.array([1.0, 2.0]))  # v float64
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [[0, 0], [1, 2], [1, 2]])
    assert fg.jit(lambda x: x.at[0].get())(X).tolist() == X[0].tolist()


def test_repeated_indices_accumulate_in_add_and_its_gradient_reaches_each_update():
    idx = np.array([1, 1, 1, 0])
    f = fg.jit(lambda x, v: x.at[idx].add(v))
    np.testing.assert_array_equal(f(np.zeros(3), np.ones(4)), [1.0, 3.0, 0.0])
    gx, gv = fg.grad(lambda x, v: fnp.sum(f(x, v) * np.array([1.0, 2.0, 3.0])), (0, 1))(
        np.zeros(3), np.ones(4)
    )
    np.testing.assert_array_equal(gx, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(gv, [2.0, 2.0, 2.0, 1.0])


def test_set_at_repeated_indices_the_update_that_lands_gets_the_gradient():
    idx = np.array([2, 0, 2])

    def f(x, v):
        return fnp.sum(x.at[idx].set(v) * np.array([1.0, 10.0, 100.0, 1000.0]))

    x, v = np.ones(4), np.array([5.0, 6.0, 7.0])
    assert fg.jit(lambda x, v: x.at[idx].set(v))(x, v).tolist() == [6.0, 1.0, 7.0, 1.0]
    gx, gv = fg.jit(fg.grad(f, (0, 1)))(x, v)
    np.testing.assert_array_equal(gx, [0.0, 10.0, 0.0, 1000.0])  # overwritten: no gradient
    np.testing.assert_array_equal(gv, [0.0, 1.0, 100.0])  # the first 2 is overwritten
    # forward mode agrees: the output's tangent is the landed update's
    _, t = fg.jvp(lambda v: fnp.at(x)[idx].set(v), (v,), (np.array([1.0, 2.0, 3.0]),))
    np.testing.assert_array_equal(t, [2.0, 0.0, 3.0, 0.0])


@pytest.mark.parametrize("method", ["min", "max"])
def test_min_and_max_share_the_gradient_among_ties(method):
    # Element 0 ties x with one update; element 1 ties two updates; element 2 is x's.
    x = np.array([1.0, 0.0, 2.0])
    v = np.array([1.0, 3.0, 3.0]) if method == "max" else np.array([1.0, -3.0, -3.0])
    idx = np.array([0, 1, 1])
    f = lambda x, v: getattr(fnp.at(x)[idx], method)(v)  # noqa: E731
    gx, gv = fg.grad(lambda x, v: fnp.sum(f(x, v) * np.array([1.0, 2.0, 4.0])), (0, 1))(x, v)
    np.testing.assert_array_equal(gx, [0.5, 0.0, 4.0])
    np.testing.assert_array_equal(gv, [0.5, 1.0, 1.0])
    _, t = fg.jvp(f, (x, v), (np.array([1.0, 1.0, 1.0]), np.array([3.0, 5.0, 7.0])))
    np.testing.assert_array_equal(t, [2.0, 6.0, 1.0])


def test_multiply_at_repeated_indices_and_zeros_is_exact():
    idx = np.array([0, 0, 1, 1, 1])
    v = np.array([2.0, 0.0, 3.0, 0.0, 0.0])

    def f(x, v):  # fnp.at(x) is x.at on plain arrays too, as finite differences need
        return fnp.sum(fnp.at(x)[idx].multiply(v) * np.array([1.0, 2.0]))

    gx, gv = fg.grad(f, (0, 1))(np.array([5.0, 7.0]), v)
    np.testing.assert_array_equal(gx, [0.0, 0.0])
    # d/dv0 = x0 * v1 = 0; d/dv1 = x0 * v0 = 10; two zeros at element 1: all 0
    np.testing.assert_array_equal(gv, [0.0, 10.0, 0.0, 0.0, 0.0])
    check_grads(f, (np.array([5.0, 7.0]), np.array([2.0, 0.5, 3.0, -1.0, 1.5])), order=2)


def test_multiply_second_derivative_at_one_zero_update():
    # f = x0 * v0 * v1 at v1 == 0: d2f / dv0 dv1 = x0 (the rule once divided by the
    # updates and gave a constant 0 here).
    idx = np.array([0, 0])
    h = fg.hessian(lambda v: fnp.sum(fnp.at(np.array([5.0]))[idx].multiply(v)))(
        np.array([2.0, 0.0])
    )
    np.testing.assert_allclose(h, [[0.0, 5.0], [5.0, 0.0]])


@given(st.data())
def test_gradients_of_every_update_in_both_arguments(data):
    n = data.draw(st.integers(1, 5))
    k = data.draw(st.integers(1, 6))
    idx = np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=k, max_size=k)))
    method = data.draw(st.sampled_from(["set", "add", "multiply", "min", "max"]))
    x = np.array(data.draw(st.lists(st.integers(-20, 20), min_size=n, max_size=n))) / 8.0
    # Distinct update values and away from x's: min and max are smooth there.
    v = np.array(data.draw(st.lists(st.integers(-9, 9), min_size=k, max_size=k, unique=True)))
    v = v / 5.0 + 0.05

    def f(x, v):
        return fnp.sum(fnp.sin(getattr(fnp.at(x)[idx], method)(v)))

    np.testing.assert_allclose(
        fg.jit(lambda x, v: getattr(x.at[idx], method)(v))(x, v), numpy_update(x, idx, method, v)
    )
    check_grads(f, (x, v), order=2, modes=("fwd", "rev"))


def test_traced_indices_and_hessians():
    labels = np.array([2, 0, 2])

    @fg.jit
    def f(x, labels):
        return fnp.sum(fnp.zeros_like(x).at[labels].add(x[: labels.shape[0]] ** 2))

    assert float(f(np.arange(4.0), labels)) == 5.0
    np.testing.assert_array_equal(
        fg.hessian(lambda x: f(x, labels))(np.arange(4.0)), np.diag([2.0, 2.0, 2.0, 0.0])
    )


def test_update_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"x.at\[...\].set: values of shape \(2,\) cannot be"):
        fg.jit(lambda x: x.at[0].set(np.ones(2)))(X)
    with pytest.raises(IndexError, match="None"):
        fg.jit(lambda x: x.at[None, 0].set(1.0))(X)
    with pytest.raises(IndexError, match="out of bounds"):
        fg.jit(lambda x: x.at[np.array([7])].set(1.0))(X)
    with pytest.raises(
        ValueError, match=r"values of shape \(2,\) cannot be broadcast to x \(with a traced mask"
    ):
        fg.jit(lambda x: x.at[x > 0].set(np.ones(2)))(X)


def test_a_traced_boolean_mask_updates_elementwise():
    # How many elements the mask picks is unknown while tracing: values broadcast to x.
    expected = np.where(X > 0, X * 3.0, X)
    np.testing.assert_array_equal(fg.jit(lambda x: x.at[x > 0].multiply(3.0))(X), expected)
    g = fg.grad(lambda x: fnp.sum(x.at[x > 0].set(2.0) * x))(X)
    np.testing.assert_array_equal(g, np.where(X > 0, 2.0, 2 * X))


def test_item_assignment_says_what_to_use_instead():
    def f(x):
        x[0] = 1.0
        return x

    with pytest.raises(fg.TracerError, match=r"immutable.*x = x.at\[idx\].set\(v\)"):
        fg.jit(f)(X)
    with pytest.raises(fg.TracerError, match=r"\.add\(v\) for x\[idx\] \+= v"):
        fg.grad(lambda x: fnp.sum(f(x)))(X)
