"""NaN-skipping reductions and scans (ops.nan_reductions, nanmedian/nanquantile), numerical
routines (ops.numerical), searchsorted/digitize, put_along_axis, NumPy 2's array-API names
(ops.array_api) and the `%`, `//` and divmod operators on traced values: values against
NumPy on hypothesis shapes (size-0 and size-1 axes included), traced and eager, float32
and float64, with derivatives at orders 1 and 2; the compiled kernels; clear errors."""

import warnings

import numpy as np
import pytest
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.pytree import flatten
from numpy_check import assert_rejected, axes_of, check_case, shapes, table_tests, values


def _with_nans(draw, x, axis):
    """`x` with some values NaN, but never a whole slice along `axis` (there NumPy's
    result is a NaN that finite differences cannot check; test_all_nan_slices does)."""
    mask = draw(values(x.shape)) > 1.0
    x = np.where(mask, np.nan, x)
    empty = np.all(np.isnan(x), axis=axis, keepdims=True) if x.size else np.zeros((), bool)
    return np.where(np.isnan(x) & empty, 0.125 + np.abs(np.nan_to_num(x)), x)


def _valid_count(x, axis):
    return int(np.min(np.sum(~np.isnan(x), axis=axis))) if x.size else 0


def nan_reductions(draw):
    x = draw(values(draw(shapes(min_side=1)), unique=True))
    name = draw(st.sampled_from(["nanmax", "nanmin", "nanprod", "nanvar", "nanstd"]))
    axis = axes_of(draw, x.ndim)
    x = _with_nans(draw, x, axis)
    keepdims = draw(st.booleans())
    kwargs = {"keepdims": keepdims}
    if name in ("nanvar", "nanstd"):
        count = _valid_count(x, axis)
        if name == "nanstd" and count < 2:
            name = "nanvar"  # a single value's deviation is 0, where sqrt has no derivative
        kwargs["ddof"] = draw(st.integers(0, max(count - 1 - (name == "nanstd"), 0)))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (
        (lambda x: ours(x, axis=axis, **kwargs)),
        (lambda x: theirs(x, axis=axis, **kwargs)),
        (x,),
    )


def nan_arg_reductions(draw):
    x = draw(values(draw(shapes(min_side=1))))
    axis = None if x.ndim == 0 else draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
    x = _with_nans(draw, x, axis)
    name = draw(st.sampled_from(["nanargmax", "nanargmin"]))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (lambda x: ours(x, axis)), (lambda x: np.asarray(theirs(x, axis))), (x,)


def nan_scans(draw):
    x = draw(values(draw(shapes())))
    x = np.where(draw(values(x.shape)) > 1.0, np.nan, x)
    axis = None if x.ndim == 0 else draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
    name = draw(st.sampled_from(["nancumsum", "nancumprod"]))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (lambda x: ours(x, axis)), (lambda x: theirs(x, axis)), (x,)


def nan_order_statistics(draw):
    x = draw(values(draw(shapes(min_side=1)), unique=True))
    axis = axes_of(draw, x.ndim)
    x = _with_nans(draw, x, axis)
    keepdims = draw(st.booleans())
    name = draw(st.sampled_from(["nanmedian", "nanquantile", "nanpercentile"]))
    if name == "nanmedian":
        return (
            (lambda x: fnp.nanmedian(x, axis, keepdims=keepdims)),
            (lambda x: np.nanmedian(x, axis, keepdims=keepdims)),
            (x,),
        )
    scale = 100.0 if name == "nanpercentile" else 1.0
    # Positions that fall between values: at a value itself a quantile has a kink.
    q = draw(st.sampled_from([0.3, 0.55, 0.85, [0.15, 0.7]]))
    q = np.asarray(q) * scale
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (
        (lambda x: ours(x, q, axis, keepdims=keepdims)),
        (lambda x: theirs(x, q, axis, keepdims=keepdims)),
        (x,),
    )


def interp(draw):
    # Knots and points drawn apart from one another: at a knot the interpolant has a kink.
    k = draw(st.integers(1, 4))
    m = draw(st.integers(0, 4))
    both = draw(values((k + m,), -3.0, 3.0, unique=True))
    xp, x = np.sort(both[:k]), both[k:].reshape(draw(st.sampled_from([(m,), (1, m)])))
    fp = draw(values((k,)))
    bounds = draw(st.sampled_from([{}, {"left": -5.0}, {"left": 0.5, "right": 2.0}]))
    return (
        (lambda x, xp, fp: fnp.interp(x, xp, fp, **bounds)),
        (lambda x, xp, fp: np.interp(x, xp, fp, **bounds).astype(np.result_type(x, xp, fp))),
        (x, xp, fp),
    )


