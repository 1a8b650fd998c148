"""One test per row of docs/conventions.md: the derivative at kinks, ties, jumps, edges of
the domain and non-finite values, at orders 1 to 3, in every mode combination, in float32
and float64.

`test_the_table_and_the_tests_agree` keeps the doc, these tests and the ops' special
points (their `convention=` names) in step.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.primitive import REGISTRY
from fastgrad.testing import directional_derivative
from test_special_points import COMPOSITES

DOC = Path(__file__).resolve().parents[1] / "docs" / "conventions.md"
DTYPES = [np.float32, np.float64]
inf, nan = np.inf, np.nan


def modes_of(k: int) -> list[tuple[str, ...]]:
    return list(itertools.product(("rev", "fwd"), repeat=k))


def assert_orders(
    fun: Any, args: Any, expected: Any, dirs: Any = None, u: Any = None, dtypes: Any = DTYPES
) -> None:
    """`expected[k-1]` is the k-th derivative of `fun` at `args` along `dirs` (one tuple
    per order; default: ones for every argument), per element for an elementwise `fun`
    or contracted with `u`; checked in every mode combination and both float dtypes."""
    for dtype in dtypes:
        with np.errstate(over="ignore"):  # beyond float32's range: inf
            xs = tuple(np.asarray(a, dtype=dtype) for a in args)
        ds = [tuple(np.ones_like(x) for x in xs)] * len(expected) if dirs is None else dirs
        ds = [tuple(np.asarray(d, dtype=dtype) for d in level) for level in ds]
        uu = None if u is None else np.asarray(u, dtype=dtype)
        for k, want in enumerate(expected, start=1):
            for modes in modes_of(k):
                got = directional_derivative(fun, xs, ds[:k], modes, uu)
                np.testing.assert_allclose(
                    got, want, rtol=1e-6, atol=1e-6, equal_nan=True,
                    err_msg=f"order {k} by {'-over-'.join(reversed(modes))}, {dtype.__name__}",
                )  # fmt: skip


def test_abs_at_zero():
    x = [0.0, -0.0]
    assert_orders(fnp.abs, (x,), [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    assert_orders(lambda x: fnp.copysign(x, np.array([1.0, -1.0])), (x,), [[0.0, 0.0]] * 3)
    assert_orders(lambda x: fnp.hypot(x, np.zeros(2)), (x,), [[0.0, 0.0]] * 3)
    d = (np.array([1.0]), np.array([-0.5]))
    assert_orders(fnp.hypot, ([0.0], [0.0]), [[0.0], [0.0], [0.0]], dirs=[d, d[::-1], d])
    # The same as abs written as maximum(x, -x), whose tie splits.
    assert_orders(lambda x: fnp.maximum(x, -x), (x,), [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(fg.grad(lambda x: fnp.sum(fnp.abs(x)))(np.array([-2.0, 3.0])),
                                  [-1.0, 1.0])  # fmt: skip


def test_relu_at_zero():
    assert_orders(fnp.relu, ([0.0, -0.0],), [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    assert_orders(fnp.relu, ([2.0, -2.0],), [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(fnp.relu(np.array([nan, -inf, inf])), [nan, 0.0, inf])


def test_maximum_minimum_ties():
    x = np.array([1.0, 0.0, inf, -inf])
    y = np.array([1.0, -0.0, inf, -inf])
    zeros = np.zeros(4)
    for op in (fnp.maximum, fnp.minimum):
        assert_orders(lambda x, op=op: op(x, y), (x,), [np.full(4, 0.5), zeros, zeros])
        assert_orders(lambda y, op=op: op(x, y), (y,), [np.full(4, 0.5), zeros, zeros])
        # Mixed second and third derivatives are 0 too.
        ones = np.ones(4)
        assert_orders(op, (x, y), [ones, zeros, zeros],
                      dirs=[(ones, ones), (ones, -ones), (-ones, ones)])  # fmt: skip
    gx, gy = fg.grad(lambda x, y: fnp.sum(fnp.maximum(x, y)), argnums=(0, 1))(
        np.array([1.0, 2.0, 3.0]), np.full(3, 2.0)
    )
    np.testing.assert_array_equal(gx, [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(gy, [1.0, 0.5, 0.0])


def test_max_min_reduction_ties():
    x = np.array([1.0, 3.0, 3.0, 0.0])
    np.testing.assert_array_equal(fg.grad(fnp.max)(x), [0.0, 0.5, 0.5, 0.0])
    np.testing.assert_array_equal(fg.hessian(fnp.max)(x), np.zeros((4, 4)))
    m = np.array([[2.0, 2.0, 2.0], [1.0, -1.0, 1.0], [inf, inf, 0.0]])
    g = fg.grad(lambda m: fnp.sum(fnp.min(m, axis=1)))(m)
    np.testing.assert_allclose(g, [[1 / 3] * 3, [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    g = fg.grad(lambda m: fnp.sum(fnp.max(m, axis=1)))(m)
    np.testing.assert_allclose(g, [[1 / 3] * 3, [0.5, 0.0, 0.5], [0.5, 0.5, 0.0]])
    # Every order, every mode: along v the derivative is the mean of v over the ties.
    v = np.array([0.5, 1.0, -2.0, 4.0])
    assert_orders(fnp.max, (x,), [-0.5, 0.0, 0.0], dirs=[(v,)] * 3, u=1.0)
    assert_orders(fnp.min, (-x,), [-0.5, 0.0, 0.0], dirs=[(v,)] * 3, u=1.0)
    # x.at[i].max(v): the element and the two updates tie at 3.0, a third each.
    i = np.array([1, 1])
    for x0, vs in ((np.array([0.0, 3.0]), np.array([3.0, 3.0])),):
        g = fg.grad(lambda x, v: fnp.sum(fnp.at(x)[i].max(v) * np.array([1.0, 6.0])),
                    argnums=(0, 1))(x0, vs)  # fmt: skip
        np.testing.assert_allclose(g[0], [1.0, 2.0])
        np.testing.assert_allclose(g[1], [2.0, 2.0])
    assert_orders(lambda v: fnp.at(np.array([0.0, 3.0]))[i].min(v), (np.array([3.0, 3.0]),),
                  [2 / 3, 0.0, 0.0],
                  u=np.array([0.0, 1.0]))  # fmt: skip


def test_sort_ties():
    x = np.array([1.0, 2.0, 1.0, 1.0])
    np.testing.assert_array_equal(fg.jacobian(fnp.sort)(x), np.eye(4)[[0, 2, 3, 1]])
    u = np.array([1.0, 2.0, 4.0, 8.0])  # outputs 0, 1, 2 are the ties at 1.0
    v = np.array([0.5, -1.0, 0.25, 2.0])
    assert_orders(fnp.sort, (x,), [v[[0, 2, 3, 1]] @ u, 0.0, 0.0], dirs=[(v,)] * 3, u=u)
    # Order statistics built on sort follow it: the 0.3 quantile of (1, 2, 1) is 0.4 of
    # the first tied entry plus 0.6 of the second.
    for fun in (fnp.quantile, fnp.nanquantile):
        np.testing.assert_allclose(fg.grad(fun)(np.array([1.0, 2.0, 1.0]), 0.3), [0.4, 0.0, 0.6])


def test_clip_at_bounds():
    x = np.array([0.0, 1.0, 0.5, -1.0])
    lo, hi = np.zeros(4), np.ones(4)
    zeros = np.zeros(4)
    assert_orders(lambda x: fnp.clip(x, lo, hi), (x,), [[0.5, 0.5, 1.0, 0.0], zeros, zeros])
    assert_orders(lambda lo: fnp.clip(x, lo, hi), (lo,), [[0.5, 0.0, 0.0, 1.0], zeros, zeros])
    assert_orders(lambda hi: fnp.clip(x, lo, hi), (hi,), [[0.0, 0.5, 0.0, 0.0], zeros, zeros])
    g = fg.grad(lambda x: fnp.sum(fnp.clip(x, 0.0, 1.0)))(x)  # Python-scalar bounds
    np.testing.assert_array_equal(g, [0.5, 0.5, 1.0, 0.0])


def test_piecewise_constant():
    x = [0.0, -0.0, 2.0, 2.5, -0.5, 1.3, inf, -inf, nan]
    zeros = np.zeros(len(x))
    for op in (fnp.sign, fnp.floor, fnp.ceil, fnp.rint):
        assert_orders(op, (x,), [zeros, zeros, zeros])
        graph = fg.make_graph(fg.grad(lambda x, op=op: fnp.sum(op(x) * x)))(np.ones(3))
        assert op.__name__ not in {n.op.name for n in graph.nodes[-3:]}  # nothing flows back
    assert_orders(fnp.angle, (x,), [zeros, zeros, zeros])  # 0 or pi on real numbers
    for op in (fnp.trunc, lambda x: fnp.floor_divide(x, 0.5), lambda y: fnp.copysign(1.5, y),
               lambda x: fnp.heaviside(x, 0.5)):  # fmt: skip
        assert_orders(op, (x,), [zeros, zeros, zeros])
    assert_orders(
        lambda h0: fnp.heaviside(np.array([0.0, -0.0, 1.0]), h0), ([0.5] * 3,), [[1, 1, 0]]
    )


def test_remainder_at_jumps():
    x, y = np.array([6.0, -6.0, 0.0, -0.0]), np.array([3.0, 3.0, 3.0, 3.0])
    np.testing.assert_array_equal(fnp.remainder(x, y), np.remainder(x, y))
    zeros = np.zeros(4)
    for op in (fnp.remainder, fnp.fmod):
        assert_orders(lambda x, op=op: op(x, y), (x,), [np.ones(4), zeros, zeros])
        assert_orders(lambda y, op=op: op(x, y), (y,), [-x / y, zeros, zeros])


def test_where():
    c = np.array([True, False, True, False])
    x = np.array([nan, 1.0, inf, 2.0])
    y = np.array([1.0, nan, 3.0, -inf])
    zeros = np.zeros(4)
    assert_orders(lambda x: fnp.where(c, x, y), (x,), [c.astype(float), zeros, zeros])
    assert_orders(lambda y: fnp.where(c, x, y), (y,), [(~c).astype(float), zeros, zeros])
    # The unselected operand's infinite derivative, times 0, is nan: guard the operand.
    z = np.array([0.0, 4.0])
    naive = fg.grad(lambda x: fnp.sum(fnp.where(x > 0, fnp.sqrt(x), 0.0)))(z)
    assert np.isnan(naive[0]) and naive[1] == 0.25
    safe = fg.grad(lambda x: fnp.sum(fnp.where(x > 0, fnp.sqrt(fnp.where(x > 0, x, 1.0)), 0.0)))(z)
    np.testing.assert_array_equal(safe, [0.0, 0.25])


def test_stop_gradient():
    x = [0.0, 1.5, inf, nan]
    zeros = np.zeros(4)
    assert_orders(fnp.stop_gradient, (x,), [zeros, zeros, zeros])
    assert_orders(lambda x: x * fnp.stop_gradient(x), ([3.0],), [[3.0], [0.0], [0.0]])


def test_std_of_equal_values():
    # n > 1 equal values: the spread is a cone, no derivative.
    assert np.all(np.isnan(fg.grad(fnp.std)(np.array([1.0, 1.0, 1.0]))))
    # One value: std is identically 0, and so are its derivatives (issue 11, case 3).
    for x, axis in ((np.float64(2.0), None), (np.ones((1, 3)), 0), (np.ones((2, 1)), 1)):
        f = lambda x, axis=axis: fnp.sum(fnp.std(x, axis=axis))  # noqa: E731
        np.testing.assert_array_equal(fg.grad(f)(x), np.zeros_like(x))
        np.testing.assert_array_equal(fg.hessian(f)(x), np.zeros(np.shape(x) * 2))
        v = np.ones_like(x) * 0.75
        assert_orders(f, (x,), [0.0, 0.0, 0.0], dirs=[(v,)] * 3, u=1.0)
    assert np.isnan(fnp.std(np.array([inf])))  # NumPy's value
    # var has a derivative there: 0 over equal values.
    np.testing.assert_array_equal(fg.grad(fnp.var)(np.array([1.0, 1.0])), [0.0, 0.0])


def test_power_at_zero_base():
    y = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 1.5, -1.0])
    x = np.zeros_like(y)
    dx = [[0.0, 1.0, 0.0, 0.0, inf, 0.0, -inf],
          [0.0, 0.0, 2.0, 0.0, -inf, inf, inf],
          [0.0, 0.0, 0.0, 6.0, inf, -inf, -inf]]  # fmt: skip
    assert_orders(lambda x: fnp.power(x, y), (x,), dx)
    dy = [[-inf, 0.0, 0.0, 0.0, 0.0, 0.0, -inf], [inf, 0.0, 0.0, 0.0, 0.0, 0.0, inf]]
    assert_orders(lambda y: fnp.power(x, y), (y,), dy)
    # Issue 11, case 2: x**0 is 1, so every derivative in x is 0, in every mode.
    f = lambda x: fnp.power(x, 0.0)  # noqa: E731
    assert float(fg.grad(fg.grad(f))(0.0)) == 0.0
    assert float(fg.grad(lambda x: fg.jvp(f, (x,), (1.0,))[1])(0.0)) == 0.0
    assert float(fg.jvp(fg.grad(f), (0.0,), (1.0,))[1]) == 0.0
    assert float(fg.grad(fg.grad(fg.grad(f)))(0.0)) == 0.0


def test_logaddexp_infinities():
    x = np.array([inf, -inf, inf, -inf, inf])
    y = np.array([inf, -inf, 1.0, 1.0, -inf])
    np.testing.assert_array_equal(fnp.logaddexp(x, y), np.logaddexp(x, y))
    second = [nan, nan, 0.0, 0.0, 0.0]
    assert_orders(lambda x: fnp.logaddexp(x, y), (x,), [[nan, nan, 1.0, 0.0, 1.0], second, second])
    assert_orders(lambda y: fnp.logaddexp(x, y), (y,), [[nan, nan, 0.0, 1.0, 0.0]])
    # Issue 11, case 1: at a tie the Hessian is s(1-s) [[1, -1], [-1, 1]], s = 1/2.
    h = fg.hessian(lambda z: fnp.logaddexp(z[0], z[1]))(np.array([0.3, 0.3]))
    np.testing.assert_allclose(h, [[0.25, -0.25], [-0.25, 0.25]], rtol=1e-15)
    one, zero = np.ones(1), np.zeros(1)
    ex, ey = (one, zero), (zero, one)  # d/dx, then d/dy, then d/dx: 1/2, -1/4, 0
    assert_orders(fnp.logaddexp, ([0.3], [0.3]), [[0.5], [-0.25], [0.0]], dirs=[ex, ey, ex])
    assert_orders(fnp.logaddexp, ([0.3], [0.3]), [[0.5], [0.25], [0.0]], dirs=[ex, ex, ex])
    assert_orders(fnp.softplus, ([0.0],), [[0.5], [0.25], [0.0]])
    assert_orders(fnp.log_sigmoid, ([0.0],), [[0.5], [-0.25], [0.0]])


def test_outside_domain():
    for op, x in ((fnp.log, -1.0), (fnp.log2, -1.0), (fnp.log10, -inf), (fnp.log1p, -2.0),
                  (fnp.arctanh, 2.0), (fnp.arccosh, 0.5), (fnp.arccosh, -2.0),
                  (fnp.sqrt, -1.0), (fnp.arcsin, 2.0), (fnp.arccos, -2.0)):  # fmt: skip
        assert np.isnan(op(x))
        assert_orders(op, ([x],), [[nan], [nan], [nan]])


def test_nan_inputs():
    x = np.array([nan, 1.0])
    assert_orders(lambda x: fnp.sum(x), (x,), [1.5, 0.0, 0.0], dirs=[(np.array([1.0, 0.5]),)] * 3,
                  u=1.0)  # fmt: skip
    assert_orders(lambda x: x * 2.0, ([nan],), [[2.0], [0.0], [0.0]])
    assert_orders(fnp.floor, ([nan],), [[0.0], [0.0], [0.0]])
    for op in (lambda x: fnp.maximum(x, 1.0), lambda x: fnp.minimum(x, 1.0), fnp.relu,
               lambda x: fnp.clip(x, 0.0, 1.0), fnp.exp, fnp.tanh, fnp.abs):  # fmt: skip
        assert_orders(op, ([nan],), [[nan]])
    assert np.all(np.isnan(fg.grad(fnp.max)(np.array([1.0, nan]))))
    # remainder and fmod, piecewise linear: d/dx 1, d/dy nan, then 0.
    x, y = np.array([7.0, inf, nan, 7.0]), np.array([0.0, 3.0, 3.0, nan])
    ones, nans, zeros = np.ones(4), np.full(4, nan), np.zeros(4)
    for op in (fnp.remainder, fnp.fmod):
        assert np.all(np.isnan(op(x, y)))
        assert_orders(lambda x, op=op: op(x, y), (x,), [ones, zeros, zeros])
        assert_orders(lambda y, op=op: op(x, y), (y,), [nans, zeros, zeros])
    # The nan-ignoring reductions leave the nan entry out.
    x = np.array([1.5, nan, 0.5])
    for op, want in ((fnp.nansum, [1.0, 0.0, 1.0]), (fnp.nanmean, [0.5, 0.0, 0.5]),
                     (fnp.nanmax, [1.0, 0.0, 0.0]), (fnp.nanmin, [0.0, 0.0, 1.0]),
                     (fnp.nanprod, [0.5, 0.0, 1.5])):  # fmt: skip
        np.testing.assert_array_equal(fg.grad(op)(x), want)
    np.testing.assert_array_equal(fg.grad(lambda x: fnp.sum(fnp.nancumsum(x)))(x), [3, 0, 1])
    # fmax and fmin ignore nan: the other operand is the result.
    for op in (fnp.fmax, fnp.fmin):
        assert_orders(
            lambda x, op=op: op(x, np.array([1.0, nan])), ([nan, 1.0],), [[0.0, 1.0], [0, 0]]
        )
        assert_orders(
            lambda y, op=op: op(np.array([1.0, nan]), y), ([nan, 1.0],), [[0.0, 1.0], [0, 0]]
        )


def test_infinite_inputs():
    assert_orders(fnp.exp, ([-inf, inf],), [[0.0, inf], [0.0, inf], [0.0, inf]])
    assert_orders(fnp.arctan, ([inf, -inf],), [[0.0, 0.0]])  # then inf/inf: nan
    assert_orders(fnp.sigmoid, ([inf, -inf],), [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    assert_orders(fnp.softplus, ([inf, -inf],), [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    assert_orders(lambda x: fnp.maximum(x, 1.0), ([inf, -inf],), [[1.0, 0.0]])
    g = fg.grad(fnp.logsumexp)(np.array([inf, 1.0]))
    assert np.isnan(g[0]) and g[1] == 0.0  # inf/inf for the infinite entry: nan, not 1


def test_edges_of_the_domain():
    assert_orders(fnp.sqrt, ([0.0, -0.0],), [[inf, inf], [-inf, -inf]])
    assert_orders(fnp.cbrt, ([0.0],), [[inf]])
    assert_orders(fnp.arcsin, ([1.0, -1.0],), [[inf, inf]])
    assert_orders(fnp.arccos, ([1.0, -1.0],), [[-inf, -inf]])
    assert_orders(fnp.arccosh, ([1.0],), [[inf]])
    assert_orders(lambda x: fnp.power(x, 0.5), ([0.0],), [[inf], [-inf], [inf]])
    import fastgrad.scipy.special as fss

    assert_orders(fss.entr, ([0.0],), [[inf], [-inf], [inf]])
    assert_orders(lambda x: fss.rel_entr(x, 2.0), ([0.0],), [[-inf], [inf], [-inf]])
    assert_orders(lambda x: fss.kl_div(x, 2.0), ([0.0],), [[-inf], [inf], [-inf]])
    # At (0, 0) the slope depends on the direction: nan, in x, in y and along both.
    for fun in (fss.rel_entr, fss.kl_div):
        for dirs in ([(1.0, 0.0)], [(0.0, 1.0)], [(1.0, 1.0)]):
            assert_orders(fun, (0.0, 0.0), [nan], dirs=dirs)


def test_overflow():
    assert_orders(fnp.exp, ([710.0],), [[inf], [inf], [inf]])
    # The value overflows, its derivatives need not.
    assert_orders(fnp.square, ([1e200],), [[2e200], [2.0], [0.0]], dtypes=[np.float64])
    with np.errstate(over="ignore"):
        assert np.isinf(fnp.square(np.float64(1e200)))
    # Two overflowed partials of opposite signs meet as inf - inf.
    got = directional_derivative(fnp.power, (np.array(10.0), np.array(400.0)),
                                 [(np.array(1.0), np.array(-1.0))], ("fwd",))  # fmt: skip
    assert not np.isfinite(got)


def test_astype():
    x = np.array([0.1, 1e39, inf])
    assert_orders(lambda x: fnp.astype(x, np.float32) * 1.0, (x,), [[1.0, 1.0, 1.0]])
    g = fg.grad(lambda x: fnp.sum(fnp.astype(fnp.astype(x, np.int64), np.float64) * x))(
        np.array([2.7, -2.7])
    )
    np.testing.assert_array_equal(g, [2.0, -2.0])  # the cast to int has no derivative


def test_prod_with_zeros():
    x = np.array([0.0, 2.0, 3.0])
    np.testing.assert_array_equal(fg.grad(fnp.prod)(x), [6.0, 0.0, 0.0])
    np.testing.assert_array_equal(fg.hessian(fnp.prod)(x), [[0, 3, 2], [3, 0, 0], [2, 0, 0]])
    # The third derivative along e0, e1, e2 is 1.
    e = np.eye(3)
    assert_orders(fnp.prod, (x,), [6.0, 3.0, 1.0], dirs=[(e[0],), (e[1],), (e[2],)], u=1.0)
    two = np.array([[0.0, 0.0, 3.0], [1.0, 2.0, 0.0]])
    g = fg.grad(lambda m: fnp.sum(fnp.prod(m, axis=1)))(two)
    np.testing.assert_array_equal(g, [[0.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    h = fg.hessian(lambda v: fnp.prod(v))(two[0])
    np.testing.assert_array_equal(h, [[0, 3, 0], [3, 0, 0], [0, 0, 0]])


def test_interp_at_knots():
    xp, fp = np.array([0.0, 1.0, 3.0]), np.array([0.0, 2.0, 3.0])
    assert_orders(lambda x: fnp.interp(x, xp, fp), ([1.0],), [[0.5], [0.0], [0.0]])
    # In fp: the right segment's weights, (1, 0) on fp[1], fp[2] at the knot.
    np.testing.assert_allclose(fg.grad(lambda f: fnp.interp(1.0, xp, f))(fp), [0.0, 1.0, 0.0])


def test_decomposition_signs():
    la = fnp.linalg
    a = np.array([[2.0, 0.5, -1.0], [0.25, 3.0, 0.5], [-0.5, 1.0, 1.5]])
    s = a + a.T
    # NumPy's signs (LAPACK's), traced or not.
    for ours, numpy_parts in (
        (fg.jit(la.eigh)(s), np.linalg.eigh(s)),
        (la.svd(a, full_matrices=False), np.linalg.svd(a, full_matrices=False)),
        (fg.jit(la.qr)(a[:, :2]), np.linalg.qr(a[:, :2])),
    ):
        for got, want in zip(ours, numpy_parts, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-12)
    # The branch through them: each vector's tangent is orthogonal to it.
    t = np.array([[0.3, -0.2, 0.1], [0.4, 0.5, -0.6], [0.0, 0.7, 0.2]])
    v, dv = fg.jvp(lambda m: la.eigh(m).eigenvectors, (s,), (t + t.T,))
    np.testing.assert_allclose(np.sum(v * dv, axis=0), 0.0, atol=1e-12)
    # Repeated eigenvalues (and singular values): the vectors have no derivative; the
    # first derivative of the values does not depend on the choice and stays exact.
    eye = np.eye(2)
    assert not np.isfinite(fg.grad(lambda m: la.eigh(m).eigenvectors[0, 0])(eye)).all()
    assert not np.isfinite(fg.grad(lambda m: la.svd(m).U[0, 0])(eye)).all()
    np.testing.assert_allclose(fg.grad(lambda m: fnp.sum(la.eigvalsh(m) ** 2))(eye), 2 * eye)
    np.testing.assert_allclose(fg.grad(lambda m: fnp.sum(la.svdvals(m) ** 2))(eye), 2 * eye)
    assert not np.isfinite(fg.hessian(lambda m: fnp.sum(la.eigvalsh(m) ** 2))(eye)).all()
    _second_derivatives_at_repeated_values()


def _second_derivatives_at_repeated_values() -> None:
    # Why nan from order 2 at a repeated eigenvalue, by mpmath along a(t) = a + t e (a's
    # eigenvalue 1 twice): the smallest eigenvalue is 1 - |t| + O(t^2) there, with one-sided
    # derivatives -1 and 1 and a second difference that diverges (-2 / h): none exists. A
    # symmetric function of the spectrum, sum(f(eigenvalues)), is smooth: its second
    # derivative exists (Daleckii-Krein: sum_ij f'[1](l_i, l_j) e_ij^2, the divided
    # difference of f', f'' within the repeated block): 5 for f = x^2, 9.778 for exp.
    # fastgrad differentiates it through the values, which have none, and gives nan, as
    # JAX does; the rule cannot do better, since the term it lacks, f''(l) e_ij between
    # the repeated values, depends on f, not on the cotangent it is given.
    import mpmath

    a, e = np.diag([1.0, 1.0, 3.0]), np.array([[0, 1, 0.5], [1, 0, 0], [0.5, 0, 0]])
    with mpmath.workprec(200):
        h = mpmath.mpf(2) ** -60
        values = {t: sorted(mpmath.eigsy(mpmath.matrix(a) + t * mpmath.matrix(e))[0])
                  for t in (-h, 0, h)}  # fmt: skip
        low = [values[t][0] for t in (-h, 0, h)]
        assert abs((low[2] - low[1]) / h + 1) < 1e-9 and abs((low[1] - low[0]) / h - 1) < 1e-9
        for f, want in ((lambda x: x * x, 5.0), (mpmath.exp, 9.778377430600246)):
            total = [sum(f(x) for x in values[t]) for t in (-h, 0, h)]  # noqa: B023
            assert abs((total[0] + total[2] - 2 * total[1]) / h**2 - want) < 1e-9
    for f in (lambda x: x * x, fnp.exp):
        hvp = fg.jvp(fg.grad(lambda m: fnp.sum(f(fnp.linalg.eigvalsh(m)))), (a,), (e,))[1]  # noqa: B023
        assert np.isnan(hvp).any()
    # fnp.linalg.spectral_sum(a, fn), trace(f(a)) as an op of its own, has the divided
    # differences in its rule: exact at orders 1 and 2 in every mode, at the tie too.
    for fn, want in (("square", 5.0), ("exp", 9.778377430600246)):
        spectral = lambda m, fn=fn: fnp.linalg.spectral_sum(m, fn)  # noqa: E731
        grad = 2 * a if fn == "square" else np.diag(np.exp(np.diag(a)))
        assert_orders(spectral, (a,), [np.sum(grad * e), want], dirs=[(e,), (e,)], u=1.0)


def test_repeated_eigenvalues():
    la = fnp.linalg
    # a = Q diag(1, 1, 3) Q^T: a double eigenvalue, in a basis of LAPACK's choosing.
    q = np.linalg.qr(np.array([[2.0, -1.0, 0.5], [1.0, 3.0, -2.0], [0.5, 1.0, 1.5]]))[0]
    d = np.array([1.0, 1.0, 3.0])
    a = (q * d) @ q.T
    a = (a + a.T) / 2
    e = np.array([[0.5, -1.0, 0.25], [-1.0, 1.5, 0.75], [0.25, 0.75, -0.5]])
    # A symmetric function of the tie: exact at order 1, in both modes and dtypes; its
    # derivative along e is trace(f'(a) e).
    for f, df in ((lambda w: w, np.ones_like), (lambda w: w * w, lambda w: 2 * w),
                  (fnp.exp, np.exp)):  # fmt: skip
        want = np.sum((q * df(d)) @ q.T * e)
        for values in (la.eigvalsh, lambda m: la.eigh(m).eigenvalues, la.svdvals):
            assert_orders(lambda m: fnp.sum(f(values(m))), (a,), [want], [(e,)], u=1.0)  # noqa: B023
    # One value of the tie (or a weighted sum): no derivative; reverse mode sees the
    # cotangent and gives nan, for that matrix of a stack only.
    stack = np.stack([a, np.diag([1.0, 2.0, 3.0])])
    for dtype in DTYPES:
        for values in (la.eigvalsh, lambda m: la.eigh(m).eigenvalues,
                       lambda m: la.svdvals(m)[..., ::-1]):  # fmt: skip
            for pick in (lambda w: w[..., 0], lambda w: w[..., 0] + 2 * w[..., 1]):
                g = fg.grad(lambda m: fnp.sum(pick(values(m))))(stack.astype(dtype))  # noqa: B023
                assert np.isnan(g[0]).any() and np.isfinite(g[1]).all()
        # Away from the tie (the stack's second matrix): the value's own derivative.
        g = fg.grad(lambda m: la.eigvalsh(m)[0])(np.diag([1.0, 2.0, 3.0]).astype(dtype))
        np.testing.assert_array_equal(g, np.diag([1.0, 0.0, 0.0]))
        # So do the vectors of a tied value.
        assert np.isnan(fg.grad(lambda m: la.eigh(m).eigenvectors[2, 0])(a.astype(dtype))).any()
    # Forward mode cannot see what the tangent feeds: each tied value gets the tie's mean
    # rate (the same in every basis, exact for symmetric functions), here the average of
    # the one-sided derivatives -1 and 1 (mpmath, _second_derivatives_at_repeated_values).
    b, t = np.diag([1.0, 1.0, 3.0]), np.array([[0, 1, 0.5], [1, 0, 0], [0.5, 0, 0]])
    np.testing.assert_allclose(fg.jvp(la.eigvalsh, (b,), (t,))[1], [0.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(fg.jvp(la.eigvalsh, (a,), (e,))[1][:2], np.trace(
        q[:, :2].T @ e @ q[:, :2]) / 2)  # fmt: skip


def test_det_at_singular_matrices():
    # Rank 2 of 3 (row 3 = row 1 + row 2), distinct singular values: the gradient is the
    # cofactor matrix, and the higher derivatives are exact.
    a = np.array([[1.0, 2.0, 3.0], [2.0, -1.0, 0.5], [3.0, 1.0, 3.5]])
    cofactors = [[-4.0, -5.5, 5.0], [-4.0, -5.5, 5.0], [4.0, 5.5, -5.0]]
    np.testing.assert_allclose(fg.grad(fnp.linalg.det)(a), cofactors, atol=1e-12)
    e, f = np.outer(np.eye(3)[0], np.eye(3)[1]), np.eye(3)
    # d/dt det(a + t e) = cofactor[0, 1]; second and third derivatives from the polynomial
    # det(a + s I) = det(a) + s tr(adj a) + s^2 tr(a) + s^3.
    assert_orders(fnp.linalg.det, (a,), [-5.5], dirs=[(e,)], u=1.0, dtypes=[np.float64])
    assert_orders(
        fnp.linalg.det, (a,), [np.trace(cofactors), 2 * np.trace(a), 6.0], dirs=[(f,)] * 3, u=1.0,
        dtypes=[np.float64],
    )  # fmt: skip
    # Rank 0 of 2: the gradient is 0 (every cofactor is a 1 x 1 minor of 0).
    np.testing.assert_array_equal(fg.grad(fnp.linalg.det)(np.zeros((2, 2))), np.zeros((2, 2)))
    for dtype in (np.float32, np.float64):
        _slogdet_at_singular_matrices(dtype)


def _slogdet_at_singular_matrices(dtype: type) -> None:
    # As JAX: sign 0 and log|det| -inf. Its derivatives diverge there: nan at orders 1 to 3
    # in every mode (JAX: inf or nan), never a raise or a finite number; a regular matrix
    # of the same stack keeps its exact gradient, inv(a)^T.
    regular = np.array([[2.0, 1.0], [1.0, 3.0]])
    for singular in (np.zeros((2, 2)), np.array([[1.0, 2.0], [2.0, 4.0]])):
        a = np.stack([singular, regular]).astype(dtype)
        sign, logdet = fg.jit(fnp.linalg.slogdet)(a)
        assert sign.tolist() == [0, 1] and logdet[0] == -inf
        f = lambda m: fnp.sum(fnp.linalg.slogdet(m).logabsdet)  # noqa: E731
        t = np.ones_like(a)
        grads = [fg.grad(f)(a), fg.jit(fg.grad(f))(a), fg.jvp(f, (a,), (t,))[1]]
        seconds = [fg.hessian(f)(a), fg.jvp(fg.grad(f), (a,), (t,))[1]]
        thirds = [fg.grad(lambda m, f=f: fnp.sum(fg.hessian(f)(m)[0, :, :, 0]))(a),
                  fg.jvp(lambda m, f=f, t=t: fg.jvp(fg.grad(f), (m,), (t,))[1],
                         (a,), (t,))[1]]  # fmt: skip
        assert np.isnan(grads[2])
        for d in grads[:2] + seconds[1:] + thirds:
            assert np.isnan(d[0]).all()
        assert np.isnan(seconds[0][0]).all() and np.isnan(thirds[0][0]).all()
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(grads[0][1], np.linalg.inv(regular).T, rtol=rtol)
        np.testing.assert_allclose(grads[1][1], np.linalg.inv(regular).T, rtol=rtol)


# ---------------------------------------------------------------- the table itself

ROW = re.compile(r"^\|\s*`([a-z0-9-]+)`\s*\|", re.MULTILINE)


def documented_rows() -> list[str]:
    return ROW.findall(DOC.read_text())


def test_scaled_bessel_at_zero():
    import fastgrad.scipy.special as fss

    # The one-sided derivatives: i0e = 1 -+ x + 3x^2/4 -+ 5x^3/12 and i1e = x/2 -+ x^2/2
    # + 5x^3/16 on either side of 0; the convention takes their averages.
    for x in ([0.0, -0.0],):
        assert_orders(fss.i0e, (x,), [[0.0, 0.0], [1.5, 1.5], [0.0, 0.0]])
        assert_orders(fss.i1e, (x,), [[0.5, 0.5], [0.0, 0.0], [1.875, 1.875]])
    # Next to 0 the derivatives are the one-sided ones (from the right here).
    assert_orders(fss.i1e, ([1e-30],), [[0.5], [-1.0], [1.875]])
    assert_orders(fss.i0e, ([1e-30],), [[-1.0], [1.5], [-2.5]])
    # ive of integer order, the same functions (and ive(2, x) = x^2/8 -+ x^3/8 + ...).
    zero = [0.0, -0.0]
    assert_orders(lambda x: fss.ive(0.0, x), (zero,), [[0.0, 0.0], [1.5, 1.5], [0.0, 0.0]])
    assert_orders(lambda x: fss.ive(1.0, x), (zero,), [[0.5, 0.5], [0.0, 0.0], [1.875, 1.875]])
    assert_orders(lambda x: fss.ive(2.0, x), (zero,), [[0.0, 0.0], [0.25, 0.25], [0.0, 0.0]])


def test_xlogy_at_zero():
    import fastgrad.scipy.special as fss

    # d/dx is log(y) (log1p(y)), as JAX: -inf at the edge of log's domain, +inf at y = inf,
    # nan below; from order 2 on, nan (JAX: nan too).
    zero = [0.0, 0.0, 0.0]
    diverging = [[-inf, nan, inf], [nan, nan, nan], [nan, nan, nan]]
    for fun, edge in ((fss.xlogy, 0.0), (fss.xlog1py, -1.0)):
        ys = [edge, edge - 1.0, inf]
        assert_orders(lambda x, f=fun, y=ys: f(x, np.array(y, dtype=x.dtype)), (zero,), diverging)
        # Along x == 0 the function is 0: so is its derivative in y, at every order.
        assert_orders(lambda y, f=fun: f(np.zeros_like(y), y), (ys[:2],), [[0.0, 0.0]] * 3)
        # Inside log's domain, the derivatives of x log(y) as usual: log(y) in x.
        assert_orders(lambda x, f=fun, e=edge: f(x, np.full_like(x, e + 2.0)), ([0.0],),
                      [[np.log(2.0)], [0.0], [0.0]])  # fmt: skip


def test_the_table_and_the_tests_agree():
    rows = documented_rows()
    assert len(rows) == len(set(rows)), "a row of docs/conventions.md is there twice"
    tests = {name[5:] for name in globals() if name.startswith("test_")} - {
        "the_table_and_the_tests_agree",
        "each_row_says_how_jax_does_it",
    }
    assert {r.replace("-", "_") for r in rows} == tests, (
        "every row of docs/conventions.md needs a test here named test_<id>, and every "
        "test here a row"
    )
    used = {pt.convention for p in REGISTRY.values() for pt in p.special_points} | {
        pt.convention for c in COMPOSITES.values() for pt in c.points
    }
    used.discard(None)
    assert used <= set(rows), f"conventions named by special points but not documented: " \
                              f"{sorted(used - set(rows))}"  # fmt: skip


@pytest.mark.parametrize("row", documented_rows())
def test_each_row_says_how_jax_does_it(row):
    line = next(line for line in DOC.read_text().splitlines() if line.startswith(f"| `{row}`"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert len(cells) == 4 and cells[3], f"row {row}: id | where | derivative | JAX"
