"""vmap: every primitive against a Python loop over the batch, with shapes and in_axes
drawn by hypothesis; derivatives of vmap and vmap of derivatives, at orders 1 and 2."""

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
import fastgrad.scipy.linalg as fsl
import fastgrad.scipy.special as fss
from fastgrad.api.jit import Jitted
from fastgrad.core.primitive import REGISTRY
from fastgrad.core.pytree import flatten, unflatten
from fastgrad.ops.determinant import masked_svd, safe_inverse
from fastgrad.ops.scatter import segment_others
from fastgrad.testing import strategies as fst

# `const` has no inputs, so it never sees the batch: no rule to write.
EXEMPT = {"const"}

RNG = np.random.default_rng(0)


def loop(f, args, in_axes, out_axes=0):
    """The oracle: `f` called once per example, the results stacked along `out_axes`."""
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    size = next(a.shape[ax] for a, ax in zip(args, axes, strict=True) if ax is not None)
    outs = []
    for i in range(size):
        ex = [a if ax is None else np.take(a, i, axis=ax) for a, ax in zip(args, axes, strict=True)]
        outs.append(f(*ex))
    leaves = [flatten(o)[0] for o in outs]
    stacked = [
        np.stack([np.asarray(leaf[k]) for leaf in leaves], axis=out_axes)
        for k in range(len(leaves[0]))
    ]
    return unflatten(flatten(outs[0])[1], stacked)


def check(f, args, in_axes=0, out_axes=0, jit=False, tol=1e-10):
    batched = fg.vmap(f, in_axes, out_axes)
    got = (fg.jit(batched) if jit else batched)(*args)
    want = loop(f, args, in_axes, out_axes)
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def batched_args(data, shapes, domains, dtype=np.float64, size=None):
    """Per-example shapes -> arguments with a batch axis at a drawn position (or None)."""
    size = size or data.draw(st.integers(1, 3), label="batch")
    args, axes = [], []
    for shape, domain in zip(shapes, domains, strict=True):
        axis = data.draw(st.sampled_from([None, *range(-len(shape) - 1, len(shape) + 1)]))
        full = (
            shape
            if axis is None
            else tuple(np.insert(np.array(shape, int), axis % (len(shape) + 1), size))
        )
        args.append(data.draw(fst.arrays(tuple(int(d) for d in full), dtype, domain)))
        axes.append(axis)
    if all(a is None for a in axes):  # at least one argument is mapped
        axes[0] = 0
        args[0] = np.stack([args[0]] * size)
    return args, tuple(axes)


# ---------------------------------------------------------------- elementwise primitives

ELEMENTWISE = sorted(
    n
    for n, p in REGISTRY.items()
    if p.kind == "elementwise" and p.ufunc is not None and n != "where"
)


def domains_of(name, nin):
    if name.startswith("logical"):
        return ("bool",) * nin
    return REGISTRY[name].domain or ("real",) * nin


@pytest.mark.parametrize("name", ELEMENTWISE)
@settings(max_examples=6)
@given(data=st.data())
def test_elementwise_matches_a_loop(name, data):
    nin = REGISTRY[name].ufunc.nin
    shapes = data.draw(fst.broadcastable_shapes(nin, max_dims=2, max_side=3))
    args, axes = batched_args(data, shapes, domains_of(name, nin))
    ndim = len(np.broadcast_shapes(*shapes))
    out_axis = data.draw(st.integers(-ndim - 1, ndim), label="out_axes")
    with np.errstate(all="ignore"):
        check(getattr(fnp, name), args, axes, out_axis)


SPECIAL = ["erf", "erfc", "erfinv", "erfcinv", "ndtri", "log_ndtr", "gammaln", "digamma",
           "gamma", "i0e", "i1e", "polygamma", "beta", "betaln", "gammainc", "gammaincc",
           "betainc", "gammaincinv", "gammainccinv", "betaincinv", "stdtr", "stdtrit", "erfcx",
           "zeta", "jv", "yv", "iv", "kv", "ive", "kve"]  # fmt: skip


@pytest.mark.parametrize("name", SPECIAL)
@settings(max_examples=4)
@given(data=st.data())
def test_special_functions_match_a_loop(name, data):
    domains = REGISTRY[name].domain
    shape = data.draw(fst.shapes(max_dims=2, max_side=3))
    args, axes = batched_args(data, [shape] * len(domains), domains)
    check(getattr(fss, name), args, axes, tol=1e-9)