def trapezoid(draw):
    y = draw(values(draw(shapes(min_dims=1, min_side=1))))
    axis = draw(st.integers(-y.ndim, y.ndim - 1))
    kind = draw(st.sampled_from(["dx", "1-D", "full"]))
    if kind == "dx":
        dx = draw(st.sampled_from([1.0, 0.25]))
        return (
            (lambda y: fnp.trapezoid(y, dx=dx, axis=axis)),
            (lambda y: np.trapezoid(y, dx=dx, axis=axis)),
            (y,),
        )
    x = np.cumsum(draw(values((y.shape[axis],), 0.1, 1.0)))
    if kind == "full":
        x = np.moveaxis(np.broadcast_to(x, np.moveaxis(y, axis, -1).shape), -1, axis).copy()
    return (
        (lambda y, x: fnp.trapezoid(y, x, axis=axis)),
        (lambda y, x: np.trapezoid(y, x, axis=axis)),
        (y, x),
    )


def convolutions(draw):
    a = draw(values((draw(st.integers(1, 5)),)))
    v = draw(values((draw(st.integers(1, 5)),)))
    mode = draw(st.sampled_from(["full", "same", "valid"]))
    name = draw(st.sampled_from(["convolve", "correlate"]))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (lambda a, v: ours(a, v, mode)), (lambda a, v: theirs(a, v, mode)), (a, v)


def polyval(draw):
    p = draw(values((draw(st.integers(1, 4)),)))
    x = draw(values(draw(shapes())))
    return fnp.polyval, np.polyval, (p, x)


def ptp(draw):
    x = draw(values(draw(shapes(min_side=1)), unique=True))
    axis = axes_of(draw, x.ndim)
    keepdims = draw(st.booleans())
    return (
        (lambda x: fnp.ptp(x, axis, keepdims=keepdims)),
        (lambda x: np.ptp(x, axis, keepdims=keepdims)),
        (x,),
    )


def closeness(draw):
    a = draw(values(draw(shapes())))
    special = np.array([np.nan, np.inf, -np.inf, 0.0])
    pick = draw(values(a.shape)) > 1.0
    a = np.where(pick, special[np.arange(a.size).reshape(a.shape) % 4], a)
    b = np.where(draw(values(a.shape)) > 0, a * (1 + 1e-7), a + 0.5)
    equal_nan = draw(st.booleans())
    return (
        (lambda a, b: fnp.isclose(a, b, equal_nan=equal_nan)),
        (lambda a, b: np.isclose(a, b, equal_nan=equal_nan)),
        (a, b),
    )


def searches(draw):
    edges = np.sort(draw(values((draw(st.integers(1, 5)),), unique=True)))
    x = draw(values(draw(shapes())))
    x = np.where(draw(values(x.shape)) > 1.0, edges[0], x)  # some on an edge exactly
    if draw(st.booleans()):
        side = draw(st.sampled_from(["left", "right"]))
        return (
            (lambda e, x: fnp.searchsorted(e, x, side)),
            (lambda e, x: np.searchsorted(e, x, side)),
            (edges, x),
        )
    right, edges = draw(st.booleans()), edges[:: draw(st.sampled_from([1, -1]))]
    return (
        (lambda x: fnp.digitize(x, edges, right)),
        (lambda x: np.digitize(x, edges, right)),
        (x,),
    )


def put_along_axis(draw):
    arr = draw(values(draw(shapes(min_dims=1, min_side=1))))
    axis = draw(st.integers(-arr.ndim, arr.ndim - 1))
    n = arr.shape[axis]
    k = draw(st.integers(0, n))
    mode = draw(st.sampled_from(["set", "add"]))
    # Distinct indices along the axis for "set" (the last of repeated ones lands, by a
    # convention of its own); any for "add".
    picks = (
        draw(st.permutations(range(n)))[:k]
        if mode == "set"
        else draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
    )
    shape = list(arr.shape)
    shape[axis] = k
    indices = np.moveaxis(
        np.broadcast_to(
            np.array(picks, dtype=np.intp), np.moveaxis(np.empty(shape), axis, -1).shape
        ),
        -1,
        axis,
    ).copy()
    vals = draw(values(draw(st.sampled_from([(), tuple(shape)]))))

    def reference(arr, vals):
        out = arr.copy()
        if mode == "set":
            np.put_along_axis(out, indices, vals, axis)
        else:
            np.add.at(out, _along(indices, axis), np.broadcast_to(vals, indices.shape))
        return out

    return (
        (lambda arr, vals: fnp.put_along_axis(arr, indices, vals, axis, inplace=False, mode=mode)),
        reference,
        (arr, vals),
    )


