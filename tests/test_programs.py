"""Random differentiable programs: traced == eager, and gradients == finite differences.

A program's stop_gradient'ed values are frozen at the evaluation point for the finite
differences, so the check also pins stop_gradient's semantics in random places.
"""

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

import fastgrad as fg
from fastgrad.testing import check_grads
from fastgrad.testing import strategies as fst


def program_and_inputs(dtype):
    return fst.programs().flatmap(
        lambda p: st.tuples(
            st.just(p), st.tuples(*(fst.arrays(s, dtype, "real") for s in p.shapes))
        )
    )


@given(program_and_inputs(np.float64))
def test_gradients_match_finite_differences_of_the_frozen_program(case):
    program, xs = case
    assume(program.clear_of_jumps(xs))
    np.testing.assert_allclose(
        fg.jit(program, fuse=False)(*xs), program(*xs), rtol=1e-12, atol=1e-12
    )
    out, vjp_fn = fg.vjp(program, *xs)
    u = np.random.default_rng(0).standard_normal(np.shape(out))
    frozen = program.frozen(xs)
    expected = fg.vjp(frozen, *xs)[1](u)
    for g, e in zip(vjp_fn(u), expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)
    check_grads(frozen, xs, atol=1e-5, rtol=1e-5)


@given(program_and_inputs(np.float32))
def test_float32_programs_stay_float32(case):
    program, xs = case
    out = fg.jit(program, fuse=False)(*xs)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, program(*xs), rtol=1e-5, atol=1e-6)
    grads = fg.jit(lambda *a: fg.vjp(program, *a)[1](np.ones_like(out)), fuse=False)(*xs)
    assert all(g.dtype == np.float32 for g in grads)
