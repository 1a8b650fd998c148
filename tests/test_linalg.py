"""fastgrad.numpy.linalg and fastgrad.scipy.linalg: values against NumPy and SciPy, eager
and traced, float32 and float64, batched; derivatives of orders 1 and 2 in both modes
against finite differences; singular and degenerate inputs.

Inputs are built well-conditioned (and, for eigh and svd, with well separated
eigenvalues or singular values), so finite differences are accurate. Functions of
eigenvectors and singular vectors are made invariant to their sign, which LAPACK picks.
"""

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
import fastgrad.scipy.linalg as fsl
from fastgrad.ops import linalg as la_module
from fastgrad.testing import check_grads
from oracle import check_derivatives, check_float32_gradients, check_values

la = fnp.linalg
rng = np.random.default_rng(5)


def general(*shape):
    """Square matrices far from singular."""
    n = shape[-1]
    return rng.standard_normal(shape) * 0.5 + 2 * np.eye(n)


def spd(*shape):
    b = rng.standard_normal(shape)
    return b @ np.swapaxes(b, -1, -2) / max(shape[-1], 1) + np.eye(shape[-1])


def separated(*shape, spectrum=None):
    """Matrices U diag(s) V^T with s well separated: 3, 2, 1.5, ... (or `spectrum`)."""
    m, n = shape[-2:]
    k = min(m, n)
    u = np.linalg.qr(rng.standard_normal(shape[:-2] + (m, m)))[0][..., :k]
    v = np.linalg.qr(rng.standard_normal(shape[:-2] + (n, n)))[0][..., :k]
    s = np.array(spectrum if spectrum is not None else [3.0, 2.0, 1.4, 1.0, 0.7][:k])
    return (u * s) @ np.swapaxes(v, -1, -2)


def symmetric(*shape):
    """Symmetric matrices with eigenvalues -1.5, 0.5, 2, 3 (well separated)."""
    q = np.linalg.qr(rng.standard_normal(shape))[0]
    w = np.array([-1.5, 0.5, 2.0, 3.0][: shape[-1]])
    return (q * w) @ np.swapaxes(q, -1, -2)


def sq(x):
    return x * x


A, B, S = general(2, 3, 3), rng.standard_normal((2, 3, 2)), spd(2, 3, 3)
TALL, WIDE, SYM = separated(2, 4, 3), separated(2, 3, 4), symmetric(2, 3, 3)
VEC = rng.standard_normal(3)