def _along(indices, axis):
    grids = np.indices(indices.shape, sparse=True)
    return tuple(indices if k == axis % indices.ndim else g for k, g in enumerate(grids))


def array_api(draw):
    x = draw(values(draw(shapes(min_dims=2, min_side=1))))
    name = draw(st.sampled_from(["vecdot", "matvec", "vecmat", "cumulative", "unstack", "concat"]))
    if name == "vecdot":
        y = draw(values(x.shape[-1:]))
        return fnp.vecdot, np.vecdot, (x, y)
    if name == "matvec":
        y = draw(values(x.shape[-1:]))
        return fnp.matvec, np.matvec, (x, y)
    if name == "vecmat":
        y = draw(values(x.shape[-2:-1]))
        return fnp.vecmat, np.vecmat, (y, x)
    if name == "cumulative":
        axis = draw(st.integers(-x.ndim, x.ndim - 1))
        include = draw(st.booleans())
        which = draw(st.sampled_from(["cumulative_sum", "cumulative_prod"]))
        ours, theirs = getattr(fnp, which), getattr(np, which)
        return (
            (lambda x: ours(x, axis=axis, include_initial=include)),
            (lambda x: theirs(x, axis=axis, include_initial=include)),
            (x,),
        )
    if name == "unstack":
        axis = draw(st.integers(-x.ndim, x.ndim - 1))
        return (lambda x: fnp.unstack(x, axis=axis)), (lambda x: np.unstack(x, axis=axis)), (x,)
    return (
        (lambda x: fnp.concat([x, x * 2], axis=None)),
        (lambda x: np.concat([x, x * 2], axis=None)),
        (x,),
    )


def elementwise_names(draw):
    name = draw(st.sampled_from(["acos", "asin", "atan", "asinh", "fabs", "positive", "signbit"]))
    x = draw(values(draw(shapes()), -0.9, 0.9))
    x = np.where(np.abs(x) < 0.05, 0.5, x)  # fabs has a kink at 0
    if name == "signbit":
        x = np.where(x > 0.5, -0.0, x)
    return getattr(fnp, name), getattr(np, name), (x,)


def small_relatives(draw):
    x = draw(values(draw(shapes()), -3.0, 3.0))
    # Away from integers, where fix and modf jump.
    x = np.where(np.abs(x - np.round(x)) < 0.1, x + 0.25, x)
    name = draw(st.sampled_from(["fix", "modf", "ldexp", "float_power", "isposinf"]))
    if name == "ldexp":
        n = np.arange(x.size).reshape(x.shape) % 5 - 2
        return (lambda x: fnp.ldexp(x, n)), (lambda x: np.ldexp(x, n)), (x,)
    if name == "float_power":
        return (
            (lambda x: fnp.float_power(np.abs(x) + 0.5, 1.5)),
            (lambda x: np.float_power(np.abs(x) + 0.5, 1.5)),
            (x,),
        )
    if name == "isposinf":
        x = np.where(x > 1.5, np.inf, np.where(x < -1.5, -np.inf, x))
        return (
            (lambda x: (fnp.isposinf(x), fnp.isneginf(x))),
            (lambda x: (np.isposinf(x), np.isneginf(x))),
            (x,),
        )
    return getattr(fnp, name), getattr(np, name), (x,)


