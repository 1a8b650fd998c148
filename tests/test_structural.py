"""Reductions, shape ops, indexing, matmul: NumPy reference, dtypes and gradients per op.

CASES names, for every non-elementwise primitive, functions that exercise it; the coverage
test below fails when a primitive is added without a case here or in test_elementwise.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.ir import Graph
from fastgrad.core.primitive import REGISTRY
from fastgrad.core.tracing import bind
from fastgrad.ops.indexing import scatter_add
from fastgrad.ops.scatter import segment_others
from fastgrad.ops.shape import slice_scatter
from fastgrad.testing import check_grads
from fastgrad.testing import strategies as fst

rng = np.random.default_rng(0)
A = rng.standard_normal((3, 4))
B = rng.standard_normal((4, 5))
T = rng.standard_normal((2, 3, 4))
ROWS, COLS = np.arange(3), np.array([0, 3, 1])
REPEATS = np.array([0, 2, 0])  # a repeated index: updates to one element combine
# Index updates: fnp.at(x)[index] is x.at[index] for plain arrays too, as these cases need
# (tests/test_index_update.py has more).


def np_update(x, index, v, ufunc=None):
    """NumPy's in-place update on a copy: the reference for x.at[index]."""
    out = x.copy()
    if ufunc is None:
        out[index] = v
    else:
        ufunc.at(out, index, v)
    return out


