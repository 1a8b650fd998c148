"""fastgrad.scipy.linalg's expm, sqrtm, solve_sylvester, lu, lu_factor and lu_solve: values
against SciPy (eager, jitted, float32 and float64, batched), derivatives of orders 1 and 2
in both modes against finite differences, expm's against SciPy's expm_frechet, and errors."""

import numpy as np
import pytest
import scipy.linalg as sl
from hypothesis import given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
import fastgrad.scipy.linalg as fsl
from oracle import check_derivatives, check_values

# Registry records these tests exercise, for test_structural's coverage check.
COVERED = {"expm", "sqrtm", "solve_sylvester", "lu", "lu_pivots", "pivot_permutation"}


def spd(rng, shape):
    """Symmetric positive definite matrices: a real principal square root."""
    a = rng.normal(size=shape)
    return a @ np.swapaxes(a, -1, -2) + shape[-1] * np.eye(shape[-1])


def diagonally_dominant(rng, shape):
    """Well-conditioned matrices: a nonsingular LU and Sylvester operator."""
    return rng.normal(size=shape) + 2 * shape[-1] * np.eye(shape[-1])


def operands(name, rng, batch, n):
    shape = (*batch, n, n)
    if name == "expm":
        return (rng.normal(size=shape) * 0.7,)
    if name == "sqrtm":
        return (spd(rng, shape),)
    if name == "solve_sylvester":  # a (n, n), b (n + 1, n + 1), q (n, n + 1)
        return (diagonally_dominant(rng, shape), diagonally_dominant(rng, (*batch, n + 1, n + 1)),
                rng.normal(size=(*batch, n, n + 1)))  # fmt: skip
    if name.startswith("lu_solve"):
        return rng.normal(size=shape), rng.normal(size=(*batch, n, 2))
    return (rng.normal(size=shape),)


def _lu_solve(trans):
    def fun(a, b, module):
        return module.lu_solve(module.lu_factor(a), b, trans=trans)

    return fun


# name -> f(*operands, module): the same code runs fastgrad's and SciPy's functions.
FUNCTIONS = {
    "expm": lambda a, m: m.expm(a),
    "sqrtm": lambda a, m: m.sqrtm(a),
    "solve_sylvester": lambda a, b, q, m: m.solve_sylvester(a, b, q),
    "lu": lambda a, m: m.lu(a),
    "lu_permute_l": lambda a, m: m.lu(a, permute_l=True),
    "lu_factor": lambda a, m: m.lu_factor(a)[0],
    "lu_solve": _lu_solve(0),
    "lu_solve_trans": _lu_solve(1),
}


def ours(name):
    return lambda *xs: FUNCTIONS[name](*xs, fsl)


def scipys(name):
    return lambda *xs: FUNCTIONS[name](*xs, sl)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_values_match_scipy(name, dtype, data):
    batch = data.draw(st.lists(st.integers(1, 2), max_size=2).map(tuple), label="batch")
    n = data.draw(st.integers(1, 3), label="n")
    xs = operands(name, np.random.default_rng(data.draw(st.integers(0, 99))), batch, n)
    rtol = 2e-4 if dtype == np.float32 else 1e-10  # sqrtm and expm of float32 in float32
    check_values(ours(name), scipys(name), tuple(x.astype(dtype) for x in xs), dtype, rtol=rtol)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_derivatives_orders_1_and_2(name):
    xs = operands(name, np.random.default_rng(5), (2,), 3)
    check_derivatives(ours(name), xs, fused=name in {"expm", "lu_solve"})


def test_expm_gradient_matches_scipys_frechet_derivative():
    rng = np.random.default_rng(6)
    a, e = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    expected = sl.expm_frechet(a, e, compute_expm=False)
    np.testing.assert_allclose(fg.jvp(fsl.expm, (a,), (e,))[1], expected, rtol=1e-12)
    # The VJP is the adjoint: <G, L(a, e)> = <L(a^T, G), e>.
    g = rng.normal(size=(3, 3))
    vjp = fg.vjp(fsl.expm, a)[1](g)[0]
    np.testing.assert_allclose(np.sum(vjp * e), np.sum(g * expected), rtol=1e-12)


def test_identities():
    rng = np.random.default_rng(7)
    s = spd(rng, (2, 3, 3))
    root = fg.jit(fsl.sqrtm)(s)
    np.testing.assert_allclose(root @ root, s, rtol=1e-12)
    # d/dt expm(t a) = a expm(t a); the gradient of trace(expm(a)) is expm(a)^T.
    a = rng.normal(size=(3, 3))
    np.testing.assert_allclose(fg.grad(lambda a: fnp.trace(fsl.expm(a)))(a), sl.expm(a).T,
                               rtol=1e-12)  # fmt: skip
    p, lower, upper = fsl.lu(a)
    np.testing.assert_allclose(p @ lower @ upper, a, atol=1e-14)


def test_vector_right_hand_sides_and_batches():
    rng = np.random.default_rng(8)
    a, b = rng.normal(size=(2, 3, 3)), rng.normal(size=3)
    lu_and_piv = fsl.lu_factor(a)
    np.testing.assert_allclose(fsl.lu_solve(lu_and_piv, b), np.linalg.solve(a, b), rtol=1e-10)
    np.testing.assert_allclose(fsl.lu_solve(fsl.lu_factor(a[0]), b), sl.solve(a[0], b), rtol=1e-10)


def test_errors():
    with pytest.raises(ValueError, match="expm: a must hold square matrices"):
        fsl.expm(np.ones((2, 3)))
    with pytest.raises(ValueError, match="no real square root"):
        fsl.sqrtm(np.diag([-1.0, 2.0]))
    with pytest.raises(ValueError, match=r"q must be \(2, 3\)"):
        fsl.solve_sylvester(np.eye(2), np.eye(3), np.ones((3, 2)))
    with pytest.raises(NotImplementedError, match="p_indices"):
        fsl.lu(np.eye(2), p_indices=True)
    with pytest.raises(ValueError, match="trans must be"):
        fsl.lu_solve(fsl.lu_factor(np.eye(2)), np.ones(2), trans=3)
    with pytest.raises(ValueError, match="lu_solve: a has shape"):
        fsl.lu_solve(fsl.lu_factor(np.eye(2)), np.ones(3))
    # Pivots are integers: asking for their gradient is asking for none.
    assert fsl.lu_factor(np.eye(2))[1].dtype == np.int32