def linalg_array_api(draw):
    batch = draw(shapes(max_dims=1, max_side=2))
    name = draw(
        st.sampled_from(["cross", "diagonal", "trace", "outer", "tensordot", "vecdot", "matmul"])
    )
    n = draw(st.integers(1, 3))
    x = draw(values(batch + (n, n)))
    y = draw(values(batch + (n, n)))
    ours, theirs = getattr(fnp.linalg, name), getattr(np.linalg, name)
    if name == "cross":
        x, y = draw(values(batch + (3,))), draw(values(batch + (3,)))
    elif name in ("diagonal", "trace"):
        offset = draw(st.integers(-n, n))
        return (lambda x: ours(x, offset=offset)), (lambda x: theirs(x, offset=offset)), (x,)
    elif name == "outer":
        x, y = x.reshape(-1), y.reshape(-1)[:2]
    elif name == "tensordot":
        y = draw(values((n, 2)))
        return (
            (lambda x, y: ours(x, y, axes=1)),
            (lambda x, y: theirs(x, y, axes=1)),
            (x, y),
        )
    return ours, theirs, (x, y)


def tensor_solves(draw):
    if draw(st.booleans()):
        a = draw(values((2, 3, 6))) + np.eye(6).reshape(2, 3, 6) * 3
        b = draw(values((2, 3)))
        return fnp.linalg.tensorsolve, np.linalg.tensorsolve, (a, b)
    a = draw(values((4, 2, 2))) + np.eye(4).reshape(4, 2, 2) * 3
    return (
        (lambda a: fnp.linalg.tensorinv(a, ind=1)),
        (lambda a: np.linalg.tensorinv(a, ind=1)),
        (a,),
    )


