"""Manipulation and selection (ops.manipulation, ops.selection, asarray and stack): values
against NumPy on hypothesis shapes (size-0 and size-1 axes included), traced and eager,
float32 and float64; derivatives at orders 1 and 2, forward and reverse; the compiled
kernels once per function; clear errors for what is not supported."""

import numpy as np
import pytest
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from numpy_check import assert_rejected, shapes, table_tests, values

# ---------------------------------------------------------------- cases drawn by hypothesis


def _axis(draw, ndim):
    return draw(st.integers(-ndim, ndim - 1))


def flip(draw):
    x = draw(values(draw(shapes())))
    axis = draw(st.none() | st.integers(-x.ndim, x.ndim - 1)) if x.ndim else None
    return (lambda x: fnp.flip(x, axis)), (lambda x: np.flip(x, axis)), (x,)


def rot90(draw):
    x = draw(values(draw(shapes(min_dims=2))))
    k = draw(st.integers(-5, 5))
    axes = tuple(draw(st.permutations(range(x.ndim)))[:2])
    return (lambda x: fnp.rot90(x, k, axes)), (lambda x: np.rot90(x, k, axes)), (x,)


def roll(draw):
    x = draw(values(draw(shapes())))
    shift = draw(st.integers(-7, 7))
    axis = _axis(draw, x.ndim) if x.ndim and draw(st.booleans()) else None
    return (lambda x: fnp.roll(x, shift, axis)), (lambda x: np.roll(x, shift, axis)), (x,)


def repeat(draw):
    x = draw(values(draw(shapes(min_dims=1))))
    axis = _axis(draw, x.ndim)
    n = x.shape[axis]
    counts = draw(st.integers(0, 3) | st.lists(st.integers(0, 2), min_size=n, max_size=n))
    return (lambda x: fnp.repeat(x, counts, axis)), (lambda x: np.repeat(x, counts, axis)), (x,)