# op name -> [(fastgrad function, NumPy reference, args)]
CASES = {
    "sum": [
        (lambda x: fnp.sum(x), np.sum, (T,)),
        (
            lambda x: fnp.sum(x, axis=(0, 2), keepdims=True),
            lambda x: np.sum(x, (0, 2), keepdims=True),
            (T,),
        ),
        (lambda x: x.sum(-1), lambda x: x.sum(-1), (T,)),
    ],
    "max": [
        (lambda x: fnp.max(x, axis=1), lambda x: np.max(x, axis=1), (A,)),
        (lambda x: x.max(), np.max, (T,)),
    ],
    "min": [
        (
            lambda x: fnp.min(x, axis=(1, 2), keepdims=True),
            lambda x: np.min(x, (1, 2), keepdims=True),
            (T,),
        )
    ],
    "prod": [
        (lambda x: fnp.prod(x, axis=0), lambda x: np.prod(x, axis=0), (A,)),
        (lambda x: x.prod(), np.prod, (A[:2, :3],)),
    ],
    "argmax": [(lambda x: fnp.argmax(x, axis=1), lambda x: np.argmax(x, axis=1), (A,))],
    "argmin": [(lambda x: fnp.argmin(x), np.argmin, (A,))],
    "broadcast_to": [
        (
            lambda x: fnp.broadcast_to(x, (2, 3, 4)),
            lambda x: np.broadcast_to(x, (2, 3, 4)),
            (A[:, :1],),
        )
    ],
    "reshape": [
        (lambda x: fnp.reshape(x, (4, -1)), lambda x: np.reshape(x, (4, -1)), (A,)),
        (lambda x: x.reshape(2, 12).ravel(), lambda x: x.reshape(2, 12).ravel(), (T,)),
        (
            lambda x: fnp.expand_dims(fnp.squeeze(x), 0),
            lambda x: np.expand_dims(np.squeeze(x), 0),
            (A[:1],),
        ),
    ],
    "transpose": [
        (lambda x: x.T, lambda x: x.T, (T,)),
        (lambda x: fnp.transpose(x, (1, 0, 2)), lambda x: np.transpose(x, (1, 0, 2)), (T,)),
        (lambda x: fnp.swapaxes(x, 0, -1), lambda x: np.swapaxes(x, 0, -1), (T,)),
    ],
    "slice": [
        (lambda x: x[1:, ::2], lambda x: x[1:, ::2], (A,)),
        (lambda x: x[::-1, 2], lambda x: x[::-1, 2], (A,)),
        (lambda x: x[..., None, -1], lambda x: x[..., None, -1], (T,)),
        (lambda x: x[0], lambda x: x[0], (T,)),
    ],
    "slice_scatter": [(lambda x: slice_scatter(x, (5, 4), ((1, 4, 1), (0, 4, 1))), None, (A,))],
    "gather": [
        (lambda x: x[ROWS, COLS], lambda x: x[ROWS, COLS], (A,)),
        (lambda x: x[:, [0, 0, 2]], lambda x: x[:, [0, 0, 2]], (T,)),
        (
            lambda x: x[np.array([[1, 0]]), :, np.array([3, 2])],
            lambda x: x[np.array([[1, 0]]), :, np.array([3, 2])],
            (T,),
        ),
        (lambda x: x[A > 0], lambda x: x[A > 0], (A,)),
    ],
    "scatter_add": [
        (
            lambda x: scatter_add(x, (ROWS, COLS), (3, 4), (("array", 0), ("array", 1))),
            None,
            (A[0, :3],),
        )
    ],
    "scatter": [
        (
            lambda x, v: fnp.at(x)[ROWS, COLS].set(v),
            lambda x, v: np_update(x, (ROWS, COLS), v),
            (A, B[0, :3]),
        ),
        (
            lambda x, v: fnp.at(x)[1:, ::2].set(v),
            lambda x, v: np_update(x, (slice(1, None), slice(None, None, 2)), v),
            (A, B[:2, :2]),
        ),
        (
            lambda x, v: fnp.at(x)[REPEATS].set(v),
            lambda x, v: np_update(x, REPEATS, v),
            (A, B[:3, :4]),
        ),
    ],
    "scatter_multiply": [
        (
            lambda x, v: fnp.at(x)[REPEATS, 1].multiply(v),
            lambda x, v: np_update(x, (REPEATS, 1), v, np.multiply),
            (A, B[0, :3]),
        ),
        (
            lambda x, v: fnp.at(x)[..., 2].multiply(v),
            lambda x, v: np_update(x, (Ellipsis, 2), v, np.multiply),
            (T, A[:2, :3]),
        ),
    ],
    # Per group of equal ids, the product of the others (x.at[].multiply's rule).
    "segment_others": [
        (
            lambda w: segment_others(REPEATS.ravel(), w),
            lambda w: np.array(
                [
                    np.prod(w[REPEATS.ravel() == r]) / x
                    for r, x in zip(REPEATS.ravel(), w, strict=True)
                ]
            ),
            (B.ravel()[: REPEATS.size] + 2.0,),
        )
    ],
    "scatter_min": [
        (
            lambda x, v: fnp.at(x)[REPEATS].min(v),
            lambda x, v: np_update(x, REPEATS, v, np.minimum),
            (A, B[:3, :4]),
        ),
    ],
    "scatter_max": [
        (
            lambda x, v: fnp.at(x)[:, [1, 2, 1]].max(v),
            lambda x, v: np_update(x, (slice(None), [1, 2, 1]), v, np.maximum),
            (T, A),
        ),
    ],
    "debug_print": [
        (lambda x: (fg.debug.print("sum {:.2f}", fnp.sum(x)), x * 2)[1], lambda x: x * 2, (A,)),
    ],
    "concatenate": [
        (
            lambda x, y: fnp.concatenate([x, y, x], axis=1),
            lambda x, y: np.concatenate([x, y, x], axis=1),
            (A, A[:, :2]),
        ),
        (
            lambda x, y: fnp.stack([x, y], axis=-1),
            lambda x, y: np.stack([x, y], axis=-1),
            (A, A * 2),
        ),
    ],
    "matmul": [
        (lambda a, b: a @ b, lambda a, b: a @ b, (A, B)),
        (lambda a, b: fnp.matmul(a, b), np.matmul, (T, B)),
        (lambda a, b: a @ b, np.matmul, (A[0], B)),
        (lambda a, b: fnp.dot(a, b), np.dot, (A, B[:, 0])),
        (lambda a, b: fnp.dot(a, b), np.dot, (T, B)),
        (
            lambda a, b: fnp.tensordot(a, b, ((1, 2), (0, 1))),
            lambda a, b: np.tensordot(a, b, ((1, 2), (0, 1))),
            (T, A),
        ),
    ],
    "astype": [
        (
            lambda x: fnp.astype(x, np.float64) * fnp.astype(x > 0, x.dtype),
            lambda x: x.astype(np.float64) * (x > 0).astype(x.dtype),
            (A,),
        )
    ],
    "where": [(lambda x: fnp.where(x > 0, x, -x), lambda x: np.where(x > 0, x, -x), (A,))],
    "stop_gradient": [(lambda x: fnp.stop_gradient(x) * x, lambda x: x * x, (A,))],
    "const": [(lambda x: x + np.arange(4.0), lambda x: x + np.arange(4.0), (A,))],
    # x**y log(x)**k: the derivatives of power in y (fastgrad.ops.math)
    "power_log": [
        (
            lambda x, y: bind(REGISTRY["power_log"], x, y, k=2),
            lambda x, y: x**y * np.log(x) ** 2,
            (np.abs(A) + 0.5, A),
        )
    ],
    "cumsum": [
        (lambda x: fnp.cumsum(x, 1), lambda x: np.cumsum(x, 1), (A,)),
        (lambda x: fnp.cumsum(x), np.cumsum, (T,)),
    ],
    "sort": [
        (lambda x: fnp.sort(x, 0), lambda x: np.sort(x, 0), (A,)),
        (lambda x: fnp.sort(x, None), lambda x: np.sort(x, None), (T,)),
    ],
    "argsort": [(lambda x: fnp.argsort(x, 1), lambda x: np.argsort(x, 1), (A,))],
    "searchsorted": [
        (
            lambda x: fnp.searchsorted(np.array([-0.5, 0.0, 0.5]), x),
            lambda x: np.searchsorted(np.array([-0.5, 0.0, 0.5]), x),
            (A,),
        )
    ],
    "argpartition": [
        (
            lambda x: fnp.take_along_axis(x, fnp.argpartition(x, 2), -1)[:, 2],
            lambda x: np.partition(x, 2)[:, 2],
            (A,),
        )
    ],
}
COMPOSITES = [
    (lambda x: fnp.mean(x, axis=0), lambda x: np.mean(x, axis=0), (A,)),
    (lambda x: fnp.var(x, axis=1), lambda x: np.var(x, axis=1), (A,)),
    (lambda x: fnp.std(x), np.std, (A,)),
    (lambda x: fnp.logsumexp(x, axis=1), lambda x: np.log(np.sum(np.exp(x), axis=1)), (A,)),
    (lambda x: fnp.logsumexp(x), lambda x: np.log(np.sum(np.exp(x))), (T,)),
    (lambda x: fnp.softmax(x), lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True), (A,)),
    (
        lambda x: fnp.log_softmax(x, axis=0),
        lambda x: x - np.log(np.exp(x).sum(0, keepdims=True)),
        (A,),
    ),
    (lambda x: fnp.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), (A,)),
    (lambda x: fnp.vdot(x, x), lambda x: np.vdot(x, x), (A,)),
    (lambda a: fnp.outer(a, a[:2]), lambda a: np.outer(a, a[:2]), (A[0],)),
    (lambda x: fnp.zeros_like(x) + fnp.ones_like(x) * x, lambda x: x, (A,)),
]
ALL = [(name, c) for name, cases in CASES.items() for c in cases] + [
    ("composite", c) for c in COMPOSITES
]


