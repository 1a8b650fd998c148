"""Statistics (ops.statistics, and var/std with ddof): values against NumPy on hypothesis
shapes (size-0 and size-1 axes included), traced and eager, float32 and float64, with
derivatives at orders 1 and 2; NaN handling; the compiled kernels; clear errors."""

import warnings

import numpy as np
import pytest
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from numpy_check import assert_rejected, axes_of, shapes, table_tests, values


def _reduced(shape, axis):
    axes = range(len(shape)) if axis is None else np.atleast_1d(axis) % max(len(shape), 1)
    return int(np.prod([shape[a] for a in axes]))


def var_std(draw):
    x = draw(values(draw(shapes(min_side=1))))
    axis = axes_of(draw, x.ndim)
    ddof = draw(st.integers(0, max(_reduced(x.shape, axis) - 1, 0)))
    keepdims = draw(st.booleans())
    # std's derivative is infinite where the deviation is 0: keep it away from there.
    name = "std" if _reduced(x.shape, axis) > 1 and draw(st.booleans()) else "var"
    if name == "std":
        x = draw(values(x.shape, unique=True))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (
        (lambda x: ours(x, axis, keepdims=keepdims, ddof=ddof)),
        (lambda x: theirs(x, axis, keepdims=keepdims, ddof=ddof)),
        (x,),
    )


def average(draw):
    x = draw(values(draw(shapes(min_side=1))))
    axis = axes_of(draw, x.ndim)
    keepdims, returned = draw(st.booleans()), draw(st.booleans())
    kind = draw(st.sampled_from(["none", "full", "axes"]))
    if kind == "none":
        return (
            (lambda x: fnp.average(x, axis, returned=returned, keepdims=keepdims)),
            (lambda x: np.average(x, axis, returned=returned, keepdims=keepdims)),
            (x,),
        )
    if kind == "axes" and axis is not None:
        axes = sorted(np.atleast_1d(axis) % x.ndim)
        w = draw(values(tuple(x.shape[a] for a in axes), 0.5, 2.0))
    else:
        w = draw(values(x.shape, 0.5, 2.0))
    return (
        (lambda x, w: fnp.average(x, axis, w, returned, keepdims=keepdims)),
        (lambda x, w: np.average(x, axis, w, returned, keepdims=keepdims)),
        (x, w),
    )


def median(draw):
    x = draw(values(draw(shapes(min_side=1)), unique=True))
    axis = axes_of(draw, x.ndim)
    keepdims = draw(st.booleans())
    return (
        (lambda x: fnp.median(x, axis, keepdims=keepdims)),
        (lambda x: np.median(x, axis, keepdims=keepdims)),
        (x,),
    )


def _q(draw, n, scale=1.0):
    # Inside (0, 1) and away from the kinks, where q * (n - 1) is a whole number.
    q = draw(st.floats(0.01, 0.99))
    if n > 1 and abs(q * (n - 1) - round(q * (n - 1))) < 1e-3:
        q = (np.floor(q * (n - 1)) + 0.5) / (n - 1)
    return q * scale


def quantile(draw):
    x = draw(values(draw(shapes(min_side=1)), unique=True))
    axis = axes_of(draw, x.ndim)
    n = _reduced(x.shape, axis)
    keepdims = draw(st.booleans())
    q = np.array([_q(draw, n) for _ in range(draw(st.integers(0, 3)))])
    if draw(st.booleans()):  # a traced q: the gradient flows to it too
        return (
            (lambda x, q: fnp.quantile(x, q, axis, keepdims=keepdims)),
            (lambda x, q: np.quantile(x, q, axis, keepdims=keepdims)),
            (x, q),
        )
    q = q.tolist() if draw(st.booleans()) else _q(draw, n)
    return (
        (lambda x: fnp.quantile(x, q, axis, keepdims=keepdims)),
        (lambda x: np.quantile(x, q, axis, keepdims=keepdims)),
        (x,),
    )