def tile(draw):
    x = draw(values(draw(shapes(max_dims=2))))
    reps = tuple(draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
    return (lambda x: fnp.tile(x, reps)), (lambda x: np.tile(x, reps)), (x,)


def append(draw):
    x = draw(values(draw(shapes(min_dims=1))))
    axis = _axis(draw, x.ndim) if draw(st.booleans()) else None
    shape = list(x.shape)
    if axis is not None:
        shape[axis] = draw(st.integers(0, 2))
    y = draw(values(tuple(shape)))
    return (lambda x, y: fnp.append(x, y, axis)), (lambda x, y: np.append(x, y, axis)), (x, y)


def pad(draw):
    x = draw(values(draw(shapes(min_dims=1, max_dims=2, min_side=1))))
    mode = draw(st.sampled_from(["constant", "edge", "reflect", "symmetric", "wrap"]))
    width = st.tuples(st.integers(0, 5), st.integers(0, 5))
    widths = draw(st.lists(width, min_size=x.ndim, max_size=x.ndim))
    if mode == "reflect" and any(d == 1 for d in x.shape):
        mode = "symmetric"  # NumPy reflects a single element into itself
    if mode == "constant":
        return (
            (lambda x, c: fnp.pad(x, widths, constant_values=c)),
            (lambda x, c: np.pad(x, widths, constant_values=c)),
            (x, np.array(draw(st.floats(-2, 2)))),
        )
    return (lambda x: fnp.pad(x, widths, mode)), (lambda x: np.pad(x, widths, mode)), (x,)


def split(draw):
    x = draw(values(draw(shapes(min_dims=1))))
    axis = _axis(draw, x.ndim)
    n = x.shape[axis]
    how = draw(st.integers(1, 4) | st.lists(st.integers(-n - 1, n + 1), max_size=3))
    if isinstance(how, int):
        return (
            (lambda x: fnp.array_split(x, how, axis)),
            (lambda x: np.array_split(x, how, axis)),
            (x,),
        )
    return (lambda x: fnp.split(x, how, axis)), (lambda x: np.split(x, how, axis)), (x,)


def stacks(draw):
    name = draw(st.sampled_from(["vstack", "hstack", "dstack", "column_stack"]))
    shape = draw(shapes(max_dims=2))
    if name == "column_stack" and len(shape) == 0:
        shape = (2,)
    x, y = draw(values(shape)), draw(values(shape))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (lambda x, y: ours([x, y, x])), (lambda x, y: theirs([x, y, x])), (x, y)


def stack(draw):
    x = draw(values(draw(shapes())))
    axis = draw(st.integers(-x.ndim - 1, x.ndim))
    return (lambda x: fnp.stack([x, 2 * x], axis)), (lambda x: np.stack([x, 2 * x], axis)), (x,)


def atleast(draw):
    x = draw(values(draw(shapes(max_dims=4))))
    name = f"atleast_{draw(st.integers(1, 3))}d"
    return getattr(fnp, name), getattr(np, name), (x,)


def moveaxis(draw):
    x = draw(values(draw(shapes(min_dims=1, max_dims=4))))
    k = draw(st.integers(1, x.ndim))
    src = draw(st.permutations(range(x.ndim)))[:k]
    dst = draw(st.permutations(range(x.ndim)))[:k]
    return (lambda x: fnp.moveaxis(x, src, dst)), (lambda x: np.moveaxis(x, src, dst)), (x,)


def take(draw):
    x = draw(values(draw(shapes(min_dims=1, min_side=1))))
    axis = _axis(draw, x.ndim) if draw(st.booleans()) else None
    n = x.shape[axis] if axis is not None else x.size
    mode = draw(st.sampled_from(["raise", "wrap", "clip"]))
    bound = n if mode == "raise" else 3 * n
    idx = np.array(draw(st.lists(st.integers(-bound, bound - 1), max_size=5)), dtype=np.int64)
    return (
        (lambda x: fnp.take(x, idx, axis, mode=mode)),
        (lambda x: np.take(x, idx, axis, mode=mode)),
        (x,),
    )


def take_along_axis(draw):
    x = draw(values(draw(shapes(min_dims=1, min_side=1))))
    axis = _axis(draw, x.ndim)
    shape = list(x.shape)
    shape[axis] = draw(st.integers(0, 4))
    idx = np.random.default_rng(draw(st.integers(0, 99))).integers(0, x.shape[axis], shape)
    return (
        (lambda x, i: fnp.take_along_axis(x, i, axis)),
        (lambda x, i: np.take_along_axis(x, i, axis)),
        (x, idx),
    )


def diagonal(draw):
    x = draw(values(draw(shapes(min_dims=2))))
    a, b = draw(st.permutations(range(x.ndim)))[:2]
    offset = draw(st.integers(-5, 5))
    return (
        (lambda x: fnp.diagonal(x, offset, a, b)),
        (lambda x: np.diagonal(x, offset, a, b)),
        (x,),
    )


def trace(draw):
    x = draw(values(draw(shapes(min_dims=2))))
    offset = draw(st.integers(-3, 3))
    return (lambda x: fnp.trace(x, offset)), (lambda x: np.trace(x, offset)), (x,)


def diag(draw):
    x = draw(values(draw(shapes(min_dims=1, max_dims=2))))
    k = draw(st.integers(-3, 3))
    return (lambda x: fnp.diag(x, k)), (lambda x: np.diag(x, k)), (x,)


def diagflat(draw):
    x = draw(values(draw(shapes(max_dims=2))))
    k = draw(st.integers(-2, 2))
    return (lambda x: fnp.diagflat(x, k)), (lambda x: np.diagflat(x, k)), (x,)


def triangles(draw):
    x = draw(values(draw(shapes(min_dims=1))))
    k = draw(st.integers(-3, 3))
    name = draw(st.sampled_from(["tril", "triu"]))
    ours, theirs = getattr(fnp, name), getattr(np, name)
    return (lambda x: ours(x, k)), (lambda x: theirs(x, k)), (x,)


def select(draw):
    x = draw(values(draw(shapes())))
    return (
        (lambda x: fnp.select([x < -1.1372, x < 0.4321], [x * x, -x], default=1.5)),
        (lambda x: np.select([x < -1.1372, x < 0.4321], [x * x, -x], default=1.5)),
        (x,),
    )


def nan_to_num(draw):
    x = draw(values(draw(shapes())))
    special = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    x = np.where(x > 1.5, special, x)
    return (
        (lambda x: fnp.nan_to_num(x, posinf=9.0)),
        (lambda x: np.nan_to_num(x, posinf=9.0)),
        (x,),
    )


def nested_asarray(draw):
    a, b = draw(values(())), draw(values(()))
    return (
        (lambda a, b: fnp.asarray([[a, 1.0], [b * 2, a * b]])),
        (lambda a, b: np.asarray([[a, 1.0], [b * 2, a * b]], dtype=a.dtype)),
        (a, b),
    )


# ---------------------------------------------------------------- compiled, once per function

rng = np.random.default_rng(0)
A = rng.standard_normal((3, 4))
T = rng.standard_normal((2, 3, 4))
IDX = np.array([[2, 0, 1, 1]])

FUSED = {
    "flip": (lambda x: fnp.flip(x, 1) * 2, lambda x: np.flip(x, 1) * 2, (A,)),
    "fliplr": (
        lambda x: fnp.fliplr(x) + fnp.flipud(x),
        lambda x: np.fliplr(x) + np.flipud(x),
        (A,),
    ),
    "rot90": (lambda x: fnp.rot90(x, 3), lambda x: np.rot90(x, 3), (T,)),
    "roll": (lambda x: fnp.roll(x, (1, -2), (0, 2)), lambda x: np.roll(x, (1, -2), (0, 2)), (T,)),
    "repeat": (lambda x: fnp.repeat(x, [1, 0, 2], 0), lambda x: np.repeat(x, [1, 0, 2], 0), (A,)),
    "tile": (lambda x: fnp.tile(x, (2, 1, 2)), lambda x: np.tile(x, (2, 1, 2)), (A,)),
    "append": (lambda x: fnp.append(x, x[:1], 0), lambda x: np.append(x, x[:1], 0), (A,)),
    "pad": (
        lambda x: fnp.pad(x, ((1, 2), (3, 0)), "reflect") + 1,
        lambda x: np.pad(x, ((1, 2), (3, 0)), "reflect") + 1,
        (A,),
    ),
    "pad_constant": (
        lambda x, c: fnp.pad(x, 2, constant_values=c),
        lambda x, c: np.pad(x, 2, constant_values=c),
        (A, np.array(0.5)),
    ),
    "split": (lambda x: fnp.split(x, [1, 3], 1), lambda x: np.split(x, [1, 3], 1), (A,)),
    "hsplit": (lambda x: fnp.hsplit(x, 2), lambda x: np.hsplit(x, 2), (A,)),
    "vsplit": (lambda x: fnp.vsplit(x, 3), lambda x: np.vsplit(x, 3), (A,)),
    "dsplit": (lambda x: fnp.dsplit(x, 2), lambda x: np.dsplit(x, 2), (T,)),
    "vstack": (lambda x: fnp.vstack([x, x[0]]), lambda x: np.vstack([x, x[0]]), (A,)),
    "row_stack": (lambda x: fnp.row_stack([x, x]), lambda x: np.vstack([x, x]), (A,)),
    "hstack": (lambda x: fnp.hstack([x, x]), lambda x: np.hstack([x, x]), (A,)),
    "dstack": (lambda x: fnp.dstack([x, x]), lambda x: np.dstack([x, x]), (A,)),
    "column_stack": (
        lambda x: fnp.column_stack([x[0], x[1]]),
        lambda x: np.column_stack([x[0], x[1]]),
        (A,),
    ),
    "atleast": (lambda x: fnp.atleast_3d(x[0]), lambda x: np.atleast_3d(x[0]), (A,)),
    "moveaxis": (lambda x: fnp.moveaxis(x, 0, -1), lambda x: np.moveaxis(x, 0, -1), (T,)),
    "swapaxes": (lambda x: fnp.swapaxes(x, 0, 2), lambda x: np.swapaxes(x, 0, 2), (T,)),
    "ravel": (lambda x: fnp.ravel(x), np.ravel, (T,)),
    "take": (lambda x: fnp.take(x, [3, 0, 0], 1), lambda x: np.take(x, [3, 0, 0], 1), (A,)),
    "take_along_axis": (
        lambda x, i: fnp.take_along_axis(x, i, 0),
        lambda x, i: np.take_along_axis(x, i, 0),
        (A, IDX),
    ),
    "diag": (lambda x: fnp.diag(x[0], -1), lambda x: np.diag(x[0], -1), (A,)),
    "diagonal": (lambda x: fnp.diagonal(x, 1, 2, 0), lambda x: np.diagonal(x, 1, 2, 0), (T,)),
    "diagflat": (lambda x: fnp.diagflat(x[:2]), lambda x: np.diagflat(x[:2]), (A,)),
    "trace": (lambda x: fnp.trace(x), np.trace, (A,)),
    "triu": (lambda x: fnp.triu(x, 1) - fnp.tril(x), lambda x: np.triu(x, 1) - np.tril(x), (T,)),
    "select": (
        lambda x: fnp.select([x > 0], [x * x], -x),
        lambda x: np.select([x > 0], [x * x], -x),
        (A,),
    ),
    "nan_to_num": (
        lambda x: fnp.nan_to_num(fnp.log(x)),
        lambda x: np.nan_to_num(np.log(x)),
        (np.array([0.0, -1.0, 2.0]),),
    ),
    "copy": (lambda x: fnp.copy(x) * x, lambda x: x * x, (A,)),
    "astype": (lambda x: x.astype(np.int32) * x, lambda x: x.astype(np.int32) * x, (A * 3,)),
}
BUILDERS = (
    flip, rot90, roll, repeat, tile, append, pad, split, stacks, stack, atleast,
    moveaxis, take, take_along_axis, diagonal, trace, diag, diagflat, triangles, select,
    nan_to_num, nested_asarray,
)  # fmt: skip
test_matches_numpy_with_gradients, test_compiled = table_tests(BUILDERS, FUSED)


# ---------------------------------------------------------------- behaviour to pin


def test_astype_to_int_has_no_gradient_through_it():
    x = np.array([1.7, -2.2, 3.5])
    g = fg.grad(lambda x: fnp.sum(fnp.astype(x, np.int64) * x))(x)
    np.testing.assert_array_equal(g, [1.0, -2.0, 3.0])


def test_asarray_of_nested_lists_with_tracers_keeps_float32():
    out = fg.jit(lambda a: fnp.stack([[a, 1.0], [2.0, a]]))(np.float32(3))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[3, 1], [2, 3]])
    g = fg.grad(lambda a: fnp.sum(fnp.array([[a, a * a], [0.5, 2]])))(np.float32(3))
    assert g == 7.0 and g.dtype == np.float32


