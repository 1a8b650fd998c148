"""Scans whose body reads a closed-over weight transposed (`w.T @ h`, `h @ w.T`) or not,
either side of the product, one hidden state or a batch of them: under value_and_grad
both scans (the forward one and its VJP's) run as LOOPs with the step runner's and the
Python loop's bits (tests/test_scan_call.py's _four_ways), and the unrolled loop on the
reference interpreter agrees within rounding. Before runtime.loop_hoisting folded
`w.T.T` and summed the transposed weight gradient after the loop, every `w.T` case's
backward scan ran its Python loop (a kernel read a transposed view: a host step); with
`w.T` taken before the scan both did, until LoopStep copied such consts before the loop.
28 cases, ~3.5 s warm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from test_runtime_loop_table import _flat, runtime  # noqa: F401  (its fixture: sync compiles)
from test_scan_call import TOL, _along, _four_ways


def _rnn(transposed: str, left: bool, scan: bool) -> Callable[..., Any]:
    """sum(h_T ** 2) for h_{t+1} = tanh(W @ h_t + x_t) (`left`) or tanh(h_t @ W + x_t),
    W = w, or w.T taken in the body ("inside") or before the scan ("outside": the body's
    const is a transposed view); with `scan` a scan, else unrolled in Python."""

    def cell(h: Any, x: Any, w: Any) -> Any:
        m = w.T if transposed == "inside" else w
        return fnp.tanh((m @ h if left else h @ m) + x)

    def loss(w: Any, h: Any, xs: Any) -> Any:
        w = w.T if transposed == "outside" else w
        if scan:
            h, _ = fg.scan(lambda h, x: (cell(h, x, w), h), h, xs)
        else:
            for t in range(xs.shape[0]):
                h = cell(h, xs[t], w)
        return fnp.sum(h * h)

    return loss


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("transposed", ["no", "inside", "outside"])
def test_both_scans_run_as_loops(transposed, left, batched, dtype):
    rng = np.random.default_rng(3)
    hidden, steps = 5, 4
    w = (rng.standard_normal((hidden, hidden)) * 0.4).astype(dtype)
    state = ((hidden, 2) if left else (2, hidden)) if batched else (hidden,)
    h0 = rng.standard_normal(state).astype(dtype)
    xs = rng.standard_normal((steps, *state)).astype(dtype)
    f = fg.value_and_grad(_rnn(transposed, left, True), argnums=(0, 1))
    got, scans = _four_ways(f, (w, h0, xs))
    assert len(scans) == 2  # the forward scan and its VJP's, each a LOOP
    unrolled = fg.value_and_grad(_rnn(transposed, left, False), argnums=(0, 1))
    want = _flat(fg.jit(unrolled, fuse=False)(w, h0, xs))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("left", [False, True])
def test_the_gradient_of_a_gradient_through_w_t(left, dtype):
    """Its scans (the VJP of a VJP reads transposes of transposes again) give the other
    runners' bits, and the unrolled reference's value within rounding."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((4, 4)) * 0.4).astype(dtype)
    h0 = rng.standard_normal((4, 2) if left else (2, 4)).astype(dtype)
    xs = rng.standard_normal((3, *h0.shape)).astype(dtype)
    v = rng.standard_normal((4, 4)).astype(dtype)
    f, unrolled = (_along(_rnn("inside", left, scan), v) for scan in (True, False))
    got, _ = _four_ways(fg.value_and_grad(f, argnums=(0, 1)), (w, h0, xs), every=False)
    want = _flat(fg.jit(fg.value_and_grad(unrolled, argnums=(0, 1)), fuse=False)(w, h0, xs))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_body_output_that_undoes_two_transposes(dtype):
    """`y = w.T.T` kept as a body output folds to an identity transpose of `w`; a product
    `(y @ h).T` read nowhere else then became `h.T @ w.T`'s mirror `h.T @ w` (the fold
    took any transpose for a (1, 0) one): wrong by ~1 against the unrolled loop."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 4)).astype(dtype)  # not symmetric
    h0 = rng.standard_normal((4, 1)).astype(dtype)
    xs = rng.standard_normal((3, 4, 1)).astype(dtype)

    def body(h: Any, x: Any, w: Any) -> tuple[Any, Any]:
        y = w.T.T
        return fnp.tanh(((y @ h).T).T + x), y

    def loss(w: Any, h: Any, xs: Any) -> Any:
        return fg.scan(lambda h, x: body(h, x, w), h, xs)

    got, _ = _four_ways(loss, (w, h0, xs), every=False)
    h = h0
    for t in range(3):
        h = np.tanh(w @ h + xs[t])
    for a, b in zip(got, _flat((h, np.broadcast_to(w, (3, 4, 4)))), strict=True):
        np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype])