def operators(draw):
    shape = draw(shapes())
    y = draw(values(draw(st.sampled_from([(), shape[-1:]])), 0.5, 2.0))
    y = y * draw(st.sampled_from([1.0, -1.0]))
    # x / y an integer plus a fraction in [0.1, 0.9]: away from the jumps of % and //,
    # where finite differences break.
    whole = draw(st.lists(st.integers(-3, 3), min_size=1, max_size=1))[0]
    x = y * (whole + draw(values(shape, 0.1, 0.9)))
    op = draw(st.sampled_from(["mod", "floordiv", "divmod", "rmod"]))
    if op == "mod":
        return (lambda x, y: x % y), (lambda x, y: x % y), (x, y)
    if op == "floordiv":
        return (lambda x, y: x // y + x), (lambda x, y: x // y + x), (x, y)
    if op == "divmod":
        return (lambda x, y: divmod(x, y)), (lambda x, y: divmod(x, y)), (x, y)
    # 7.25 / y is 3.625, 5.8, 14.5, ... at the y drawn: never an integer.
    y = np.where(np.abs(7.25 / y - np.round(7.25 / y)) < 0.1, 1.5 * np.sign(y), y)
    return (lambda y: 7.25 % y), (lambda y: 7.25 % y), (y,)


rng = np.random.default_rng(5)
A = rng.standard_normal((3, 5))
A_NAN = np.where(A > 1.0, np.nan, A)
A_NAN[:, 0] = rng.standard_normal(3)
FUSED = {
    "nanmax": (
        lambda x: fnp.nanmax(x, 1) + fnp.nanmin(x, 0).sum(),
        lambda x: np.nanmax(x, 1) + np.nanmin(x, 0).sum(),
        (A_NAN,),
    ),
    "nanvar": (
        lambda x: fnp.nanvar(x, axis=1, ddof=1) + fnp.nanstd(x, axis=1),
        lambda x: np.nanvar(x, axis=1, ddof=1) + np.nanstd(x, axis=1),
        (A_NAN,),
    ),
    "nanmedian": (lambda x: fnp.nanmedian(x, 1), lambda x: np.nanmedian(x, 1), (A_NAN,)),
    "interp": (
        lambda x, fp: fnp.interp(x, np.array([-1.0, 0.0, 2.0]), fp),
        lambda x, fp: np.interp(x, np.array([-1.0, 0.0, 2.0]), fp),
        (A[0], np.array([1.0, -1.0, 3.0])),
    ),
    "convolve": (
        lambda a, v: fnp.convolve(a, v, "same"),
        lambda a, v: np.convolve(a, v, "same"),
        (A[0], A[1, :3]),
    ),
    "trapezoid": (lambda y: fnp.trapezoid(y, dx=0.5), lambda y: np.trapezoid(y, dx=0.5), (A,)),
    "polyval": (
        lambda p, x: fnp.polyval(p, x),
        lambda p, x: np.polyval(p, x),
        (A[0, :3], A),
    ),
    "put_along_axis": (
        lambda a: fnp.put_along_axis(a, np.array([[4], [0], [2]]), a[:, 1:2] * 3, 1, inplace=False),
        lambda a: _put(a, np.array([[4], [0], [2]]), a[:, 1:2] * 3, 1),
        (A,),
    ),
    "mod": (lambda x: x % 0.75 + x // 0.75, lambda x: x % 0.75 + x // 0.75, (A,)),
}


def _put(a, indices, values, axis):
    out = a.copy()
    np.put_along_axis(out, indices, values, axis)
    return out


BUILDERS = (
    nan_reductions, nan_arg_reductions, nan_scans, nan_order_statistics, interp, trapezoid,
    convolutions, polyval, ptp, closeness, searches, put_along_axis, array_api,
    elementwise_names, operators, small_relatives, linalg_array_api, tensor_solves,
)  # fmt: skip
test_matches_numpy_with_gradients, test_compiled = table_tests(BUILDERS, FUSED)


# ---------------------------------------------------------------- conventions and edges


def test_all_nan_slices_give_nan_as_numpy():
    x = np.array([[np.nan, np.nan], [1.0, np.nan]])
    for name in ("nanmax", "nanmin", "nanmean", "nanvar", "nanstd", "nanmedian"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = getattr(np, name)(x, axis=1)
        ours = getattr(fnp, name)
        np.testing.assert_array_equal(ours(x, axis=1), expected, err_msg=name)
        traced = fg.jit(lambda x, f=ours: f(x, axis=1))(x)
        np.testing.assert_array_equal(traced, expected, err_msg=name)
    # The gradient stays finite: the slice of NaNs gets none.
    g = fg.grad(lambda x: fnp.sum(fnp.nan_to_num(fnp.nanmax(x, axis=1))))(x)
    np.testing.assert_array_equal(g, [[0.0, 0.0], [1.0, 0.0]])


def test_nanargmax_of_a_slice_of_nans():
    x = np.array([[np.nan, np.nan], [1.0, np.nan]])
    with pytest.raises(ValueError, match="All-NaN slice"):
        np.nanargmax(x, axis=1)
    with pytest.raises(ValueError, match="all-NaN slice"):
        fnp.nanargmax(x, axis=1)
    np.testing.assert_array_equal(fg.jit(lambda x: fnp.nanargmax(x, axis=1))(x), [-1, 0])


def test_nan_reductions_of_integers_are_the_plain_ones():
    x = np.array([[3, 1], [2, 5]])
    for name in ("nansum", "nanprod", "nanmax", "nanmin", "nanargmax", "nanmean", "nanvar"):
        np.testing.assert_array_equal(
            getattr(fnp, name)(x, axis=0), getattr(np, name)(x, axis=0), err_msg=name
        )


def test_interp_at_the_knots_and_outside():
    xp, fp = np.array([0.0, 1.0, 1.0, 3.0]), np.array([0.0, 2.0, 5.0, 0.0])
    x = np.array([-1.0, 0.0, 0.5, 3.0, 4.0, np.nan])
    np.testing.assert_array_equal(fnp.interp(x, xp, fp), np.interp(x, xp, fp))
    np.testing.assert_array_equal(fg.jit(fnp.interp)(x, xp, fp), np.interp(x, xp, fp))
    # Repeated knots never divide by zero in the gradient.
    g = fg.grad(lambda fp: fnp.sum(fnp.interp(x[:5], xp, fp)))(fp)
    assert np.all(np.isfinite(g))
    check_case(lambda x: fnp.interp(x, xp, fp), lambda x: np.interp(x, xp, fp), (x[:5] + 0.25,))


def test_put_along_axis_set_keeps_the_last_of_repeated_indices():
    out = fnp.put_along_axis(np.zeros(3), np.array([1, 1]), np.array([4.0, 5.0]), 0, inplace=False)
    np.testing.assert_array_equal(out, [0.0, 5.0, 0.0])
    g = fg.grad(
        lambda v: fnp.sum(
            fnp.put_along_axis(np.zeros(3), np.array([1, 1]), v, 0, inplace=False) ** 2
        )
    )(np.array([4.0, 5.0]))
    np.testing.assert_array_equal(g, [0.0, 10.0])


def test_tracer_methods_and_operators_match_numpy():
    x = np.array([[2.5, -1.25, 3.0], [0.5, 4.0, -2.0]])

    def calls(x):
        return (
            x.cumsum(1), x.cumprod(), x.round(1), x.any(), x.all(0), x.argsort(), x.diagonal(),
            x.repeat(2, 0), x.take([2, 0], 1), x.real, x.imag, x.conj(), 2.0 // x, divmod(3.0, x),
        )  # fmt: skip

    f, expected = fg.jit(calls), calls(x)
    for got, want in zip(flatten(f(x))[0], flatten(expected)[0], strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(fg.TracerError, match=r"in place.*fnp.sort\(x\)"):
        fg.jit(lambda x: x.sort())(x)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda x: fnp.interp(x, [0.0, 1.0], [0.0, 1.0], period=2.0), ValueError, "period"),
        (lambda x: fnp.interp(x, np.zeros(0), np.zeros(0)), ValueError, "must not be empty"),
        (lambda x: fnp.interp(x, [0.0, 1.0], [0.0]), ValueError, "one length"),
        (lambda x: fnp.convolve(x, x, "wide"), ValueError, "mode must be"),
        (lambda x: fnp.convolve(x, x[:0]), ValueError, "v cannot be empty"),
        (lambda x: fnp.convolve(x[None], x), ValueError, "a must be 1-D"),
        (lambda x: fnp.put_along_axis(x, np.array([0]), 1.0, 0), ValueError, "inplace=False"),
        (
            lambda x: fnp.put_along_axis(x, np.array([0]), 1.0, 0, inplace=False, mode="or"),
            ValueError,
            "mode must be",
        ),
        (lambda x: fnp.digitize(x, [1.0, 0.0, 2.0]), ValueError, "monotonically"),
        (lambda x: fnp.searchsorted(x[None], x), ValueError, "a must be 1-D"),
        (lambda x: fnp.searchsorted(x, x, side="middle"), ValueError, "side must be"),
        (lambda x: fnp.nanvar(x, axis=3), ValueError, "axis"),
        (lambda x: fnp.nanquantile(x, 0.5, method="nearest"), ValueError, "method='linear'"),
        (lambda x: fnp.polyval(x[None], x), ValueError, "p must be 1-D"),
    ],
)
def test_bad_arguments_get_clear_errors(call, error, match):
    assert_rejected(call, error, match, np.array([0.5, 1.5, 2.5]))


def test_shape_queries_answer_from_the_type():
    x = np.zeros((2, 3))
    f = fg.jit(lambda x: fnp.full((fnp.ndim(x), fnp.size(x, 1)), fnp.size(x) * 1.0))
    np.testing.assert_array_equal(f(x), np.full((2, 3), 6.0))
    assert fg.jit(lambda x: fnp.zeros(fnp.shape(x)))(x).shape == (2, 3)


def test_digitize_with_traced_bins_says_they_must_be_concrete():
    with pytest.raises(TypeError, match="bins must be concrete"):
        fg.jit(lambda b: fnp.digitize(np.array([0.5]), b))(np.array([0.0, 1.0]))


# ---------------------------------------------------------------- index tools


def weighted_counts(draw):
    n = draw(st.integers(0, 6))
    x = np.array(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)), dtype=np.intp)
    w = draw(values((n,)))
    if draw(st.booleans()):
        minlength = draw(st.integers(0, 6))
        return (
            (lambda w: fnp.bincount(x, w, minlength)),
            (lambda w: np.bincount(x, w, minlength).astype(w.dtype)),
            (w,),
        )
    a = draw(values((n,), -1.0, 3.0))
    kw = draw(
        st.sampled_from(
            [{"bins": 2, "range": (0.0, 2.0)}, {"bins": [0.0, 1.0, 2.5, 3.0], "density": True}]
        )
    )
    if kw.get("density") and not np.any((a >= 0) & (a <= 3)):
        kw = {"bins": 2, "range": (0.0, 2.0)}  # the density divides by the total in range
    return (
        (lambda w: fnp.histogram(a, weights=w * w + 0.5, **kw)[0]),
        (lambda w: np.histogram(a, weights=w * w + 0.5, **kw)[0].astype(w.dtype)),
        (w,),
    )


