"""Loops reducing a short last axis run in blocks of rows (codegen.rowblocks): against the
reference interpreter, forward and backward, with NaN and infinities, partial blocks, rows
of one element and outputs of row values that keep their axis."""

import re

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from oracle import fused_matches_reference, kernel_sources


def _blocked(f, *args):
    return any("for rb in range" in source for source in kernel_sources(f, *args))


_LENGTH = re.compile(r"^ *n\d+ = np\.uint64\(\d+\)$", re.MULTILINE)  # a length written in


def _forms(f, *args):
    """The form of each kernel of f's plan that reduces a short last axis: "blocks" (of
    rows), "rows" (one at a time, the short lengths in the source) or "plain"."""
    return [
        "blocks" if "for rb in range" in s else "rows" if _LENGTH.search(s) else "plain"
        for s in kernel_sources(f, *args)
    ]


def mixture_like(z, w):
    """A logsumexp over the short axis (M4's), its gradient, a softmax and extrema."""
    s = z + w
    lse = fnp.logsumexp(s, axis=-1)
    p = fnp.exp(s - fnp.max(s, axis=-1, keepdims=True))
    return fnp.sum(lse), p / fnp.sum(p, axis=-1, keepdims=True), fnp.min(s * s, axis=1)


@settings(max_examples=5, deadline=None)
@given(
    rows=st.sampled_from([1, 3, 64, 65, 130]),
    width=st.sampled_from([1, 2, 8, 15]),
    dtype=st.sampled_from([np.float32, np.float64]),
    special=st.sampled_from([None, np.nan, np.inf, -np.inf]),
    seed=st.integers(0, 2**32 - 1),
)
def test_short_rows_match_reference(rows, width, dtype, special, seed):
    draw = np.random.default_rng(seed)
    z = draw.uniform(-3, 3, (rows, width)).astype(dtype)
    w = draw.uniform(-1, 1, width).astype(dtype)
    if special is not None:
        z[draw.integers(rows), draw.integers(width)] = special

    def f(z, w):
        value, grads = fg.value_and_grad(lambda z, w: mixture_like(z, w)[0], argnums=(0, 1))(z, w)
        return value, grads, mixture_like(z, w)[1:]

    tol = 1e-5 if dtype == np.float32 else 1e-12
    fused_matches_reference(f, (z, w), tol, tol * rows)
    # Float64's one-pass reductions run one row at a time (test_one_pass_short_rows).
    forms = set(_forms(f, z, w))
    assert "blocks" in forms if dtype == np.float32 else forms & {"blocks", "rows"}


def test_long_rows_keep_the_row_form():
    z, w = np.ones((4, 16)), np.ones(16)
    assert not _blocked(lambda z, w: mixture_like(z, w), z, w)


def _merged(f, *args):
    """Whether a kernel of the plan runs over merged axes (codegen.merge)."""
    return any("def kernel(s0" in source for source in kernel_sources(f, *args))


def _lse_and_softmax(z, w):
    s = z + w
    return fnp.sum(fnp.logsumexp(s, axis=-1)), fnp.logsumexp(s, axis=0), fnp.logsumexp(s)


def _spreads(z, w):
    """Two-pass reductions that have an identity (for arrays with no elements)."""
    d = z * w - fnp.sum(z, axis=-1, keepdims=True)
    return fnp.sum(d * d), fnp.sum(fnp.exp(d), axis=0), fnp.sum(d * d, axis=-1)