# ---------------------------------------------------------------- the other primitives


def spd(n, batch=()):
    a = RNG.normal(size=(*batch, n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


IDX = np.array([2, 0, 2])
BINARY_INTEGER = ["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "gcd",
                  "lcm"]  # fmt: skip


def integer_ops(k):
    """Every function of integers, once each."""
    total = fnp.invert(k) + fnp.bitwise_count(k)
    for name in BINARY_INTEGER:
        total = total + getattr(fnp, name)(k, 3)
    return total


CASES = {
    "cumsum": (lambda x: fnp.cumsum(x, axis=-1), [(2, 3)]),
    "sort": (lambda x: fnp.sort(x, axis=0), [(3, 2)]),
    "argsort": (lambda x: fnp.argsort(x, axis=-1).astype(np.float64), [(2, 3)]),
    "argpartition": (lambda x: fnp.take_along_axis(x, fnp.argpartition(x, 1), -1), [(2, 3)]),
    "searchsorted": (
        lambda a, v: fnp.searchsorted(fnp.sort(a), v).astype(np.float64),
        [(4,), (3,)],
    ),
    # d/dy x**y = x**y log(x): the exponent's derivatives go through power_log
    "power_log": (fg.grad(lambda x, y: fnp.sum(fnp.power(x, y)), argnums=1), [(3,), (3,)]),
    "broadcast_to": (lambda x: fnp.broadcast_to(x, (2, 3, 4)), [(3, 1)]),
    "reshape": (lambda x: fnp.reshape(x, (3, 2)), [(2, 3)]),
    "transpose": (lambda x: fnp.transpose(x, (2, 0, 1)), [(2, 3, 4)]),
    "slice": (lambda x: x[1:4, ::2], [(5, 4)]),
    "slice_scatter": (fg.grad(lambda x: fnp.sum(x[1:3, ::2] ** 2)), [(4, 3)]),
    "concatenate": (lambda a, b: fnp.concatenate([a, b], axis=-1), [(2, 3), (2, 1)]),
    "matmul": (lambda a, b: a @ b, [(2, 3), (3, 4)]),
    "matmul_vector": (lambda a, b: a @ b, [(3,), (3, 4)]),
    "matmul_outer": (lambda a, b: a @ b, [(3, 1), (1, 4)]),
    "matmul_stacked": (lambda a, b: a @ b, [(2, 2, 3), (2, 3, 1)]),
    "sum": (lambda x: fnp.sum(x, axis=1), [(3, 4)]),
    "sum_keepdims": (lambda x: fnp.sum(x, axis=(0, 1), keepdims=True), [(3, 4)]),
    "max": (lambda x: fnp.max(x, axis=0), [(3, 4)]),
    "min": (lambda x: fnp.min(x), [(3, 4)]),
    "prod": (lambda x: fnp.prod(x, axis=-1), [(3, 4)]),
    "argmax": (lambda x: fnp.argmax(x, axis=1), [(3, 4)]),
    "argmin": (lambda x: fnp.argmin(x), [(3, 4)]),
    "where": (lambda c, x: fnp.where(c > 0, x, -x), [(3,), (3,)]),
    "astype": (lambda x: (x * 3).astype(np.int32), [(3,)]),
    "stop_gradient": (lambda x: fg.stop_gradient(x) * x, [(3,)]),
    "gather": (lambda x: x[IDX], [(4, 2)]),
    "gather_inner": (lambda x: x[1:, IDX], [(3, 4)]),
    "gather_apart": (lambda x: x[IDX, :, np.array([0, 1, 0])], [(3, 2, 2)]),
    "gather_traced_index": (
        lambda x, i: x[(fnp.tanh(i) * 1.5 + 2).astype(np.int64)],
        [(4, 2), (3,)],
    ),
    "scatter_add": (fg.grad(lambda x: fnp.sum(x[1:, IDX] ** 2)), [(3, 4)]),
    "scatter": (lambda x, v: fnp.at(x)[IDX].set(v), [(4, 2), (3, 2)]),
    "scatter_multiply": (lambda x, v: fnp.at(x)[:, IDX].multiply(v), [(2, 4), (2, 3)]),
    "scatter_min": (lambda x, v: fnp.at(x)[1, IDX].min(v), [(3, 4), (3,)]),
    "scatter_max": (lambda x, v: fnp.at(x)[IDX].max(v), [(4,), (3,)]),
    "solve": (lambda a, b: fnp.linalg.solve(a + 4 * np.eye(3), b), [(3, 3), (3, 2)]),
    "inv": (lambda a: fnp.linalg.inv(a + 4 * np.eye(3)), [(3, 3)]),
    "det": (lambda a: fnp.linalg.det(a + 4 * np.eye(3)), [(3, 3)]),
    # det's rule: the SVD of the selected matrices, the inverse or the identity.
    "masked_svd": (
        lambda a: masked_svd(np.array([True, False]), a + 4 * np.eye(3))[1],
        [(2, 3, 3)],
    ),
    "safe_inverse": (lambda a: safe_inverse(a), [(2, 2)]),
    # x.at[].multiply's rule: the product of the others per group (with a tangent).
    "segment_others": (lambda w, t: segment_others(np.array([1, 0, 1, 1]), w, t), [(4,), (4,)]),
    "slogdet": (lambda a: fnp.linalg.slogdet(a + 4 * np.eye(3)), [(3, 3)]),
    "cholesky": (lambda a: fnp.linalg.cholesky(a @ a.T + 3 * np.eye(3)), [(3, 3)]),
    "triangular_solve": (
        lambda a, b: fsl.solve_triangular(a + 4 * np.eye(3), b, lower=True),
        [(3, 3), (3,)],
    ),
    "eigh": (lambda a: fnp.linalg.eigh(a + a.T)[0], [(3, 3)]),
    "spectral_sum": (lambda a: fnp.linalg.spectral_sum(a, "exp"), [(3, 3)]),
    "spectral_map": (
        lambda a: fg.grad(lambda m: fnp.linalg.spectral_sum(m, "square"))(a),
        [(3, 3)],
    ),
    "svd": (lambda a: fnp.linalg.svd(a, compute_uv=False), [(3, 2)]),
    "qr": (lambda a: fnp.linalg.qr(a)[1], [(3, 3)]),
    "pinv": (lambda a: fnp.linalg.pinv(a), [(3, 2)]),
    "riemann_zeta": (lambda x: fss.zeta(x + 3.0), [(3,)]),
    "expm": (lambda a: fsl.expm(a), [(3, 3)]),
    "integer_ops": (lambda x: integer_ops((x * 4).astype(np.int64)), [(3,)]),
    "sqrtm": (lambda a: fsl.sqrtm(a @ a.T + 3 * np.eye(3)), [(3, 3)]),
    "solve_sylvester": (
        lambda a, q: fsl.solve_sylvester(a + 6 * np.eye(3), a.T + 6 * np.eye(3), q),
        [(3, 3), (3, 3)],
    ),
    "lu": (lambda a: fsl.lu(a)[2], [(3, 3)]),
    "lu_solve": (
        lambda a, b: fsl.lu_solve(fsl.lu_factor(a + 6 * np.eye(3)), b, trans=1),
        [(3, 3), (3,)],
    ),
}


def ops_in(f, shapes):
    graph = fg.make_graph(f)(*(np.ones(s) for s in shapes))
    return {node.op.name for node in graph.nodes}


def test_every_primitive_has_a_batching_rule_and_a_case():
    missing = [n for n, p in REGISTRY.items() if p.batch is None and n not in EXEMPT]
    assert missing == []
    covered = set(ELEMENTWISE) | set(SPECIAL) | {"debug_print"} | set(SAMPLERS)
    covered |= {f"{n}_keys" for n in SAMPLERS if not n.startswith("random_gamma_grad")}
    for f, shapes in CASES.values():
        covered |= ops_in(f, shapes)
    assert set(REGISTRY) - EXEMPT - covered == set()


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=4)
@given(data=st.data())
def test_primitive_matches_a_loop(case, data):
    f, shapes = CASES[case]
    args, axes = batched_args(data, shapes, ["real"] * len(shapes))
    check(f, args, axes, tol=1e-8)


@pytest.mark.parametrize("case", ["matmul", "matmul_vector", "gather_inner", "scatter", "sum"])
def test_compiled_matches_a_loop(case):
    f, shapes = CASES[case]
    args = [RNG.normal(size=(3, *s)) for s in shapes]
    check(f, args, 0, jit=True, tol=1e-8)
    check(f, [args[0], args[1][0]] if len(args) == 2 else args, (0, None)[: len(args)], jit=True)


def test_debug_print_prints_the_batch(capsys):
    def f(x):
        fg.debug.print("x = {}", x)
        return x * 2

    out = fg.vmap(f)(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(out, [2.0, 4.0])
    assert capsys.readouterr().out == "x = [1. 2.]\n"


# ---------------------------------------------------------------- semantics


def test_pytrees_none_and_negative_axes():
    def f(p, x):
        return {"y": p["w"] * x[0] + p["b"], "n": fnp.sum(x[1])}

    p = {"w": RNG.normal(size=(4, 3)), "b": RNG.normal(size=3)}
    x = (RNG.normal(size=(3, 4)), RNG.normal(size=(2, 4)))
    got = fg.vmap(f, in_axes=({"w": 0, "b": None}, -1), out_axes={"y": 1, "n": 0})(p, x)
    for i in range(4):
        y = f({"w": p["w"][i], "b": p["b"]}, (x[0][:, i], x[1][:, i]))
        np.testing.assert_allclose(got["y"][:, i], y["y"])
        np.testing.assert_allclose(got["n"][i], y["n"])


def test_nested_vmap_is_an_outer_product():
    got = fg.vmap(fg.vmap(lambda a, b: a * b, (None, 0)), (0, None))(np.arange(3.0), np.arange(4.0))
    np.testing.assert_array_equal(got, np.outer(np.arange(3.0), np.arange(4.0)))


def test_axis_size_and_unbatched_outputs():
    got = fg.vmap(lambda x: x * 2, in_axes=None, axis_size=3)(np.ones(2))
    np.testing.assert_array_equal(got, np.full((3, 2), 2.0))
    out = fg.vmap(lambda x, y: (x * y, y + 1), (0, None), (0, None))(np.ones(2), np.ones(3))
    np.testing.assert_array_equal(out[1], np.full(3, 2.0))


def test_clear_errors():
    f = lambda x, y: x + y  # noqa: E731
    with pytest.raises(ValueError, match=r"in_axes has 1 entries.*2 positional"):
        fg.vmap(f, in_axes=(0,))(np.ones(2), np.ones(2))
    with pytest.raises(
        ValueError, match=r"argument x has size 2 along axis 0, argument y has size 3"
    ):
        fg.vmap(f)(np.ones(2), np.ones(3))
    with pytest.raises(
        ValueError, match=r"in_axes for argument p is a dict with keys \['a'\].*keys \['a', 'b'\]"
    ):
        fg.vmap(lambda p: p["a"], in_axes=({"a": 0},))({"a": np.ones(2), "b": np.ones(2)})
    with pytest.raises(ValueError, match=r"axis 2 of argument x, which has shape \(2,\)"):
        fg.vmap(lambda x: x, in_axes=2)(np.ones(2))
    with pytest.raises(ValueError, match=r"out_axes is None for output.*depends on the mapped"):
        fg.vmap(lambda x: x, out_axes=None)(np.ones(2))
    with pytest.raises(ValueError, match=r"out_axes puts the batch at axis 3 of output"):
        fg.vmap(lambda x: x, out_axes=3)(np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"no argument is mapped.*axis_size"):
        fg.vmap(lambda x: x, in_axes=None)(np.ones(2))
    with pytest.raises(TypeError, match=r"an axis is an int or None"):
        fg.vmap(lambda x: x, in_axes=("a",))(np.ones(2))


# ---------------------------------------------------------------- derivatives, compositions


def mlp_loss(params, x, y):
    h = fnp.tanh(x @ params["w1"] + params["b1"])
    return fnp.sum((h @ params["w2"] - y) ** 2)


def mlp_data():
    params = {
        "w1": RNG.normal(size=(3, 4)),
        "b1": RNG.normal(size=4),
        "w2": RNG.normal(size=(4, 2)),
    }
    return params, RNG.normal(size=(5, 3)), RNG.normal(size=(5, 2))


@pytest.mark.parametrize("jit", [False, True])
def test_per_example_gradients(jit):
    params, xs, ys = mlp_data()
    f = lambda x, y: fg.grad(mlp_loss)(params, x, y)  # noqa: E731
    check(f, [xs, ys], (0, 0), jit=jit, tol=1e-9)


def test_per_example_hessian_vector_products():
    params, xs, ys = mlp_data()
    v = RNG.normal(size=3)

    def hvp(x, y):
        g = lambda x: fg.grad(mlp_loss, argnums=1)(params, x, y)  # noqa: E731
        return fg.jvp(g, (x,), (v,))[1]

    check(hvp, [xs, ys], (0, 0), tol=1e-9)
    check(lambda x, y: fg.jacfwd(lambda x: mlp_loss(params, x, y))(x), [xs, ys], 0, tol=1e-9)
    check(lambda x, y: fg.hessian(lambda x: mlp_loss(params, x, y))(x), [xs, ys], 0, tol=1e-9)


def test_gradients_of_vmap_at_orders_one_and_two():
    params, xs, ys = mlp_data()

    def batch_loss(w1):
        per = fg.vmap(lambda x, y: mlp_loss({**params, "w1": w1}, x, y))(xs, ys)
        return fnp.sum(per * per)

    def loop_loss(w1):
        per = [mlp_loss({**params, "w1": w1}, x, y) for x, y in zip(xs, ys, strict=True)]
        return fnp.sum(fnp.stack(per) ** 2)

    w1 = params["w1"]
    np.testing.assert_allclose(fg.grad(batch_loss)(w1), fg.grad(loop_loss)(w1), rtol=1e-9)
    v = RNG.normal(size=w1.shape)
    hv = fg.jvp(fg.grad(batch_loss), (w1,), (v,))[1]
    np.testing.assert_allclose(hv, fg.jvp(fg.grad(loop_loss), (w1,), (v,))[1], rtol=1e-9)
    fg.testing.check_grads(batch_loss, (w1,), order=2, modes=("rev", "fwd"))


def test_vmap_of_a_jitted_function_is_compiled_once():
    f = fg.jit(lambda x: fnp.sum(fnp.sin(x)))
    batched = fg.vmap(f)
    x = RNG.normal(size=(4, 3))
    np.testing.assert_allclose(batched(x), np.sin(x).sum(axis=1))
    np.testing.assert_allclose(batched(x * 2), np.sin(x * 2).sum(axis=1))
    (derived,) = f._derived.values()
    assert isinstance(derived, Jitted) and len(derived._cache) == 1


# ---------------------------------------------------------------- control flow, custom rules


def scan_fn(c0, xs):
    def step(c, x):
        c = c * 0.9 + fnp.sin(x)
        return c, c * 2

    c, ys = fg.scan(step, c0, xs)
    return fnp.sum(ys, axis=0) + c


@fg.custom_vjp
def scaled_tanh(x, w):
    return fnp.tanh(x * w)


# A rule that is not the true gradient, so that the test sees it is the one used.
scaled_tanh.defvjp(lambda x, w: (fnp.tanh(x * w), (x, w)), lambda r, g: (g * r[1], g * r[0]))
W3 = RNG.normal(size=3)

CONTROL = {
    "scan": (scan_fn, [(2,), (5, 2)], (0, 0)),
    "scan_shared_carry": (scan_fn, [(2,), (5, 2)], (None, 0)),
    "grad_of_scan": (
        lambda c, xs: fg.grad(lambda c: fnp.sum(scan_fn(c, xs)))(c),
        [(2,), (5, 2)],
        (0, None),
    ),
    "cond": (lambda p, x: fg.cond(p > 0, lambda x: x * 2, lambda x: -x, x), [(), (3,)], (0, 0)),
    "cond_shared_predicate": (
        lambda p, x: fg.cond(p > 0, lambda x: x * 2, lambda x: -x, x),
        [(), (3,)],
        (None, 0),
    ),
    "switch": (
        lambda i, x: fg.switch(i.astype(np.int64), [fnp.sin, fnp.cos, fnp.exp], x),
        [(), (3,)],
        (0, 0),
    ),
    "while_loop": (
        lambda x: fg.while_loop(
            lambda c: c[0] < 10.0, lambda c: (fnp.abs(c[0]) * 2 + 0.1, c[1] + 1), (x, 0)
        )[1],
        [()],
        (0,),
    ),
    "fori_loop": (lambda n, x: fg.fori_loop(0, 3, lambda i, c: c * x, n), [(), ()], (0, 0)),
    "checkpoint": (
        lambda x: fg.grad(lambda x: fnp.sum(fg.checkpoint(lambda y: fnp.sin(y) * y)(x)))(x),
        [(4,)],
        (0,),
    ),
    "custom_vjp": (lambda x: scaled_tanh(x, W3), [(3,)], (0,)),
    "grad_of_custom_vjp": (
        lambda x: fg.grad(lambda w: fnp.sum(scaled_tanh(x, w)))(W3),
        [(3,)],
        (0,),
    ),
}


@pytest.mark.parametrize("case", sorted(CONTROL))
@pytest.mark.parametrize("jit", [False, True])
def test_control_flow_matches_a_loop(case, jit):
    f, shapes, axes = CONTROL[case]
    args = [
        RNG.normal(size=s if ax is None else (4, *s)) * 3
        for s, ax in zip(shapes, axes, strict=True)
    ]
    check(f, args, axes, jit=jit, tol=1e-9)


def test_grad_through_vmapped_custom_rule_sums_the_shared_cotangent():
    xs = RNG.normal(size=(4, 3))
    got = fg.grad(lambda w: fnp.sum(fg.vmap(lambda x: scaled_tanh(x, w))(xs)))(W3)
    want = sum(fg.grad(lambda w, x=x: fnp.sum(scaled_tanh(x, w)))(W3) for x in xs)
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(want, xs.sum(axis=0))  # the user's rule, not the true gradient


def divmod_host(x):
    return np.floor(x), x - np.floor(x)


host_erf = fg.primitive(scipy.special.erf)
host_erf.defvjp(lambda g, out, x: (g * (2 / np.sqrt(np.pi)) * fnp.exp(-x * x),))


@pytest.mark.parametrize("jit", [False, True])
def test_callbacks_run_once_per_example(jit):
    xs = RNG.normal(size=(4, 3))
    sort = lambda x: fg.pure_callback(np.sort, fg.ShapeDtypeStruct((3,), x.dtype), x)  # noqa: E731
    check(sort, [xs], 0, jit=jit)
    shapes = (fg.ShapeDtypeStruct((3,), xs.dtype),) * 2
    check(lambda x: fg.pure_callback(divmod_host, shapes, x), [xs], 0, jit=jit)
    check(lambda x: fnp.sum(host_erf(x) * x), [xs], 0, jit=jit)
    check(fg.grad(lambda x: fnp.sum(host_erf(x) * x)), [xs], 0, jit=jit)


@pytest.mark.parametrize("jit", [False, True])
def test_the_derivative_of_a_vmapped_callback(jit):
    # The rule is batched like any graph; y is shared by the batch: its cotangent sums.
    def loss(xs, y):
        per_example = fg.vmap(lambda x, y: fnp.sum(host_erf(x * y) ** 2), (0, None))
        return fnp.sum(per_example(xs, y) * fnp.arange(1.0, 4.0))

    xs, y = RNG.normal(size=(3, 4)), RNG.normal(size=4)
    f = fg.grad(loss, argnums=(0, 1))
    got = (fg.jit(f) if jit else f)(xs, y)
    z = xs * y
    dz = (
        2
        * scipy.special.erf(z)
        * 2
        / np.sqrt(np.pi)
        * np.exp(-z * z)
        * np.arange(1.0, 4.0)[:, None]
    )
    np.testing.assert_allclose(got[0], dz * y, rtol=1e-12)
    np.testing.assert_allclose(got[1], (dz * xs).sum(axis=0), rtol=1e-12)
    # Forward mode transposes the batched rule; second order differentiates it again.
    fg.testing.check_grads(loss, (xs, y), order=2)


def test_forward_mode_of_a_vmapped_jvp_only_callback_says_what_to_do():
    host_sin = fg.primitive(np.sin)
    host_sin.defjvp(lambda t, out, x: fnp.cos(x) * t[0])
    f = fg.vmap(lambda x: fnp.sum(host_sin(x)))
    with pytest.raises(TypeError, match=r"differentiate inside the vmap"):
        fg.jvp(f, (np.ones((2, 3)),), (np.ones((2, 3)),))


def test_every_call_primitive_has_a_batching_rule():
    from fastgrad.transforms.control_flow import REMAT, SWITCH, WHILE
    from fastgrad.transforms.custom_call import CUSTOM_VJP_CALL
    from fastgrad.transforms.python_call import PYTHON_CALL, PYTHON_CALL_MULTI
    from fastgrad.transforms.scan import SCAN

    calls = [REMAT, SWITCH, WHILE, CUSTOM_VJP_CALL, PYTHON_CALL, PYTHON_CALL_MULTI, SCAN]
    assert [p.name for p in calls if p.batch is None and "call_batch" not in p.extra] == []


def test_batched_elementwise_work_is_one_loop_and_a_shared_matmul_one_call():
    f = fg.jit(fg.vmap(lambda x, y: fnp.sum(fnp.exp(fnp.sin(x) * y) + 1.0), (0, None)))
    plan = f.lower(np.ones((5, 3)), np.ones(3)).explain()
    assert plan.splitlines()[0] == "1 steps: 1 fused loop(s), 0 library call(s)"
    g = fg.jit(fg.vmap(lambda x, w: fnp.tanh(x @ w), (0, None)))
    graph = g.lower(np.ones((5, 3)), np.ones((3, 4))).graph
    (matmul,) = [n for n in graph.nodes if n.op.name == "matmul"]
    assert [v.aval.shape for v in matmul.inputs] == [(5, 3), (3, 4)]  # one GEMM
    per_example_weight_grads = fg.jit(
        fg.vmap(fg.grad(lambda w, x: fnp.sum(fnp.tanh(x @ w))), (None, 0))
    )
    graph = per_example_weight_grads.lower(np.ones((3, 4)), np.ones((5, 3))).graph
    shapes = [n.inputs[0].aval.shape for n in graph.nodes if n.op.name == "matmul"]
    assert shapes == [(5, 3)]  # the forward product; the outer products are multiplies


# ---------------------------------------------------------------- samplers over keys

SAMPLERS = {
    "random_bits": lambda k: fg.random.bits(k, (3,)),
    "random_uniform": lambda k: fg.random.uniform(k, (2, 2)),
    "random_normal": lambda k: fg.random.normal(k, (3,), np.float32),
    "random_exponential": lambda k: fg.random.exponential(k, (2,)),
    "random_gamma": lambda k: fg.random.gamma(k, np.array([0.5, 3.0])),
    "random_gamma_grad": lambda k: fg.grad(lambda a: fnp.sum(fg.random.gamma(k, a, (2,))))(1.5),
    "random_gamma_grad2": lambda k: fg.hessian(lambda a: fnp.sum(fg.random.gamma(k, a, (2,))))(1.5),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
@pytest.mark.parametrize("jit", [False, True])
def test_samplers_vmapped_over_keys_match_a_loop(name, jit):
    keys = fg.random.split(fg.random.key(7), 3)
    f = SAMPLERS[name]
    assert name in {node.op.name for node in fg.make_graph(f)(keys[0]).nodes}
    batched = fg.vmap(f)
    got = (fg.jit(batched) if jit else batched)(keys)
    want = np.stack([np.asarray(f(k)) for k in keys])
    if name.startswith("random_gamma_grad"):  # derivatives: sums of products, reordered
        np.testing.assert_allclose(got, want, rtol=1e-13)
        return
    np.testing.assert_array_equal(got, want)
    ops = [node.op.name for node in fg.make_graph(batched)(keys).nodes]  # one sampling node
    assert [o for o in ops if o.startswith("random_")] == [f"{name}_keys"]


def test_samplers_vmapped_over_data_and_twice_match_loops():
    # fold_in over a batch of data (the key unbatched), and vmap of vmap over keys.
    fold = fg.jit(fg.vmap(lambda d: fg.random.fold_in(fg.random.key(3), d)))
    data = np.arange(4, dtype=np.uint32)
    want = np.stack([fg.random.fold_in(fg.random.key(3), d) for d in data])
    np.testing.assert_array_equal(fold(data), want)
    keys = fg.random.split(fg.random.key(1), 6).reshape(2, 3, 2)
    f = lambda k: fg.random.uniform(k, (4,))  # noqa: E731
    want = np.stack([[f(k) for k in row] for row in keys])
    np.testing.assert_array_equal(fg.jit(fg.vmap(fg.vmap(f)))(keys), want)
    a = np.array([[0.5, 2.0], [1.5, 3.0], [4.0, 0.7]])
    per_key = fg.grad(lambda k, a: fnp.sum(fg.random.gamma(k, a)), argnums=1)
    got = fg.vmap(per_key)(keys[0], a)
    want = np.stack([per_key(k, x) for k, x in zip(keys[0], a, strict=True)])
    np.testing.assert_array_equal(got, want)