# name -> (fastgrad function, NumPy/SciPy reference, args); the reference may use SciPy.
CASES = {
    "solve": (la.solve, np.linalg.solve, (A, B)),
    "solve_vector": (la.solve, np.linalg.solve, (A, VEC)),
    "solve_broadcast": (la.solve, np.linalg.solve, (A, B[0])),
    "inv": (la.inv, np.linalg.inv, (A,)),
    "det": (la.det, np.linalg.det, (A,)),
    "slogdet": (lambda a: la.slogdet(a).logabsdet * la.slogdet(a).sign, None, (A,)),
    "slogdet_values": (la.slogdet, np.linalg.slogdet, (A - 2.2 * np.eye(3),)),
    "cholesky": (la.cholesky, np.linalg.cholesky, (S,)),
    "cholesky_upper": (lambda a: la.cholesky(a, upper=True), None, (S,)),
    "eigh": (lambda a: (la.eigh(a)[0], sq(la.eigh(a)[1])), None, (SYM,)),
    "eigh_upper": (lambda a: sq(la.eigh(a, UPLO="U").eigenvectors), None, (SYM,)),
    "eigvalsh": (la.eigvalsh, np.linalg.eigvalsh, (SYM,)),
    "svd_tall": (lambda a: tuple(map(sq, la.svd(a, full_matrices=False))), None, (TALL,)),
    "svd_wide": (lambda a: tuple(map(sq, la.svd(a, full_matrices=False))), None, (WIDE,)),
    "svd_square": (lambda a: la.svd(a)[0][..., :, :1] * la.svd(a)[2][..., :1, :], None, (A,)),
    "svdvals": (la.svdvals, lambda a: np.linalg.svd(a, compute_uv=False), (WIDE,)),
    # trace(f(a)); its derivatives run through spectral_map (f'(a) and its divided differences).
    "spectral_sum": (
        lambda a: la.spectral_sum(a, "exp"),
        lambda a: np.sum(np.exp(np.linalg.eigvalsh((a + np.swapaxes(a, -1, -2)) / 2)), axis=-1),
        (SYM,),
    ),
    "spectral_sum_log": (
        lambda a: la.spectral_sum(a, "log"),
        lambda a: np.sum(np.log(np.linalg.eigvalsh(a)), axis=-1),
        (S,),
    ),
    "qr_tall": (lambda a: tuple(la.qr(a)), lambda a: tuple(np.linalg.qr(a)), (TALL,)),
    "qr_wide": (lambda a: tuple(la.qr(a)), lambda a: tuple(np.linalg.qr(a)), (WIDE,)),
    "qr_r": (lambda a: la.qr(a, mode="r"), lambda a: np.linalg.qr(a, mode="r"), (TALL,)),
    "pinv_tall": (la.pinv, np.linalg.pinv, (TALL,)),
    "pinv_wide": (la.pinv, np.linalg.pinv, (WIDE,)),
    "solve_triangular": (
        lambda a, b: fsl.solve_triangular(a, b, lower=True),
        lambda a, b: scipy.linalg.solve_triangular(a, b, lower=True),
        (A, B),
    ),
    "solve_triangular_upper_T": (
        lambda a, b: fsl.solve_triangular(a, b, trans="T", unit_diagonal=True),
        lambda a, b: scipy.linalg.solve_triangular(a, b, trans="T", unit_diagonal=True),
        (A, VEC),
    ),
    "cho_solve": (
        lambda a, b: fsl.cho_solve(fsl.cho_factor(a), b),
        lambda a, b: scipy.linalg.cho_solve(scipy.linalg.cho_factor(a), b),
        (S, B),
    ),
    "cho_solve_lower": (
        lambda a, b: fsl.cho_solve(fsl.cho_factor(a, lower=True), b),
        lambda a, b: scipy.linalg.cho_solve(scipy.linalg.cho_factor(a, lower=True), b),
        (S[0], VEC),
    ),
    "scipy_cholesky": (fsl.cholesky, scipy.linalg.cholesky, (S[0],)),
    "matrix_power": (
        lambda a: la.matrix_power(a, 3),
        lambda a: np.linalg.matrix_power(a, 3),
        (A,),
    ),
    "matrix_power_negative": (
        lambda a: la.matrix_power(a, -2),
        lambda a: np.linalg.matrix_power(a, -2),
        (A,),
    ),
    "matrix_power_zero": (
        lambda a: la.matrix_power(a, 0) + a,
        lambda a: np.linalg.matrix_power(a, 0) + a,
        (A,),
    ),
    "multi_dot": (
        lambda a, b, c: la.multi_dot([a, b, c]),
        lambda a, b, c: np.linalg.multi_dot([a, b, c]),
        (VEC, TALL[0].T, WIDE[0].T),
    ),
    "lstsq": (
        lambda a, b: la.lstsq(a, b)[:2],
        lambda a, b: np.linalg.lstsq(a, b)[:2],
        (TALL[0], rng.standard_normal(4)),
    ),
    "cond": (la.cond, np.linalg.cond, (A,)),
    "cond_1": (lambda a: la.cond(a, 1), lambda a: np.linalg.cond(a, 1), (A,)),
    "matrix_transpose": (la.matrix_transpose, lambda a: np.swapaxes(a, -1, -2), (TALL,)),
}
NORMS = [
    (None, None), (2, None), (1, None), (np.inf, None), (-np.inf, None), (3.5, None),
    (None, (1, 2)), ("fro", (1, 2)), ("nuc", (1, 2)), (2, (2, 1)), (-2, (1, 2)),
    (1, (1, 2)), (-1, (2, 1)), (np.inf, (1, 2)), (-np.inf, (1, 2)), (2, 0), (1, -1),
]  # fmt: skip
for _ord, _axis in NORMS:
    CASES[f"norm_{_ord}_{_axis}"] = (
        lambda x, o=_ord, a=_axis: la.norm(x, o, a),
        lambda x, o=_ord, a=_axis: np.linalg.norm(x, o, a),
        (TALL if _axis is not None else TALL[0, :, 0],),
    )