def index_arithmetic(draw):
    """unravel_index and ravel_multi_index in C or Fortran order; ravel_multi_index with
    indices out of range (negative too) under 'wrap' and 'clip', for all axes or per axis."""
    shape = draw(shapes(min_dims=1, min_side=1))
    order = draw(st.sampled_from("CF"))
    flat = np.array(draw(st.lists(st.integers(0, int(np.prod(shape)) - 1), max_size=4)))
    flat = flat.astype(np.intp)
    if draw(st.booleans()):
        return (
            (lambda i: fnp.unravel_index(i, shape, order=order)),
            (lambda i: np.unravel_index(i, shape, order=order)),
            (flat,),
        )
    multi = np.unravel_index(flat, shape)
    mode = draw(st.sampled_from(["raise", "wrap", "clip", "per-axis"]))
    if mode == "per-axis":
        mode = tuple(draw(st.sampled_from(["wrap", "clip"])) for _ in shape)
    if mode != "raise":
        shift = draw(st.sampled_from([-2, 1, 3]))
        multi = tuple(m + shift * d for m, d in zip(multi, shape, strict=True))
    return (
        (lambda *m: fnp.ravel_multi_index(m, shape, mode=mode, order=order)),
        (lambda *m: np.ravel_multi_index(m, shape, mode=mode, order=order)),
        multi,
    )


