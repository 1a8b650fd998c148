"""A row block's passes laid out (codegen.rowpasses): adjacent passes over the rows merged
where they may be, stores no later pass reads dropped; on written lines, and against NumPy
and the reference interpreter for M4's sum over a short last axis."""

import re

import numpy as np
import pytest

import fastgrad.numpy as fnp
from fastgrad.compiler.codegen.rowpasses import Tag, lay_out
from oracle import fused_matches_reference, kernel_sources

_AT = "b[np.uint64(0) + r]"


def _lay(*lines):
    """lay_out over (line, tag or None) pairs, indented as a kernel's body."""
    text = [line for line, _ in lines]
    return lay_out(text, {i: t for i, (_, t) in enumerate(lines) if t is not None}, 0)


def _reduce_then_rows(second_body):
    """A pass reducing row r's short axis into racc1, the pass taking it, and `second_body`
    (another pass's lines after its head)."""
    return [
        ("for r in range(nr):", Tag("head")),
        ("    i0 = rb + r", Tag("row")),
        ("    racc1 = f32(0)", None),
        ("    for i1 in range(n1):", None),
        ("        racc1 = radd(racc1, a0[i0, i1])", None),
        (f"    {_AT} = racc1", Tag("acc", 1, 4)),
        ("for r in range(nr):", Tag("head")),
        ("    i0 = rb + r", Tag("row")),
        (f"    v1 = {_AT}", Tag("load", 1, 4, _AT)),
        ("    b[np.uint64(64) + r] = v1", Tag("store", 1, 4)),
        ("for r in range(nr):", Tag("head")),
        ("    i0 = rb + r", Tag("row")),
        ("    v1 = b[np.uint64(64) + r]", Tag("read", 1, 4)),
        *second_body,
    ]


def test_adjacent_passes_merge_and_dead_stores_go():
    out = _lay(
        *_reduce_then_rows(
            [
                ("    v2 = (v1 * k0)", None),
                ("    b[np.uint64(128) + r] = v2", Tag("store", 2, 4)),
                ("    o0[i0] = v2", None),
            ]
        )
    )
    assert out.count("for r in range(nr):") == 1
    assert "    v1 = racc1" in out  # handed over in its register
    assert not any(line.lstrip().startswith("b[") for line in out)  # no store read later
    assert out.index("    o0[i0] = v2") > out.index("    v2 = (v1 * k0)")


def test_a_store_read_by_a_later_pass_stays():
    out = _lay(
        *_reduce_then_rows([("    for i1 in range(n1):", None), ("        o0[i0, i1] = v1", None)])
    )
    # The pass with a loop of its own is not merged: v1 stays stored for it and read back.
    assert out.count("for r in range(nr):") == 2
    assert "    b[np.uint64(64) + r] = v1" in out and "    v1 = b[np.uint64(64) + r]" in out


@pytest.mark.parametrize(
    "line, size", [("    o0[i0] = exp_f32(v1)", 4), ("    o0[i0] = f32(v9)", 8)]
)
def test_no_merge_over_vector_math_or_wider_values(line, size):
    body = [("    v9 = b64[np.uint64(0) + r]", Tag("read", 9, size)), (line, None)]
    out = _lay(*_reduce_then_rows(body))
    assert out.count("for r in range(nr):") == 2


def _mixture_terms(x, mu, s):
    """M4's squared distances summed over the short last axis of (N, 8, 2), then used."""
    z = (x[:, None, :] - mu) * s
    return fnp.sum(fnp.sum(z * z, axis=-1) * 0.5 - fnp.log(s[:, 0]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows, strided, special", [(67, True, np.inf), (5, False, np.nan)])
def test_short_sum_passes_match_reference(dtype, rows, strided, special):
    """Against the reference interpreter (value and gradients) and NumPy, over a partial
    block, fewer rows than a block, a strided input, NaN and infinities; float32's block
    runs its reduction and the values after it in one pass over the rows."""
    draw = np.random.default_rng(rows)
    x = draw.normal(size=(rows, 4 if strided else 2)).astype(dtype)
    x = x[:, ::2] if strided else x
    x[draw.integers(rows), 1] = special
    mu = draw.normal(size=(8, 2)).astype(dtype)
    s = draw.uniform(0.5, 1.5, (8, 2)).astype(dtype)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    fused = fused_matches_reference(_mixture_terms, (x, mu, s), tol, tol)
    xs, mus, ss = (a.astype(np.float64) for a in (x, mu, s))
    z = (xs[:, None, :] - mus) * ss
    want = np.sum((z * z).sum(-1) * 0.5 - np.log(ss[:, 0]))
    np.testing.assert_allclose(fused[0], want, rtol=tol)
    if dtype == np.float32 and rows > 1:
        blocks = [t for t in kernel_sources(_mixture_terms, x, mu, s) if "for rb in" in t]
        passes = [re.findall(r"^( +)for r in range\(nr\):$", t, re.M) for t in blocks]
        assert blocks and all(len(p) <= 3 for p in passes)  # copy in, one pass, copy out