CASES["norm_keepdims"] = (
    lambda x: la.norm(x, "nuc", (0, 2), keepdims=True),
    lambda x: np.linalg.norm(x, "nuc", (0, 2), keepdims=True),
    (TALL,),
)
CASES["vector_norm"] = (
    lambda x: la.vector_norm(x, axis=(0, 1), ord=3),
    lambda x: np.linalg.vector_norm(x, axis=(0, 1), ord=3),
    (TALL,),
)
CASES["matrix_norm"] = (la.matrix_norm, np.linalg.matrix_norm, (TALL,))
# The registry records each case exercises, for test_structural's coverage check.
COVERED = {
    "solve", "inv", "det", "slogdet", "cholesky", "triangular_solve", "eigh", "svd", "qr",
    "pinv", "masked_svd", "safe_inverse", "spectral_sum", "spectral_map",
}  # fmt: skip
# Cases whose derivatives are also checked compiled (the others run the reference).
FUSED_DERIVATIVES = {"solve", "cholesky", "eigh", "svd_tall", "qr_wide", "pinv_tall", "norm_2_0"}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_match_numpy_and_scipy(name, dtype):
    fun, reference, args = CASES[name]
    if reference is None:
        return  # a function of the decomposition for derivatives; values are tested below
    args = tuple(np.asarray(a, dtype) for a in args)
    check_values(fun, reference, args, dtype, 2e-4 if dtype == np.float32 else 1e-10, fused=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_derivatives_orders_1_and_2(name):
    fun, _, args = CASES[name]
    check_derivatives(fun, args, fused=name in FUSED_DERIVATIVES)


@pytest.mark.parametrize("name", ["solve", "cholesky", "eigh", "svd_tall", "qr_wide", "pinv_tall"])
def test_float32_gradients_stay_float32(name):
    fun, _, args = CASES[name]
    check_float32_gradients(fun, args)


def test_decompositions_reconstruct_their_input():
    for dtype in (np.float32, np.float64):
        sym, tall = SYM.astype(dtype), TALL.astype(dtype)
        w, v = fg.jit(la.eigh)(sym)
        np.testing.assert_allclose((v * w[..., None, :]) @ np.swapaxes(v, -1, -2), sym, atol=1e-5)
        u, s, vh = fg.jit(lambda a: la.svd(a, full_matrices=False))(tall)
        np.testing.assert_allclose((u * s[..., None, :]) @ vh, tall, atol=1e-5)
        assert isinstance(la.eigh(sym), la.EighResult) and u.dtype == dtype
        q, r = la.qr(tall)
        np.testing.assert_allclose(q @ r, tall, atol=1e-5)


# ---------------------------------------------------------------- hypothesis: shapes


@st.composite
def batched(draw, square=True):
    """A batch shape (each axis 0 to 2 long) and a matrix shape (sides 0 to 3)."""
    batch = tuple(draw(st.lists(st.integers(0, 2), max_size=2)))
    n = draw(st.integers(0, 3))
    m = n if square else draw(st.integers(0, 4))
    return batch, m, n


@given(batched())
def test_square_functions_on_random_batch_shapes(shapes):
    batch, _, n = shapes
    a, s, sym = general(*batch, n, n), spd(*batch, n, n), symmetric(*batch, n, n)
    b = rng.standard_normal(batch + (n, 2))
    funcs = [
        (la.solve, np.linalg.solve, (a, b)),
        (la.inv, np.linalg.inv, (a,)),
        (la.det, np.linalg.det, (a,)),
        (lambda a: la.slogdet(a)[1], lambda a: np.linalg.slogdet(a)[1], (a,)),
        (la.cholesky, np.linalg.cholesky, (s,)),
        (la.eigvalsh, np.linalg.eigvalsh, (sym,)),
        (lambda a: sq(la.eigh(a)[1]), lambda a: sq(np.linalg.eigh(a)[1]), (sym,)),
    ]
    for fun, reference, args in funcs:
        check_values(fun, reference, args, np.float64)
        check_grads(fun, args, modes=("fwd", "rev"))


@given(batched(square=False))
def test_rectangular_functions_on_random_batch_shapes(shapes):
    batch, m, n = shapes
    a = separated(*batch, m, n) if m and n else np.zeros(batch + (m, n))
    funcs = [
        (la.svdvals, lambda a: np.linalg.svd(a, compute_uv=False), (a,)),
        (lambda a: la.qr(a).R, lambda a: np.linalg.qr(a).R, (a,)),
        (la.pinv, np.linalg.pinv, (a,)),
        (lambda a: la.norm(a, "fro", (-2, -1)), lambda a: np.linalg.norm(a, "fro", (-2, -1)), (a,)),
    ]
    for fun, reference, args in funcs:
        check_values(fun, reference, args, np.float64)
        if m and n:  # at a zero matrix the rank (and with it the derivative) jumps
            check_grads(fun, args, modes=("fwd", "rev"))


def scipy_triangular(a, b, trans, lower):
    # SciPy does not take empty batches.
    return scipy.linalg.solve_triangular(a, b, trans, lower) if a.size else np.zeros(b.shape)


@given(st.integers(1, 3), st.integers(0, 3), st.lists(st.integers(0, 2), max_size=2))
def test_triangular_and_cholesky_solves_on_random_shapes(n, k, batch):
    a, s = general(*batch, n, n), spd(*batch, n, n)
    b = rng.standard_normal(tuple(batch) + (n, k))
    for lower in (True, False):
        for trans in (0, 1):
            check_values(
                lambda a, b, t=trans, lo=lower: fsl.solve_triangular(a, b, t, lo),
                lambda a, b, t=trans, lo=lower: scipy_triangular(a, b, t, lo),
                (a, b),
                np.float64,
            )
    fun = lambda s, b: fsl.cho_solve(fsl.cho_factor(s), b)  # noqa: E731
    check_values(fun, lambda s, b: np.linalg.solve(s, b), (s, b), np.float64, 1e-9)
    check_grads(fun, (s, b), modes=("fwd", "rev"))


# ---------------------------------------------------------------- conventions and errors


def test_singular_matrices_give_numpys_result_or_error():
    singular = np.array([[1.0, 2.0], [2.0, 4.0]])
    assert fg.jit(la.det)(singular) == np.linalg.det(singular) == 0
    sign, logdet = fg.jit(la.slogdet)(singular)
    assert sign == 0 and logdet == -np.inf
    # det's gradient there is the cofactor matrix (docs/conventions.md)
    np.testing.assert_allclose(fg.grad(la.det)(singular), [[4.0, -2.0], [-2.0, 1.0]])
    for fun in (la.inv, lambda a: la.solve(a, np.ones(2))):
        with pytest.raises(np.linalg.LinAlgError):
            fun(singular)
        with pytest.raises(np.linalg.LinAlgError):
            fg.jit(fun)(singular)
    with pytest.raises(np.linalg.LinAlgError):
        fg.jit(la.cholesky)(-np.eye(2))
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        fsl.solve_triangular(np.zeros((2, 2)), np.ones(2))


def _cofactors_by_minors(a: np.ndarray) -> np.ndarray:
    n = a.shape[-1]
    minor = lambda i, j: np.delete(np.delete(a, i, 0), j, 1)  # noqa: E731
    return np.array([[(-1) ** (i + j) * np.linalg.det(minor(i, j)) for j in range(n)]
                     for i in range(n)])  # fmt: skip


def test_det_gradient_in_a_stack_of_singular_and_regular_matrices():
    # The SVD runs for the near-singular matrix of the stack only (masked_svd); each
    # matrix's gradient is its cofactor matrix (minors: no code shared), and the second
    # derivative of the singular one (distinct singular values) matches finite differences
    # of the minors, which are polynomials.
    rank2 = np.array([[1.0, 2.0, 3.0], [2.0, -1.0, 0.5], [3.0, 1.0, 3.5]])
    stack = np.stack([A[0], rank2, A[1] * 1e-3, np.zeros((3, 3))])
    f = lambda a: fnp.sum(la.det(a) * np.array([1.0, 2.0, -1.0, 0.5]))  # noqa: E731
    want = np.stack(
        [w * _cofactors_by_minors(m) for w, m in zip([1, 2, -1, 0.5], stack, strict=True)]
    )
    for grad in (fg.grad(f), fg.jit(fg.grad(f))):
        np.testing.assert_allclose(grad(stack), want, rtol=1e-12, atol=1e-12)
    e = rng.standard_normal(stack.shape)
    h = 1e-4
    fd = (_cofactors_by_minors(rank2 + h * e[1]) - _cofactors_by_minors(rank2 - h * e[1])) / (2 * h)
    for hvp in (fg.jvp(fg.grad(f), (stack,), (e,))[1],
                fg.jit(lambda a, t: fg.jvp(fg.grad(f), (a,), (t,))[1])(stack, e)):  # fmt: skip
        np.testing.assert_allclose(hvp[1], 2 * fd, rtol=1e-8, atol=1e-8)
    # A matrix with a nan entry: a nan gradient, the others' as they were.
    bad = stack.copy()
    bad[2, 0, 0] = np.nan
    g = fg.grad(f)(bad)
    assert np.isnan(g[2]).all()
    np.testing.assert_allclose(g[[0, 1, 3]], want[[0, 1, 3]], rtol=1e-12, atol=1e-12)
    # vmap over the stack: the same rule per matrix.
    np.testing.assert_allclose(fg.vmap(fg.grad(la.det))(stack[:2]), want[:2] / [[[1]], [[2]]])


def test_one_triangle_is_read_and_gets_the_gradient():
    s = S[0] + np.triu(np.ones((3, 3)), 1)  # garbage above the diagonal
    np.testing.assert_allclose(la.cholesky(s), np.linalg.cholesky(s))
    g = fg.grad(lambda a: fnp.sum(la.cholesky(a)))(s)
    np.testing.assert_array_equal(np.triu(g, 1), 0)
    g = fg.grad(lambda a: fnp.sum(la.eigvalsh(a, UPLO="U") ** 2))(s)
    np.testing.assert_array_equal(np.tril(g, -1), 0)
    g = fg.grad(lambda a: fnp.sum(fsl.solve_triangular(a, np.ones(3), lower=True)))(s)
    np.testing.assert_array_equal(np.triu(g, 1), 0)


def test_degenerate_eigenvalues():
    # Eigenvalue derivatives stay exact at a repeated eigenvalue; eigenvector ones are NaN.
    eye = np.eye(3)
    g = fg.grad(lambda a: fnp.sum(la.eigh(a)[0] ** 2))(eye)
    np.testing.assert_allclose(g, 2 * eye)
    np.testing.assert_allclose(fg.grad(lambda a: fnp.sum(la.eigvalsh(a)))(eye), eye)
    g = fg.grad(lambda a: fnp.sum(la.eigh(a)[1][0]))(eye)
    assert np.isnan(g).any()
    np.testing.assert_allclose(fg.grad(lambda a: fnp.sum(la.svdvals(a)))(eye), eye)


def test_norm_gradient_at_zero_is_zero():
    np.testing.assert_array_equal(fg.grad(la.norm)(np.zeros(3)), np.zeros(3))


def test_lstsq_matches_numpy_where_numpy_gives_residuals():
    a, b = TALL[0], rng.standard_normal((4, 2))
    x, res, rank, s = fg.jit(la.lstsq)(a, b)
    nx, nres, nrank, ns = np.linalg.lstsq(a, b)
    np.testing.assert_allclose(x, nx, rtol=1e-10)
    np.testing.assert_allclose(res, nres, rtol=1e-10)
    assert rank == nrank and np.allclose(s, ns)
    # Rank-deficient: the minimum-norm solution; residuals are computed all the same.
    deficient = np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    x, res, rank, _ = la.lstsq(deficient, np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(x, np.linalg.lstsq(deficient, np.array([1.0, 2.0, 3.0]))[0])
    assert rank == 1 and res.shape == (1,)
    assert int(la.matrix_rank(deficient)) == 1


def test_integer_inputs_compute_in_float64():
    a = np.array([[2, 1], [1, 3]])
    assert la.det(a).dtype == np.float64
    np.testing.assert_allclose(fg.jit(la.inv)(a), np.linalg.inv(a))
    assert la.matrix_power(a, 2).dtype == a.dtype


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"solve: a must hold square matrices .* \(2, 3\)"):
        la.solve(np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="b's length must be 3"):
        la.solve(np.eye(3), np.ones(2))
    with pytest.raises(ValueError, match="full_matrices=False"):
        fg.jit(la.svd)(np.ones((3, 2)))
    with pytest.raises(ValueError, match="mode 'complete' is not supported"):
        la.qr(np.ones((3, 2)), mode="complete")
    with pytest.raises(ValueError, match="UPLO must be 'L' or 'U'"):
        la.eigh(np.eye(2), UPLO="X")
    with pytest.raises(TypeError, match="unsupported dtype complex128"):
        la.inv(np.eye(2, dtype=np.complex128))
    with pytest.raises(ValueError, match="trans must be"):
        fsl.solve_triangular(np.eye(2), np.ones(2), trans=3)
    with pytest.raises(ValueError, match="invalid ord"):
        la.norm(np.ones((2, 2)), ord="bad")
    with pytest.raises(ValueError, match="axis 2 is out of bounds"):
        la.norm(np.ones((2, 2)), axis=2)
    with pytest.raises(TypeError, match="n must be an integer"):
        la.matrix_power(np.eye(2), 1.5)


def test_jitted_linalg_graphs_are_library_calls_between_fused_loops():
    def f(a, b):
        return fnp.sum(fnp.tanh(la.solve(a * 2.0, b)) ** 2)

    lowered = fg.jit(fg.value_and_grad(f)).lower(A[0], B[0])
    text = lowered.explain()
    assert "solve" in text
    value, grad = fg.jit(fg.value_and_grad(f))(A[0], B[0])
    ref_value, ref_grad = fg.jit(fg.value_and_grad(f), fuse=False)(A[0], B[0])
    np.testing.assert_allclose(value, ref_value, rtol=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-12)


def test_large_triangular_solves_take_lapacks_path():
    n = la_module.SMALL_TRIANGULAR + 6
    a, b = general(2, n, n), rng.standard_normal((2, n, 3))
    for lower, trans, unit in [(True, 0, False), (False, 1, True)]:
        options = (trans, lower, unit)
        check_values(
            lambda a, b, o=options: fsl.solve_triangular(a, b, *o),
            lambda a, b, o=options: scipy.linalg.solve_triangular(a, b, *o),
            (a, b),
            np.float64,
        )
    check_grads(lambda a, b: fsl.solve_triangular(a, b, lower=True), (a, b), modes=("fwd", "rev"))


def test_scipy_conventions():
    s = S[0]
    np.testing.assert_allclose(fsl.cholesky(s), scipy.linalg.cholesky(s), rtol=1e-12)
    np.testing.assert_allclose(fsl.cholesky(s, lower=True), np.linalg.cholesky(s), rtol=1e-12)
    w, v = fsl.eigh(SYM[0], lower=False)
    np.testing.assert_allclose(w, scipy.linalg.eigh(SYM[0], lower=False)[0], rtol=1e-12)
    np.testing.assert_allclose(fsl.eigh(SYM[0], eigvals_only=True), w, rtol=1e-12)
    check_grads(lambda a: fsl.cholesky(a), (s,), order=2, modes=("fwd", "rev"))
    g = fg.grad(lambda a: fnp.sum(fsl.cholesky(a)))(s + np.tril(np.ones((3, 3)), -1))
    np.testing.assert_array_equal(np.tril(g, -1), 0)  # the upper triangle is read
    with pytest.raises(NotImplementedError, match="only the standard problem"):
        fsl.eigh(SYM[0], np.eye(3))


def test_numpy_linalg_on_traced_values_calls_fastgrads():
    a, b = A[0], B[0]
    f = lambda a, b: np.linalg.norm(np.linalg.solve(a, b)) + np.linalg.slogdet(a)[1]  # noqa: E731
    np.testing.assert_allclose(fg.jit(f)(a, b), f(a, b), rtol=1e-12)
    check_grads(f, (a, b), modes=("fwd", "rev"))
    with pytest.raises(fg.TracerError, match="no numpy.linalg.eig yet"):
        fg.jit(np.linalg.eig)(a)


def test_spectral_sum_edges_and_errors():
    """0 x 0 and 1 x 1 matrices; a bad fn or a non-square matrix names the argument."""
    la_sum = fnp.linalg.spectral_sum
    assert la_sum(np.zeros((0, 0)), "exp") == 0.0
    assert fg.hessian(lambda m: la_sum(m, "exp"))(np.zeros((0, 0))).shape == (0, 0, 0, 0)
    np.testing.assert_allclose(fg.hessian(lambda m: la_sum(m, "log"))(np.full((1, 1), 2.0)),
                               np.full((1, 1, 1, 1), -0.25))  # fmt: skip
    for call in (lambda m: la_sum(m, "sin"), fg.jit(lambda m: la_sum(m, "sin"))):
        with pytest.raises(ValueError, match="spectral_sum: fn must be one of"):
            call(np.eye(2))
    with pytest.raises(ValueError, match="spectral_sum: a must hold square matrices"):
        la_sum(np.ones((2, 3)), "exp")