def percentile(draw):
    x = draw(values(draw(shapes(min_side=1)), unique=True))
    axis = axes_of(draw, x.ndim)
    q = _q(draw, _reduced(x.shape, axis), 100.0)
    return (lambda x: fnp.percentile(x, q, axis)), (lambda x: np.percentile(x, q, axis)), (x,)


def cov(draw):
    shape = draw(shapes(min_dims=1, max_dims=2, min_side=1))
    rowvar, bias = draw(st.booleans()), draw(st.booleans())
    n = shape[-1] if rowvar or len(shape) == 1 else shape[0]
    ddof = draw(st.none() | st.integers(0, max(n - 1, 0)))
    arrays = {"m": draw(values(shape))}
    if draw(st.booleans()):
        arrays["y"] = draw(values(shape))
    weights = draw(st.sampled_from(["none", "f", "a", "both"]))
    fweights = np.array(draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)))
    fweights = fweights if weights in ("f", "both") else None
    if weights in ("a", "both"):
        arrays["aweights"] = draw(values((n,), 0.5, 2.0))
    if n == 1 or (weights != "none" and n == 2):
        ddof = 0  # otherwise (almost) no degrees of freedom are left: a division by ~0
    if "y" in arrays and (len(shape) == 2 and shape[0] == 1 and not rowvar):
        del arrays["y"]  # m's variables are its columns, y's its row: they do not fit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            np.cov(**arrays, rowvar=rowvar, bias=bias, ddof=ddof, fweights=fweights)
        except RuntimeWarning:  # no degrees of freedom left: NumPy divides by zero
            ddof = 0

    def call(module):
        return lambda *xs: module.cov(
            **dict(zip(arrays, xs, strict=True)), rowvar=rowvar, bias=bias, ddof=ddof,
            fweights=fweights,
        )  # fmt: skip

    return call(fnp), call(np), tuple(arrays.values())


def corrcoef(draw):
    shape = draw(shapes(min_dims=1, max_dims=2, min_side=2, max_side=4))
    x = draw(values(shape, unique=True))
    rowvar = draw(st.booleans())
    if (shape[-1] if rowvar or len(shape) == 1 else shape[0]) < 2:
        rowvar = not rowvar
    return (
        (lambda x: fnp.corrcoef(x, rowvar=rowvar)),
        (lambda x: np.corrcoef(x, rowvar=rowvar)),
        (x,),
    )


def nan_reductions(draw):
    x = draw(values(draw(shapes(min_side=1))))
    x = np.where(draw(values(x.shape)) > 1.0, np.nan, x)
    axis = axes_of(draw, x.ndim)
    keepdims = draw(st.booleans())
    name = draw(st.sampled_from(["nansum", "nanmean"]))
    if name == "nanmean" and np.any(np.all(np.isnan(x), axis=axis)):
        x = np.nan_to_num(x, nan=0.25)  # an all-NaN slice: NaN with a warning in NumPy
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (
        (lambda x: ours(x, axis, keepdims=keepdims)),
        (lambda x: theirs(x, axis, keepdims=keepdims)),
        (x,),
    )


rng = np.random.default_rng(3)
A = rng.standard_normal((3, 5))
W = rng.uniform(0.5, 2, 5)
FUSED = {
    "average": (
        lambda x, w: fnp.average(x, 1, w),
        lambda x, w: np.average(x, 1, w),
        (A, W),
    ),
    "var": (lambda x: fnp.var(x, 0, ddof=1), lambda x: np.var(x, 0, ddof=1), (A,)),
    "median": (lambda x: fnp.median(x, 1), lambda x: np.median(x, 1), (A,)),
    "quantile": (
        lambda x, q: fnp.quantile(x, q, 0),
        lambda x, q: np.quantile(x, q, 0),
        (A, np.array([0.3, 0.8])),
    ),
    "percentile": (lambda x: fnp.percentile(x, 40.0), lambda x: np.percentile(x, 40.0), (A,)),
    "cov": (lambda x, w: fnp.cov(x, aweights=w), lambda x, w: np.cov(x, aweights=w), (A, W)),
    "corrcoef": (fnp.corrcoef, np.corrcoef, (A,)),
    "any": (
        lambda x: fnp.where(fnp.any(x > 1, 1), 1.0, fnp.all(x > -1, 1) * x[:, 0]),
        lambda x: np.where(np.any(x > 1, 1), 1.0, np.all(x > -1, 1) * x[:, 0]),
        (A,),
    ),
    "nansum": (
        lambda x: fnp.nansum(fnp.log(x), 1) + fnp.nanmean(fnp.log(x), 1),
        lambda x: np.nansum(np.log(x), 1) + np.nanmean(np.log(x), 1),
        (A,),
    ),
}