def test_index_arithmetic_errors():
    """A bad mode or order names it, eager and traced."""
    m = (np.array([0, 1]), np.array([2, 0]))
    for call in (lambda *m: fnp.ravel_multi_index(m, (2, 3), mode="bounce"),
                 lambda *m: fnp.ravel_multi_index(m, (2, 3), mode=("wrap",)),
                 lambda *m: fnp.ravel_multi_index(m, (2, 3), order="K")):  # fmt: skip
        for run in (call, fg.jit(call)):
            with pytest.raises(ValueError, match="ravel_multi_index: (mode|order)"):
                run(*m)
    with pytest.raises(ValueError, match="unravel_index: order"):
        fg.jit(lambda i: fnp.unravel_index(i, (2, 3), order="A"))(m[0])
    with pytest.raises(ValueError, match="invalid entry"):  # NumPy's own, on plain arrays
        fnp.ravel_multi_index((np.array([2]), np.array([0])), (2, 3))


test_index_tools_match_numpy, _ = table_tests((weighted_counts, index_arithmetic), {})


def test_value_shaped_functions_need_concrete_values():
    x = np.array([[0.0, 2.0], [3.0, 0.0]])
    for name in ("nonzero", "argwhere", "flatnonzero", "unique"):
        expected, ours = getattr(np, name)(x), getattr(fnp, name)(x)
        for got, want in zip(flatten(ours)[0], flatten(expected)[0], strict=True):
            np.testing.assert_array_equal(got, want)
        with pytest.raises(fg.TracerError, match=f"{name}: the shape of its result depends"):
            fg.jit(getattr(fnp, name))(x)
    with pytest.raises(fg.TracerError, match="values of x"):
        fg.jit(lambda i: fnp.bincount(i))(np.array([0, 1]))
    np.testing.assert_array_equal(fnp.tril_indices_from(x, -1), np.tril_indices_from(x, -1))
    np.testing.assert_array_equal(fnp.triu_indices_from(x), np.triu_indices_from(x))
    np.testing.assert_array_equal(fnp.diag_indices_from(x), np.diag_indices_from(x))
    f = fg.jit(lambda x: x[fnp.triu_indices_from(x)] * fnp.result_type(x, np.float32).itemsize)
    np.testing.assert_array_equal(f(x), x[np.triu_indices(2)] * 8)


# ---------------------------------------------------------------- polynomials, rearranging


def polynomials(draw):
    p = draw(values((draw(st.integers(1, 4)),)))
    q = draw(values((draw(st.integers(1, 4)),)))
    name = draw(st.sampled_from(["polyadd", "polysub", "polymul", "polyder", "polyint"]))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    if name in ("polyder", "polyint"):
        m = draw(st.integers(0, 3))
        return (lambda p: ours(p, m)), (lambda p: theirs(p, m)), (p,)
    return ours, theirs, (p, q)


def vander(draw):
    x = draw(values((draw(st.integers(0, 4)),)))
    n = draw(st.none() | st.integers(0, 4))
    increasing = draw(st.booleans())
    return (
        (lambda x: fnp.vander(x, n, increasing)),
        (lambda x: np.vander(x, n, increasing).astype(x.dtype)),  # NumPy's is float64
        (x,),
    )


def ediff1d(draw):
    x = draw(values(draw(shapes())))
    ends = draw(st.sampled_from([{}, {"to_end": 0.5}, {"to_begin": [1.0, 2.0], "to_end": -1.0}]))
    return (lambda x: fnp.ediff1d(x, **ends)), (lambda x: np.ediff1d(x, **ends)), (x,)