def test_where_with_one_argument():
    np.testing.assert_array_equal(fnp.where(np.array([0, 2, 3]))[0], [1, 2])
    with pytest.raises(TypeError, match="depends on traced values"):
        fg.jit(lambda x: fnp.where(x > 0))(np.ones(3))
    with pytest.raises(TypeError, match="one argument"):
        fnp.where(np.ones(3) > 0, 1.0)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda x: fnp.pad(x, 1, mode="median"), ValueError, "mode 'median' is not supported"),
        (lambda x: fnp.pad(x, -1), ValueError, "non-negative"),
        (lambda x: fnp.pad(x, 1, mode="reflect", reflect_type="odd"), ValueError, "even"),
        (lambda x: fnp.flip(x, 2), ValueError, "out of bounds"),
        (lambda x: fnp.roll(x, 1, 5), ValueError, "out of bounds"),
        (lambda x: fnp.moveaxis(x, 0, 3), ValueError, "out of bounds"),
        (lambda x: fnp.split(x, 2, axis=1), ValueError, "equal"),
        (lambda x: fnp.repeat(x, [1, 2]), ValueError, "repeats"),
        (lambda x: fnp.take(x, [9]), IndexError, "out of bounds"),
        (lambda x: fnp.take(x, [0], mode="bad"), ValueError, "mode"),
        (lambda x: fnp.take_along_axis(x, np.zeros(2, int), 0), ValueError, "same number"),
        (lambda x: fnp.diagonal(x, 0, 1, 1), ValueError, "differ"),
        (lambda x: fnp.diag(x[None]), ValueError, "1-D or 2-D"),
        (lambda x: fnp.select([x > 0], [x, x]), ValueError, "match"),
        (lambda x: fnp.select([x], [x]), TypeError, "boolean"),
        (lambda x: fnp.rot90(x, 1, (0, 0)), ValueError, "different"),
        (lambda x: fnp.vsplit(x[0], 2), ValueError, "at least 2"),
    ],
)
def test_bad_arguments_get_clear_errors(call, error, match):
    assert_rejected(call, error, match, np.ones((2, 3)))


def test_traced_repeats_are_rejected():
    with pytest.raises(TypeError, match="static ints"):
        fg.jit(lambda x, r: fnp.repeat(x, r))(np.ones(2), np.array(2))