def ops_in(graph: Graph) -> set[str]:
    return {n.op.name for n in graph.nodes}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", range(len(ALL)), ids=[f"{n}-{i}" for i, (n, _) in enumerate(ALL)])
def test_matches_numpy_and_gradients(case, dtype):
    name, (fun, ref, args) = ALL[case]
    args = tuple(a.astype(dtype) for a in args)
    if name != "composite":
        assert name in ops_in(fg.make_graph(fun)(*args)), f"{name} does not appear in its case"
    eager = np.asarray(fun(*args))
    traced = fg.jit(fun)(*args)
    if ref is not None:
        expected = np.asarray(ref(*args))
        for got in (eager, traced):
            assert got.shape == expected.shape and got.dtype == expected.dtype
            np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == np.float32 else 1e-12)
    # Fused reductions may add in another order than NumPy's pairwise sums.
    np.testing.assert_allclose(eager, traced, rtol=2e-6 if dtype == np.float32 else 1e-13)
    if name == "stop_gradient":  # d/dx [sg(x) * x] treats sg(x) as the constant x
        np.testing.assert_array_equal(fg.grad(lambda x: fnp.sum(fun(x)))(*args), args[0])
    elif traced.dtype.kind == "f":
        if dtype == np.float64:
            check_grads(fun, args, order=2)
        else:
            outs, vjp_fn = fg.vjp(fun, *args)
            for g, a in zip(vjp_fn(np.ones_like(outs)), args, strict=True):
                assert g.dtype == a.dtype and g.shape == a.shape