def rearranging(draw):
    x = draw(values(draw(shapes(min_dims=1))))
    name = draw(st.sampled_from(["rollaxis", "delete", "block"]))
    if name == "rollaxis":
        axis = draw(st.integers(-x.ndim, x.ndim - 1))
        start = draw(st.integers(-x.ndim, x.ndim))
        return (
            (lambda x: fnp.rollaxis(x, axis, start)),
            (lambda x: np.rollaxis(x, axis, start)),
            (x,),
        )
    if name == "delete":
        axis = draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
        n = x.size if axis is None else x.shape[axis]
        obj = draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=n, unique=True)) if n else []
        return (lambda x: fnp.delete(x, obj, axis)), (lambda x: np.delete(x, obj, axis)), (x,)
    return (
        (lambda x: fnp.block([[x, x * 2.0], [x - 1.0, x]])),
        (lambda x: np.block([[x, x * 2.0], [x - 1.0, x]])),
        (x,),
    )


test_polynomials_and_rearranging_match_numpy, _ = table_tests(
    (polynomials, vander, ediff1d, rearranging), {}
)


def test_vander_gradient_is_exact_at_zero():
    g = fg.grad(lambda x: fnp.sum(fnp.vander(x, 3)))(np.array([0.0, 2.0]))
    np.testing.assert_array_equal(g, [1.0, 5.0])


# ---------------------------------------------------------------- building, predicates


def geomspace(draw):
    start = draw(values((), 0.5, 2.0))
    stop = draw(values(draw(st.sampled_from([(), (2,)])), 2.5, 8.0))
    sign = draw(st.sampled_from([1.0, -1.0]))
    num, endpoint = draw(st.integers(0, 5)), draw(st.booleans())
    axis = draw(st.integers(0, np.ndim(stop)))
    return (
        (lambda a, b: fnp.geomspace(a, b, num, endpoint, axis=axis)),
        (lambda a, b: np.geomspace(a, b, num, endpoint, axis=axis)),
        (start * sign, stop * sign),
    )


def membership(draw):
    x = draw(values(draw(shapes())))
    tests = np.concatenate([x.ravel()[:2], draw(values((draw(st.integers(0, 3)),)))])
    name = draw(st.sampled_from(["isin", "array_equal", "array_equiv", "i0"]))
    if name == "i0":
        return fnp.i0, np.i0, (x,)
    x = np.where(draw(values(x.shape)) > 1.5, np.nan, x)
    if name == "isin":
        invert = draw(st.booleans())
        return (
            (lambda x, t: fnp.isin(x, t, invert=invert)),
            (lambda x, t: np.isin(x, t, invert=invert)),
            (x, tests),
        )
    equal_nan = name == "array_equal" and draw(st.booleans())
    y = draw(st.sampled_from([x, x + 1.0, x.copy()] + ([x[..., :1]] if x.ndim else [])))
    ours = getattr(fnp, name)
    theirs = getattr(np, name)
    kwargs = {"equal_nan": equal_nan} if name == "array_equal" else {}
    return (
        (lambda x, y: fnp.asarray(ours(x, y, **kwargs))),
        (lambda x, y: np.asarray(theirs(x, y, **kwargs))),
        (x, y),
    )


test_building_and_predicates_match_numpy, _ = table_tests((geomspace, membership), {})


def test_windows_and_dtype_predicates_are_numpys():
    for name in ("bartlett", "blackman", "hamming", "hanning"):
        np.testing.assert_array_equal(getattr(fnp, name)(5), getattr(np, name)(5))
    np.testing.assert_array_equal(fnp.kaiser(5, 2.0), np.kaiser(5, 2.0))
    z = np.array([1 + 1j, 2 + 0j])
    assert fnp.iscomplexobj(z) and not fnp.isrealobj(z) and fnp.isscalar(2.0)
    np.testing.assert_array_equal(fnp.iscomplex(z), [True, False])
    np.testing.assert_array_equal(fnp.isreal(z), [False, True])
    flags = fg.jit(
        lambda x: (fnp.iscomplex(x), fnp.isreal(x), fnp.iscomplexobj(x) or fnp.isscalar(x))
    )(np.array([np.nan, 1.0]))
    np.testing.assert_array_equal(flags[0], [False, False])
    np.testing.assert_array_equal(flags[1], [True, True])
    assert flags[2] == np.False_