@settings(max_examples=6, deadline=None)
@given(
    shape=st.sampled_from([(3, 5, 2), (1, 8, 2), (70, 1, 3), (2, 3, 4, 2), (0, 8, 2), (4, 0, 2)]),
    bias=st.sampled_from(["row", "last", "none", "lead"]),
    view=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
@example(shape=(0, 8, 2), bias="lead", view=True, dtype=np.float64, seed=1)
@example(shape=(4, 0, 2), bias="last", view=False, dtype=np.float32, seed=2)
@example(shape=(70, 8, 2), bias="row", view=True, dtype=np.float32, seed=3)
def test_leading_axes_merge_match_reference(shape, bias, view, dtype, seed):
    """Loops over 3-D and 4-D shapes (axes of size 1 and 0 too) with operands broadcast
    along whole runs of axes or part of one (which keep the nested form), inputs that are
    transposed views (copied before the reshape), forward and backward."""
    draw = np.random.default_rng(seed)
    z = draw.uniform(-3, 3, shape).astype(dtype)
    if view:
        z = np.ascontiguousarray(np.swapaxes(z, 0, -1)).swapaxes(0, -1)
    w = {
        "row": draw.uniform(-1, 1, shape[-1]),
        "last": draw.uniform(-1, 1, (*shape[:-1], 1)),
        "none": np.zeros(()),
        "lead": draw.uniform(-1, 1, (1, *shape[1:])),
    }[bias].astype(dtype)

    g = _lse_and_softmax if z.size else _spreads

    def f(z, w):
        grads = fg.grad(lambda z, w: g(z, w)[0], argnums=(0, 1))(z, w)
        return grads, g(z, w)

    tol = 1e-5 if dtype == np.float32 else 1e-12
    fused_matches_reference(f, (z, w), tol, tol * max(1, z.size))


def test_mixture_shape_runs_merged_and_blocked():
    z, w = np.ones((70, 8, 2), np.float32), np.ones(2, np.float32)
    lse = lambda z, w: fnp.logsumexp(z + w, axis=-1)  # noqa: E731
    assert _merged(lse, z, w) and _blocked(lse, z, w)
    # One pass over a short last axis too (blocks of rows of 2, their length in the source).
    one_pass = lambda z, w: fnp.sum(z * w, axis=-1)  # noqa: E731
    assert _merged(one_pass, z, w) and _blocked(one_pass, z, w)
    # A broadcast along part of a run of kept axes: the strides do not merge; blocks of
    # the first axis, the others looped around them (M4's x[:, None, :] - means).
    assert not _merged(lse, z, np.ones((8, 1), np.float32))
    assert _blocked(lse, z, np.ones((8, 1), np.float32))


def _components(x, means, scales, weights):
    """M4's (N, K, D) loop: x broadcast along K, parameters along N, a short last axis."""
    z = (x[:, None, :] - means) * scales
    c = fnp.sum(z * z, axis=-1) + weights
    return fnp.sum(fnp.logsumexp(c, axis=-1)), c, fnp.max(z, axis=-1, keepdims=True)


@settings(max_examples=8, deadline=None)
@given(
    n=st.sampled_from([1, 3, 64, 130]),
    k=st.sampled_from([1, 2, 8, 17]),
    d=st.sampled_from([1, 2, 5]),
    view=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
@example(n=130, k=8, d=2, view=True, dtype=np.float32, seed=0)
def test_blocks_of_the_first_axis_match_reference(n, k, d, view, dtype, seed):
    """3-D loops whose operands do not merge (broadcast along part of the kept axes) run
    in blocks of the first axis (rowblocks._blocked): values and gradients against the
    reference interpreter and NumPy, over short and long middle axes, size-1 axes, a
    non-contiguous x, keepdims outputs, partial blocks."""
    draw = np.random.default_rng(seed)
    x = draw.uniform(-3, 3, (d, n) if view else (n, d)).astype(dtype)
    x = x.T if view else x
    means, scales = (draw.uniform(-1, 1, (k, d)).astype(dtype) for _ in range(2))
    weights = draw.uniform(-1, 1, k).astype(dtype)
    args = (x, means, scales, weights)

    def f(*args):
        grads = fg.grad(lambda *a: _components(*a)[0], argnums=(0, 1, 2, 3))(*args)
        return grads, _components(*args)

    one_pass = _forms(lambda *a: _components(*a)[1], *args)
    assert n == 1 or one_pass == ["blocks" if dtype == np.float32 else "rows"]
    tol = 2e-5 if dtype == np.float32 else 1e-12
    fused = fused_matches_reference(f, args, tol, tol * n)
    z = (x[:, None, :].astype(np.float64) - means) * scales
    np.testing.assert_allclose(fused[-2], (z * z).sum(-1) + weights, rtol=tol, atol=tol)


_ONE_PASS = {  # fastgrad's and NumPy's, on z of the loop's shape
    "sum": (lambda z, k: fnp.sum(z, axis=-1, keepdims=k), lambda z, k: z.sum(-1, keepdims=k)),
    "max": (lambda z, k: fnp.max(z, axis=-1, keepdims=k), lambda z, k: z.max(-1, keepdims=k)),
    "min": (lambda z, k: fnp.min(z, axis=-1, keepdims=k), lambda z, k: z.min(-1, keepdims=k)),
    "mean(z*z)": (
        lambda z, k: fnp.mean(z * z, axis=-1, keepdims=k),
        lambda z, k: (z * z).mean(-1, keepdims=k),
    ),
    "sum*2+1": (
        lambda z, k: fnp.sum(z, axis=-1, keepdims=k) * 2.0 + 1.0,
        lambda z, k: z.sum(-1, keepdims=k) * 2.0 + 1.0,
    ),
}


@settings(max_examples=10, deadline=None)
@given(
    rows=st.sampled_from([0, 1, 63, 65]),
    length=st.sampled_from([1, 2, 7, 8]),
    kind=st.sampled_from(["2-D", "merged", "M4"]),
    op=st.sampled_from(sorted(_ONE_PASS)),
    keepdims=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    special=st.sampled_from([None, np.nan, np.inf, -np.inf]),
    seed=st.integers(0, 2**32 - 1),
)
@example(rows=65, length=8, kind="2-D", op="sum", keepdims=False, dtype=np.float64,
         special=None, seed=0)  # fmt: skip
@example(rows=63, length=2, kind="M4", op="max", keepdims=True, dtype=np.float64,
         special=np.nan, seed=1)  # fmt: skip
@example(rows=65, length=7, kind="merged", op="mean(z*z)", keepdims=False, dtype=np.float32,
         special=np.inf, seed=2)  # fmt: skip
def test_one_pass_short_rows(rows, length, kind, op, keepdims, dtype, special, seed):
    """One-pass reductions over a short last axis: float64's run one row at a time with
    the short lengths written into the source (rowblocks.row_blocks), float32's in
    blocks of rows. Values against NumPy, values and gradients against the reference
    interpreter, over 2-D loops, 3-D ones that merge and M4's that do not (x[:, None, :]),
    partial blocks, rows of one element, no rows, NaN and infinities."""
    ours, theirs = _ONE_PASS[op]
    draw = np.random.default_rng(seed)
    x = draw.uniform(-3, 3, (rows, 3, length) if kind == "merged" else (rows, length))
    w = draw.uniform(0.5, 1.5, (3, length) if kind == "M4" else length)
    if special is not None and x.size:
        x.flat[draw.integers(x.size)] = special
    x, w = x.astype(dtype), w.astype(dtype)
    lift = (lambda x: x[:, None, :]) if kind == "M4" else (lambda x: x)
    f = lambda x, w: ours(lift(x) * w, keepdims)  # noqa: E731

    def both(x, w):
        return f(x, w), fg.grad(lambda x, w: fnp.sum(f(x, w)), argnums=(0, 1))(x, w)

    tol = 2e-5 if dtype == np.float32 else 1e-12
    fused = fused_matches_reference(both, (x, w), tol, tol * length)
    wide = lift(x.astype(np.float64)) * w.astype(np.float64)
    np.testing.assert_allclose(fused[0], theirs(wide, keepdims), rtol=tol, atol=tol * length)
    if rows > 1 and length > 1:
        forms = _forms(f, x, w)
        assert forms.count("rows" if dtype == np.float64 else "blocks") == 1, forms


def _softmax_rows(z, w):
    """A softmax over the short axis: its last pass only writes (p / the row's sum)."""
    s = z * w
    p = fnp.exp(s - fnp.max(s, axis=-1, keepdims=True))
    return p / fnp.sum(p, axis=-1, keepdims=True)


@settings(max_examples=4, deadline=None)
@given(
    rows=st.sampled_from([1, 5, 64, 67, 131]),
    width=st.sampled_from([3, 8]),
    strided=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]),
    special=st.sampled_from([None, np.nan, np.inf, -np.inf]),
    seed=st.integers(0, 2**32 - 1),
)
@example(rows=67, width=8, strided=True, dtype=np.float32, special=np.inf, seed=0)
@example(rows=5, width=3, strided=False, dtype=np.float64, special=np.nan, seed=1)
def test_passes_row_after_row(rows, width, strided, dtype, special, seed):
    """A block's passes that reduce per row keep each row's accumulator in a register
    (racc), and its last pass, where it only writes, writes its outputs where they
    belong, row after row, not into the block to be copied out: values against NumPy and
    the reference interpreter over partial blocks, widths that are no multiple of a
    vector's lanes, a strided input, NaN and infinities."""
    draw = np.random.default_rng(seed)
    z = draw.uniform(-3, 3, (rows, 2 * width if strided else width)).astype(dtype)
    z = z[:, ::2] if strided else z
    if special is not None:
        z[draw.integers(rows), draw.integers(width)] = special
    w = draw.uniform(0.5, 1.5, width).astype(dtype)
    tol = 2e-6 if dtype == np.float32 else 1e-14
    fused = fused_matches_reference(_softmax_rows, (z, w), tol, tol)
    s = z.astype(np.float64) * w
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(fused[0], p / p.sum(-1, keepdims=True), rtol=tol, atol=tol)
    sources = [s for s in kernel_sources(_softmax_rows, z, w) if "for rb in range" in s]
    if rows > 1 and (dtype == np.float32 or width > 1):
        assert sources and all(
            re.search(r"^ +o0f?\[\(?rb \+ r.* = v\d+$", s, re.M) for s in sources
        )
        assert all(s.count("racc") >= 6 for s in sources)  # max's and sum's: 3 lines each
