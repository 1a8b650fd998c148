"""Random programs at order 2: Hessian-vector products against finite differences of the
gradient, on the fused kernels and on the reference interpreter.

A program's stop_gradient'ed values are frozen at the evaluation point for the finite
differences. Finite differences are wrong within their step of a kink (a tie of maximum,
abs at 0): a draw where two step sizes disagree is one of those, and is skipped, and so is
one where the gradient's one-sided differences disagree, a kink of the gradient's own
derivative within the step (abs(x) * x at x = 1e-38: central differences of its gradient,
2 abs(x), say 0 at every step, its second derivative is 2 sign(x)); the kinks themselves
are pinned by test_conventions.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.testing import strategies as fst


def program_and_inputs(dtype: Any) -> st.SearchStrategy:
    return fst.programs(max_steps=5).flatmap(
        lambda p: st.tuples(
            st.just(p), st.tuples(*(fst.arrays(s, dtype, "real") for s in p.shapes))
        )
    )


def loss(program: Any, u: np.ndarray) -> Any:
    return lambda *xs: fnp.sum(program(*xs) * u)


def hvp_fwd_over_rev(f: Any, n: int) -> Any:
    """(xs, vs) -> H v, forward mode over reverse mode."""

    def hvp(xs: Any, vs: Any) -> Any:
        return fg.jvp(lambda *a: fg.grad(f, argnums=tuple(range(n)))(*a), tuple(xs), tuple(vs))[1]

    return hvp


def hvp_rev_over_rev(f: Any, n: int) -> Any:
    """(xs, vs) -> H v as the gradient of <grad f, v>, reverse over reverse."""

    def hvp(xs: Any, vs: Any) -> Any:
        def inner(*a: Any) -> Any:
            grads = fg.grad(f, argnums=tuple(range(n)))(*a)
            total = 0.0
            for g, v in zip(grads, vs, strict=True):
                total = total + fnp.sum(g * v)
            return total

        return fg.grad(inner, argnums=tuple(range(n)))(*xs)

    return hvp


def fd_hvp(f: Any, xs: Any, vs: Any, eps: float) -> list[np.ndarray]:
    grad = fg.grad(f, argnums=tuple(range(len(xs))))
    plus = grad(*[x + eps * v for x, v in zip(xs, vs, strict=True)])
    minus = grad(*[x - eps * v for x, v in zip(xs, vs, strict=True)])
    return [(p - m) / (2 * eps) for p, m in zip(plus, minus, strict=True)]


def one_sided_differences_agree(f: Any, xs: Any, vs: Any, eps: float) -> bool:
    """Whether the forward and backward differences of f's gradient along vs agree: they
    differ by O(eps) where the gradient is smooth, by a jump's size at a kink within eps."""
    grad = fg.grad(f, argnums=tuple(range(len(xs))))
    here = grad(*xs)
    plus = grad(*[x + eps * v for x, v in zip(xs, vs, strict=True)])
    minus = grad(*[x - eps * v for x, v in zip(xs, vs, strict=True)])
    forward = [(p - h) / eps for p, h in zip(plus, here, strict=True)]
    backward = [(h - m) / eps for h, m in zip(here, minus, strict=True)]
    return close(forward, backward, 1e-3)


def close(a: Any, b: Any, tol: float) -> bool:
    return all(
        np.allclose(x, y, rtol=tol, atol=tol, equal_nan=True) for x, y in zip(a, b, strict=True)
    )


@settings(max_examples=10)
@given(program_and_inputs(np.float64))
def test_hessian_vector_products_fused_and_reference(case):
    program, xs = case
    rng = np.random.default_rng(5)
    out = program(*xs)
    u = rng.standard_normal(np.shape(out))
    vs = [rng.standard_normal(np.shape(x)) for x in xs]
    n = len(xs)
    f, frozen = loss(program, u), loss(program.frozen(xs), u)
    # The truth: central differences of the frozen program's gradient, where two step
    # sizes agree (not within a step of a kink).
    coarse, fine = fd_hvp(frozen, xs, vs, 1e-4), fd_hvp(frozen, xs, vs, 1e-5)
    assume(all(np.all(np.isfinite(c)) for c in coarse) and close(coarse, fine, 1e-5))
    assume(one_sided_differences_agree(frozen, xs, vs, 1e-5))
    reference = fg.jit(hvp_fwd_over_rev(f, n), fuse=False)(xs, vs)
    assert close(reference, fine, 1e-5), (reference, fine)
    fused = fg.jit(hvp_fwd_over_rev(f, n))(xs, vs)
    assert close(fused, reference, 1e-10), (fused, reference)
    # Reverse over reverse, on the reference interpreter, gives the same.
    rr = fg.jit(hvp_rev_over_rev(f, n), fuse=False)(xs, vs)
    assert close(rr, reference, 1e-10), (rr, reference)
