"""The fused compiler against the reference interpreter, and its structure.

Every test here has two oracles: the NumPy reference interpreter of the same graph
(`fuse=False`) and, for gradients, finite differences (check_grads).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.fusion import Call, Loop, partition
from fastgrad.compiler.kernel_cache import STATS
from fastgrad.compiler.passes import simplify
from fastgrad.core.primitive import REGISTRY
from fastgrad.testing import check_grads
from fastgrad.testing import strategies as fst

rng = np.random.default_rng(3)


def assert_fused_matches_reference(fun, *args, rtol=None):
    fused = fg.jit(fun)(*args)
    reference = fg.jit(fun, fuse=False)(*args)
    f_leaves, f_tree = fg.pytree.flatten(fused)
    r_leaves, r_tree = fg.pytree.flatten(reference)
    assert f_tree == r_tree
    for f, r in zip(f_leaves, r_leaves, strict=True):
        f, r = np.asarray(f), np.asarray(r)
        assert f.dtype == r.dtype and f.shape == r.shape
        tol = rtol or (2e-5 if f.dtype == np.float32 else 1e-12)
        np.testing.assert_allclose(f, r, rtol=tol, atol=tol)


def loops_of(fun, *args):
    steps = fg.jit(fun).lower(*args).executable.steps
    return [s for s in steps if isinstance(s, Loop)], [s for s in steps if isinstance(s, Call)]


def w1(x, y):
    return fnp.sum(fnp.tanh(x * y + fnp.sin(x)) * fnp.exp(-y * y) / (1 + x * x))


def stable_xent(z, labels):
    m = fg.stop_gradient(fnp.max(z, axis=1, keepdims=True), name="row max")
    s = z - m
    return fnp.mean(fnp.log(fnp.sum(fnp.exp(s), axis=1)) - s[np.arange(z.shape[0]), labels])


# ---------------------------------------------------------------- every op, fused

from test_elementwise import BINARY, UNARY  # noqa: E402  the registry's ufunc-like ops


def all_unary(x, unit, pos):
    inputs = {"real": x, "unit": unit, "positive": pos, "nonzero": pos, "above_one": pos + 1,
              "above_minus_one": unit}  # fmt: skip
    outs = []
    for name in UNARY:
        domain = (REGISTRY[name].domain or ("real",))[0]
        arg = inputs.get(domain, x)
        outs.append(getattr(fnp, name)(arg if not name.startswith("logical") else x > 0))
    return outs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_unary_op_in_one_loop(dtype):
    x = rng.standard_normal((3, 4)).astype(dtype)
    unit = (rng.uniform(-0.8, 0.8, (3, 4))).astype(dtype)
    pos = rng.uniform(0.2, 3, (3, 4)).astype(dtype)
    x[0, 0], x[0, 1], x[0, 2] = np.nan, np.inf, -0.0  # special values flow through
    assert_fused_matches_reference(
        all_unary, x, unit, pos, rtol=4e-6 if dtype == np.float32 else 1e-14
    )
    loops, calls = loops_of(all_unary, x, unit, pos)
    assert len(loops) == 1 and not calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_binary_op_with_broadcasting(dtype):
    x = rng.standard_normal((3, 1)).astype(dtype)
    y = rng.uniform(0.2, 2, (4,)).astype(dtype)

    def all_binary(x, y):
        return [getattr(fnp, n)(fnp.abs(x) if n == "power" else x, y) for n in BINARY]

    assert_fused_matches_reference(all_binary, x, y, rtol=4e-6 if dtype == np.float32 else 1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradients_of_all_elementwise_ops(dtype):
    x = rng.uniform(0.2, 0.7, (2, 3)).astype(dtype)

    def loss(x):
        total = 0.0
        for name in UNARY:
            if REGISTRY[name].vjp is None:
                continue
            arg = x + 1 if name == "arccosh" else x
            total = total + fnp.sum(getattr(fnp, name)(arg))
        for name in BINARY:
            if REGISTRY[name].vjp is not None:
                total = total + fnp.sum(getattr(fnp, name)(x, x[::-1]))
        return total

    assert_fused_matches_reference(
        fg.value_and_grad(loss), x, rtol=1e-5 if dtype == np.float32 else 1e-12
    )


# ---------------------------------------------------------------- random programs


def program_and_inputs(dtype):
    return fst.programs(max_steps=5).flatmap(
        lambda p: st.tuples(
            st.just(p), st.tuples(*(fst.arrays(s, dtype, "real") for s in p.shapes))
        )
    )


@settings(max_examples=12)
@given(program_and_inputs(np.float64))
def test_random_programs_forward_and_backward_float64(case):
    program, xs = case
    assert_fused_matches_reference(program, *xs)
    out = program(*xs)
    u = np.random.default_rng(0).standard_normal(np.shape(out))

    def pullback(*a):
        return fg.vjp(program, *a)[1](u)

    assert_fused_matches_reference(pullback, *xs, rtol=1e-10)


@settings(max_examples=8)
@given(program_and_inputs(np.float32))
def test_random_programs_float32(case):
    program, xs = case
    assert_fused_matches_reference(program, *xs, rtol=1e-4)


# ---------------------------------------------------------------- structure


def test_w1_value_and_grad_is_one_loop():
    x, y = rng.standard_normal(100), rng.standard_normal(100)
    f = fg.value_and_grad(w1, argnums=(0, 1))
    loops, calls = loops_of(f, x, y)
    assert len(loops) == 1 and not calls
    (loop,) = loops
    assert {v.aval.shape for v in loop.inputs if v.aval.size > 1} == {(100,)}
    assert len(loop.outputs) == 3  # the value and two gradients, each written once
    assert_fused_matches_reference(f, x, y)
    check_grads(w1, (x, y))


def test_stable_softmax_backward_has_no_loop_for_the_max():
    z = rng.standard_normal((8, 5))
    labels = rng.integers(0, 5, 8)
    lowered = fg.jit(fg.value_and_grad(stable_xent)).lower(z, labels)
    kernels = "\n".join(lowered.kernels)
    assert kernels.count("rmax(") == 1  # the forward max only; its VJP is never built
    assert "no gradient built for max" in lowered.explain()
    assert_fused_matches_reference(fg.value_and_grad(stable_xent), z, labels)


def test_convexity():
    # b is a library call (matmul) between two elementwise ops on the same shape: the op
    # after it must not join the loop before it.
    def f(x, w):
        a = fnp.tanh(x)
        b = a @ w
        return fnp.exp(a) + b

    x, w = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    graph = simplify(fg.make_graph(f)(x, w))
    steps = partition(graph)
    made = {}
    for k, step in enumerate(steps):
        nodes = step.nodes if isinstance(step, Loop) else [step.node]
        reads = [v for n in nodes for v in n.inputs]
        for v in reads:
            assert made.get(id(v), -1) < k or id(v) in {id(n.out) for n in nodes}
        for n in nodes:
            made[id(n.out)] = k
    assert [type(s).__name__ for s in steps] == ["Loop", "Call", "Loop"]
    assert_fused_matches_reference(f, x, w)


def test_reductions_over_any_axes():
    x = rng.standard_normal((3, 4, 5))

    def f(x):
        return (
            fnp.max(x, axis=(0, 2), keepdims=True),
            fnp.sum(x * x, axis=0),
            fnp.min(fnp.exp(x), axis=-1),
            fnp.prod(x, axis=1, keepdims=True),
            fnp.mean(x),
            fnp.softmax(x, axis=1),
            fnp.logsumexp(x, axis=(1, 2)),
        )

    assert_fused_matches_reference(f, x)
    assert_fused_matches_reference(fg.grad(lambda x: fnp.sum(f(x)[5] * x) + fnp.sum(f(x)[6])), x)


def test_nan_propagation_in_max():
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, 6.0]])
    assert_fused_matches_reference(lambda x: (fnp.max(x, axis=1), fnp.min(x), fnp.sum(x)), x)


# ---------------------------------------------------------------- compile cache


def test_a_new_batch_size_compiles_nothing():
    f = fg.jit(fg.value_and_grad(stable_xent))
    f(rng.standard_normal((6, 5)), rng.integers(0, 5, 6))
    before = (STATS.numba_compiles(), STATS.modules_loaded)
    for n in (7, 13, 50):
        f(rng.standard_normal((n, 5)), rng.integers(0, 5, n))
    assert (STATS.numba_compiles(), STATS.modules_loaded) == before


def test_row_pick_fuses_and_checks_bounds():
    z = rng.standard_normal((9, 4))
    labels = np.array([0, 3, -1, 2, -4, 1, 0, 3, 2])
    f = fg.value_and_grad(stable_xent)
    loops, calls = loops_of(f, z, labels)
    assert len(loops) == 1 and not calls  # value and gradient of W2 in one loop
    assert_fused_matches_reference(f, z, labels)
    check_grads(stable_xent, (z, labels))
    with pytest.raises(IndexError, match="index 4 is out of bounds for axis 1 with size 4"):
        fg.jit(f)(z, np.where(labels == 2, 4, labels))
    with pytest.raises(IndexError):
        fg.jit(f, fuse=False)(z, np.where(labels == 2, 4, labels))


def test_cheap_backward_values_are_recomputed_not_stored():
    # tanh's VJP needs 1 - h*h; the forward loop stores h (the matmuls need it) and the
    # backward loop recomputes 1 - h*h from h instead of reading a second stored array.
    def loss(w1, w2, x):
        h = fnp.tanh(x @ w1)
        return fnp.sum((h @ w2) ** 2)

    w1, w2, x = (
        rng.standard_normal((5, 6)),
        rng.standard_normal((6, 3)),
        rng.standard_normal((4, 5)),
    )
    f = fg.value_and_grad(loss, argnums=(0, 1))
    loops, _ = loops_of(f, w1, w2, x)
    forward = next(lp for lp in loops if "tanh" in [n.op.name for n in lp.nodes])
    assert len(forward.outputs) == 1
    assert any("subtract" in [n.op.name for n in lp.nodes] for lp in loops if lp is not forward)
    assert_fused_matches_reference(f, w1, w2, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_trig_arguments(dtype):
    # Chunks use sin/cos/tan with a cheap reduction and rerun exactly when an argument is
    # beyond its range: results must not depend on which path a chunk took.
    x = rng.uniform(-3, 3, 500).astype(dtype)
    x[[3, 250, 499]] = [3e9, -1e30, 123456789.0]

    def f(x):
        return fnp.sum(fnp.sin(x) * fnp.cos(x) + fnp.tan(x * 0.5)), fnp.sin(x * 1e3)

    assert_fused_matches_reference(f, x, rtol=3e-5 if dtype == np.float32 else 1e-11)
    assert_fused_matches_reference(
        fg.grad(lambda x: f(x)[0]), x, rtol=1e-4 if dtype == np.float32 else 1e-11
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_column_reductions(dtype):
    # Reductions over a leading axis run row-major over the raveled array, one partial per
    # column and block of rows.
    x = rng.standard_normal((37, 11)).astype(dtype)
    x[5, 3] = np.nan

    def f(x):
        e = fnp.exp(x) * 2.0
        return (
            e,
            fnp.sum(e, axis=0),
            fnp.max(x, axis=0, keepdims=True),
            fnp.min(x * x, axis=0) + 1.0,
            fnp.prod(x[:, :3] * 0.5 + 1.0, axis=0),
            fnp.sum(x),
        )

    assert_fused_matches_reference(f, x, rtol=3e-6 if dtype == np.float32 else 1e-12)
    lowered = fg.jit(f).lower(x)
    assert any("e = base + p" in k for k in lowered.kernels)
    big = rng.standard_normal((300, 1000)).astype(dtype)  # the parallel variant
    assert_fused_matches_reference(
        lambda x: fnp.sum(x * x, axis=0), big, rtol=1e-5 if dtype == np.float32 else 1e-12
    )


def test_bool_results_are_zero_or_one_when_a_reduction_reads_them():
    """NumPy's bool + bool is a logical or (True + True is True): the fused loop added 1 + 1
    for a sum reading it in the same loop (58 for NumPy's 46)."""
    a, b = rng.random(64) < 0.5, rng.random(64) < 0.5
    for f in (lambda a, b: fnp.sum(a + b), lambda a, b: fnp.max((a + b) * np.int8(3))):
        np.testing.assert_array_equal(fg.jit(f)(a, b), f(a, b))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_the_smallest_integer_floor_divided_by_minus_one(dtype):
    """MIN // -1 wraps to MIN in NumPy; Numba's integer floor_divide gave 0."""
    info = np.iinfo(dtype)
    x = np.array([info.min, info.min + 1, -7, -1, 0, 5, info.max], dtype)
    with np.errstate(all="ignore"):
        for f in (lambda x: x // dtype(-1), lambda x: x // dtype(2) + x // dtype(-1)):
            got = fg.jit(f)(x)
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, f(x))


@pytest.mark.parametrize("dtype", [np.uint8, np.int16])
def test_narrow_integer_results_wrap_before_a_reduction_reads_them(dtype):
    """NumPy wraps each narrow-integer result to its type (uint8 200 * 200 is 64); the
    fused loop computes them in 64 bits, which a store truncates but a sum reading the
    value in the same loop did not (uint8: 50298 for NumPy's 122)."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, size=(5, 3), endpoint=True).astype(dtype)
    y = rng.integers(info.min, info.max, size=(3,), endpoint=True).astype(dtype)

    def f(x, y):
        z = x * x + y * 3 - x
        return fnp.sum(z, axis=0), fnp.sum(z[:, None, :] * z[:, :, None]), fnp.max(x + y, 1)

    with np.errstate(all="ignore"):
        z = x * x + y * 3 - x
        want = np.sum(z, axis=0), np.sum(z[:, None, :] * z[:, :, None]), np.max(x + y, 1)
    for got, expected in zip(fg.jit(f)(x, y), want, strict=True):
        assert np.asarray(got).dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    assert_fused_matches_reference(f, x, y)