def test_every_primitive_has_a_case():
    from test_elementwise import BINARY, UNARY
    from test_linalg import COVERED as LINALG
    from test_matrix_calculus import COVERED as MATRIX_CALCULUS
    from test_numpy_extras import COVERED as INTEGER_OPS
    from test_random import COVERED as RANDOM
    from test_special import COVERED as SPECIAL
    from test_special_incomplete import COVERED as SPECIAL_INCOMPLETE

    covered = set(CASES) | set(UNARY) | set(BINARY) | LINALG | SPECIAL | SPECIAL_INCOMPLETE
    covered |= RANDOM | MATRIX_CALCULUS | INTEGER_OPS
    assert set(REGISTRY) - covered == set()


@given(st.data())
def test_reductions_on_random_shapes_and_axes(data):
    shape = data.draw(fst.shapes(min_dims=0, max_dims=3))
    x = data.draw(fst.arrays(shape, np.float64))
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1)) if shape else None
    keepdims = data.draw(st.booleans())
    for name in ("sum", "max", "min", "prod", "mean"):
        fn = getattr(fnp, name)
        got = fg.jit(lambda x, fn=fn: fn(x, axis=axis, keepdims=keepdims), fuse=False)(x)
        np.testing.assert_allclose(got, getattr(np, name)(x, axis=axis, keepdims=keepdims))
    # prod's derivatives are exact at zeros too, at every order (no division). Scaled to
    # |x| <= 1: the finite differences' truncation error grows with prod's higher
    # derivatives (1.5**34 with two zeros gave 1.9e-6 where the exact gradient is 0).
    x = x / max(1.0, float(np.max(np.abs(x), initial=0.0)))
    check_grads(lambda x: fnp.sum(x, axis, keepdims) * fnp.prod(x, axis, keepdims), (x,), 2)


def test_max_gradient_splits_ties_like_jax():
    g = fg.grad(lambda x: fnp.max(x))(np.array([1.0, 3.0, 3.0, 0.0]))
    np.testing.assert_array_equal(g, [0.0, 0.5, 0.5, 0.0])
    g = fg.grad(lambda x: fnp.sum(fnp.min(x, axis=1)))(np.array([[2.0, 2.0, 2.0], [1.0, 0.0, 5.0]]))
    np.testing.assert_allclose(g, [[1 / 3, 1 / 3, 1 / 3], [0, 1, 0]])


def test_prod_gradient_is_exact_at_zeros():
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 4.0], [1.0, 2.0, 5.0]])
    g = fg.grad(lambda x: fnp.sum(fnp.prod(x, axis=1)))(x)
    np.testing.assert_array_equal(g, [[0.0, 6.0, 0.0], [0.0, 0.0, 0.0], [10.0, 5.0, 2.0]])


def test_gather_gradient_accumulates_repeats():
    g = fg.grad(lambda x: fnp.sum(x[np.array([0, 0, 2])]))(np.ones(3))
    np.testing.assert_array_equal(g, [2.0, 0.0, 1.0])


def test_traced_integer_labels_index():
    z = rng.standard_normal((4, 3))
    labels = np.array([2, 0, 1, 2])

    @fg.jit
    def picked(z, labels):
        return z[fnp.arange(4), labels]

    np.testing.assert_array_equal(picked(z, labels), z[np.arange(4), labels])
    g = fg.jit(fg.grad(lambda z, y: fnp.sum(picked(z, y))))(z, labels)
    np.testing.assert_array_equal(g, np.eye(3)[labels])