def counting(draw):
    x = draw(values(draw(shapes())))
    x = np.where(x > 0.5, x, 0.0)
    axis = axes_of(draw, x.ndim)
    keepdims = draw(st.booleans())
    name = draw(st.sampled_from(["any", "all", "count_nonzero"]))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (
        (lambda x: ours(x > 0, axis, keepdims=keepdims) if name != "count_nonzero"
         else ours(x, axis, keepdims=keepdims)),
        (lambda x: np.asarray(theirs(x > 0, axis, keepdims=keepdims) if name != "count_nonzero"
         else theirs(x, axis, keepdims=keepdims))),
        (x,),
    )  # fmt: skip


BUILDERS = (
    var_std, average, median, quantile, percentile, cov, corrcoef, nan_reductions, counting,
)  # fmt: skip
test_matches_numpy_with_gradients, test_compiled = table_tests(BUILDERS, FUSED)


def test_nan_in_a_slice_gives_nan_as_numpy():
    x = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 4.0]])
    for name, args in (("median", ()), ("quantile", (0.25,)), ("percentile", (25.0,))):
        expected = getattr(np, name)(x, *args, axis=1)
        ours = getattr(fnp, name)
        np.testing.assert_array_equal(ours(x, *args, axis=1), expected)
        traced = fg.jit(lambda x, f=ours, a=args: f(x, *a, axis=1))(x)
        np.testing.assert_array_equal(traced, expected)


def test_median_gradient_goes_to_the_middle_values():
    x = np.array([4.0, 1.0, 3.0, 2.0])
    np.testing.assert_array_equal(fg.grad(fnp.median)(x), [0, 0, 0.5, 0.5])
    np.testing.assert_array_equal(fg.grad(fnp.median)(x[:3]), [0, 0, 1, 0][:3])


def test_a_traced_q_out_of_range_is_nan():
    x = np.arange(5.0)
    out = fg.jit(lambda x, q: fnp.quantile(x, q))(x, np.array([-0.5, 0.5, 1.5]))
    np.testing.assert_array_equal(out, [np.nan, 2.0, np.nan])


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda x: fnp.quantile(x, 1.5), ValueError, "range"),
        (lambda x: fnp.percentile(x, -1.0), ValueError, "range"),
        (lambda x: fnp.quantile(x, 0.5, method="nearest"), ValueError, "linear"),
        (lambda x: fnp.median(x, 2), ValueError, "out of bounds"),
        (lambda x: fnp.median(x[:, :0], 1), ValueError, "empty"),
        (lambda x: fnp.average(x, 1, np.zeros(3)), ZeroDivisionError, "sum to zero"),
        (lambda x: fnp.average(x, None, np.ones(3)), TypeError, "axis must be given"),
        (lambda x: fnp.average(x, 1, np.ones(2)), ValueError, "do not fit"),
        (lambda x: fnp.cov(x, fweights=np.array([1.5, 1, 1])), TypeError, "fweights"),
        (lambda x: fnp.cov(x, ddof=1.5), ValueError, "ddof"),
        (lambda x: fnp.cov(x, aweights=-np.ones(3)), ValueError, "non-negative"),
    ],
)
def test_bad_arguments_get_clear_errors(call, error, match):
    assert_rejected(call, error, match, np.ones((2, 3)))
