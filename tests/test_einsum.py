"""einsum on random subscripts (implicit and explicit outputs, repeated labels, ellipses,
size-0 and size-1 axes, broadcasting) and the products built beside it (inner, outer,
cross, kron, tensordot, vdot): values against NumPy, derivatives at orders 1 and 2,
contractions sent to BLAS, the compiled kernels, clear errors."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from numpy_check import check_case, shapes, table_tests, values


@st.composite
def einsum_problems(draw):
    """(subscripts, operands): 1 to 3 operands over labels a-d, with repeats, size-1 axes
    that broadcast, an optional ellipsis, and an explicit or implicit output."""
    size = {c: draw(st.integers(0, 3)) for c in "abcd"}
    n = draw(st.integers(1, 3))
    with_ellipsis = draw(st.booleans())
    lead = draw(shapes(max_dims=2, max_side=3)) if with_ellipsis else ()
    terms, operands = [], []
    for _ in range(n):
        labels = "".join(draw(st.lists(st.sampled_from("abcd"), max_size=3)))
        dims = [size[c] if draw(st.integers(0, 4)) else 1 for c in labels]
        for c, d in zip(labels, dims, strict=True):  # a repeated label is one diagonal
            dims = [d if x == c else y for x, y in zip(labels, dims, strict=True)]
        own = lead[draw(st.integers(0, len(lead))) :] if with_ellipsis else ()
        own = tuple(d if draw(st.integers(0, 3)) else 1 for d in own)
        terms.append(("..." if with_ellipsis else "") + labels)
        operands.append(draw(values(own + tuple(dims))))
    used = sorted(set("".join(terms)) - {"."})
    if draw(st.booleans()):
        out = "".join(draw(st.permutations(used))[: draw(st.integers(0, len(used)))])
        spec = ",".join(terms) + "->" + ("..." if with_ellipsis else "") + out
    else:
        spec = ",".join(terms)
    return spec, operands


@given(einsum_problems())
def test_einsum_matches_numpy_with_gradients(problem):
    spec, operands = problem
    check_case(lambda *xs: fnp.einsum(spec, *xs), lambda *xs: np.einsum(spec, *xs), tuple(operands))


def inner(draw):
    a = draw(values(draw(shapes(max_dims=2))))
    b = draw(values(draw(shapes(max_dims=2)) + (a.shape[-1:] if a.ndim else ())))
    return fnp.inner, np.inner, (a, b)


def outer(draw):
    return fnp.outer, np.outer, (draw(values(draw(shapes()))), draw(values(draw(shapes()))))


def vdot(draw):
    shape = draw(shapes())
    return fnp.vdot, np.vdot, (draw(values(shape)), draw(values(shape)))


def kron(draw):
    a, b = draw(values(draw(shapes()))), draw(values(draw(shapes())))
    return fnp.kron, np.kron, (a, b)


def cross(draw):
    lead = draw(shapes(max_dims=2, max_side=3))
    a = draw(values(lead + (3,)))
    b = draw(values(lead[draw(st.integers(0, len(lead))) :] + (3,)))
    return fnp.cross, np.cross, (a, b)


def tensordot(draw):
    a = draw(values(draw(shapes(max_dims=3))))
    k = draw(st.integers(0, a.ndim))
    axes_a = draw(st.permutations(range(a.ndim)))[:k]
    free = draw(shapes(max_dims=2))
    order = draw(st.permutations(range(k + len(free))))  # b's axes: contracted and free, mixed
    dims = [a.shape[i] for i in axes_a] + list(free)
    b = draw(values(tuple(dims[i] for i in order)))
    axes = (axes_a, [order.index(j) for j in range(k)])
    return (lambda a, b: fnp.tensordot(a, b, axes)), (lambda a, b: np.tensordot(a, b, axes)), (a, b)


def tensordot_int(draw):
    k = draw(st.integers(0, 2))
    a = draw(values(draw(shapes(max_dims=2)) + (2, 3)[:k]))
    b = draw(values((2, 3)[:k] + draw(shapes(max_dims=2))))
    return (lambda a, b: fnp.tensordot(a, b, k)), (lambda a, b: np.tensordot(a, b, k)), (a, b)


rng = np.random.default_rng(2)
A, B, C = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((5, 2))
T = rng.standard_normal((2, 3, 4))
FUSED = {
    "einsum_chain": (
        lambda a, b, c: fnp.einsum("ij,jk,kl->il", a, b, c),
        lambda a, b, c: np.einsum("ij,jk,kl->il", a, b, c),
        (A, B, C),
    ),
    "einsum_batch": (
        lambda t, b: fnp.einsum("bij,jk->bki", t, b),
        lambda t, b: np.einsum("bij,jk->bki", t, b),
        (T, B),
    ),
    "einsum_rowdot": (
        lambda a: fnp.einsum("ij,ij->i", a, a) + fnp.einsum("ii", a[:, :3]),
        lambda a: np.einsum("ij,ij->i", a, a) + np.einsum("ii", a[:, :3]),
        (A,),
    ),
    "inner": (fnp.inner, np.inner, (A, T)),
    "outer": (fnp.outer, np.outer, (A[0], B[:, 0])),
    "kron": (fnp.kron, np.kron, (A, C)),
    "cross": (fnp.cross, np.cross, (T[..., :3], A[:, :3])),
    "tensordot": (
        lambda t, a: fnp.tensordot(t, a, ([1, 2], [0, 1])),
        lambda t, a: np.tensordot(t, a, ([1, 2], [0, 1])),
        (T, A),
    ),
    "vdot": (fnp.vdot, np.vdot, (A, A * 2)),
}
test_matches_numpy_with_gradients, test_compiled = table_tests(
    (inner, outer, vdot, kron, cross, tensordot, tensordot_int),
    FUSED,
)


def ops_of(fun, *args):
    return [n.op.name for n in fg.make_graph(fun)(*args).nodes]


def test_contractions_go_to_blas_in_einsum_paths_order():
    x, y, z = np.ones((2, 30)), np.ones((30, 40)), np.ones((40, 3))
    graph = fg.make_graph(lambda x, y, z: fnp.einsum("ij,jk,kl->il", x, y, z))(x, y, z)
    products = [n for n in graph.nodes if n.op.name == "matmul"]
    assert len(products) == 2 and "multiply" not in [n.op.name for n in graph.nodes]
    # NumPy's path contracts y with z first (30x40x3 multiplies, then 2x30x3), not x with
    # y (2x30x40, then 2x40x3).
    assert np.einsum_path("ij,jk,kl->il", x, y, z, optimize="greedy")[0][1] == (1, 2)
    assert products[0].out.aval.shape == (30, 3)


def test_einsum_sublist_form_and_dtype():
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    np.testing.assert_allclose(fnp.einsum(a, [0, 1], b, [1, 2], [0, 2]), a @ b)
    np.testing.assert_allclose(
        fnp.einsum(a, [Ellipsis, 1], [Ellipsis]), np.einsum(a, [Ellipsis, 1], [Ellipsis])
    )
    assert fnp.einsum("ij->", a.astype(np.float32), dtype=np.float64).dtype == np.float64


@pytest.mark.parametrize(
    "spec, shapes, match",
    [
        ("ij,jk", [(2, 3), (4, 5)], "sizes 3 and 4"),
        ("ij", [(2, 3, 4)], "do not fit"),
        ("ij,j", [(2, 3)], "2 operand subscripts"),
        ("ij->ii", [(2, 2)], "more than once"),
        ("ij->k", [(2, 2)], "in no operand"),
        ("i1", [(2, 2)], "not labels"),
        ("ii", [(2, 3)], "equal sizes"),
        ("i->i->i", [(2,)], "more than one"),
    ],
)
def test_einsum_errors(spec, shapes, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fnp.einsum(spec, *(np.ones(s) for s in shapes))


@pytest.mark.parametrize("na, nb", [(2, 2), (2, 3), (3, 2)])
def test_cross_of_2_vectors_is_deprecated_as_in_numpy(na, nb):
    a, b = rng.standard_normal((4, na)), rng.standard_normal((4, nb))
    with pytest.warns(DeprecationWarning):
        expected = np.cross(a, b)
    with pytest.warns(DeprecationWarning, match="2-dimensional vectors"):
        got = fnp.cross(a, b)
    np.testing.assert_allclose(got, expected, rtol=1e-14)
    with pytest.warns(DeprecationWarning):
        check_case(fnp.cross, np.cross, (a, b))


def test_products_errors():
    with pytest.raises(ValueError, match="2 or 3 components"):
        fnp.cross(np.ones(4), np.ones(3))
    with pytest.raises(ValueError, match="do not align"):
        fnp.tensordot(np.ones((2, 3)), np.ones((2, 3)), 1)
