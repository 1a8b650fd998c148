"""vmap of every primitive's derivatives, orders 1 and 2, against a Python loop over the batch:
the gradient of a scalar of each op's output, and that gradient's forward derivative, mapped
over arguments batched at drawn axes (hypothesis). A batching rule that breaks under the
VJP or JVP rules' graphs (a shape param kept from the unbatched trace, a batch axis lost
in a cotangent) fails here though the op's values batch correctly (test_vmap.py)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
import fastgrad.scipy.linalg as fsl
import fastgrad.scipy.special as fss
from fastgrad.core.primitive import REGISTRY
from fastgrad.core.pytree import flatten
from fastgrad.core.tracing import aval_of
from fastgrad.testing import strategies as fst
from test_vmap import CASES, ELEMENTWISE, SPECIAL, batched_args, check, domains_of


def _total(out):
    """A scalar of the float leaves of `out`: half their sum of squares (so that a linear
    op has a second derivative too)."""
    leaves = [x for x in flatten(out)[0] if aval_of(x).dtype.kind == "f"]
    return sum(fnp.sum(x * x) for x in leaves) * 0.5


def _orders(f, args, last_only=False):
    """The gradient (order 1) of _total(f) in its float arguments (the last one only if
    `last_only`) and its forward derivative along ones (order 2), as functions of all the
    arguments."""
    floats = tuple(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f")
    floats = floats[-1:] if last_only else floats

    def first(*a):
        return fg.grad(lambda *a: _total(f(*a)), argnums=floats)(*a)

    def second(*a):
        def of_floats(*xs):
            full = list(a)
            for i, x in zip(floats, xs, strict=True):
                full[i] = x
            return first(*full)

        xs = tuple(a[i] for i in floats)
        return fg.jvp(of_floats, xs, tuple(fnp.ones_like(x) for x in xs))[1]

    return first, second


def _differentiable(f, args, axes):
    """Whether f's output (on example 0) has a float leaf: an integer or boolean result has
    no derivative to batch."""
    example = [
        a if ax is None else np.take(a, 0, axis=ax) for a, ax in zip(args, axes, strict=True)
    ]
    return any(np.asarray(x).dtype.kind == "f" for x in flatten(f(*example))[0])


_BOOLEAN = {n for n in ELEMENTWISE if domains_of(n, REGISTRY[n].ufunc.nin)[0] in ("bool", "int")}
# Integer- or boolean-valued everywhere, or of integer arguments: no derivative; zeta has
# none in its argument (it raises, saying so).
_NO_DERIVATIVE = {"argsort", "searchsorted", "argmax", "argmin", "astype", "integer_ops",
                  "riemann_zeta"}  # fmt: skip
# Derivatives need a nonsingular matrix (hypothesis draws zeros).
_SHIFTED = {
    "lu": lambda a: fsl.lu(a + 4 * np.eye(3))[2],
    "qr": lambda a: fnp.linalg.qr(a + 4 * np.eye(3))[1],
}
OPS = (
    sorted(set(ELEMENTWISE) - _BOOLEAN)
    + [f"special:{n}" for n in SPECIAL]
    + sorted(set(CASES) - _NO_DERIVATIVE)
)


@pytest.mark.parametrize("name", OPS)
@settings(max_examples=2, deadline=None)
@given(data=st.data())
def test_derivatives_match_a_loop(name, data):
    if name in CASES:
        f, shapes = CASES[name]
        f = _SHIFTED.get(name, f)
        args, axes = batched_args(data, shapes, ["real"] * len(shapes))
    elif name.startswith("special:"):
        name = name.split(":")[1]
        f, domains = getattr(fss, name), REGISTRY[name].domain
        shape = data.draw(fst.shapes(max_dims=2, max_side=3))
        args, axes = batched_args(data, [shape] * len(domains), domains)
    else:
        nin = REGISTRY[name].ufunc.nin
        f = getattr(fnp, name)
        shapes = data.draw(fst.broadcastable_shapes(nin, max_dims=2, max_side=3))
        args, axes = batched_args(data, shapes, domains_of(name, nin))
    with np.errstate(all="ignore"):
        if not _differentiable(f, args, axes):
            return
        # Special functions: the last argument (several have no derivative in the others).
        first, second = _orders(f, args, last_only=name in SPECIAL)
        check(first, args, axes, tol=1e-8)
        check(second, args, axes, tol=1e-7)
