"""Cheap work copied into every later loop that would read it back (fusion's
`_copy_cheap_outputs`): a mixture likelihood's (N, K, D) differences and broadcast scales
are recomputed from x in the forward and the backward loop instead of stored. Oracles:
the reference interpreter and finite differences. Structure: no loop stores an (N, K, D)
array. ~11 s of CPU time (kernel compiles).
"""

import math

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime.executable import _KernelStep

K, D = 4, 2


def mixture_nll(means, log_scales, logits, x):
    z = (x[:, None, :] - means) * fnp.exp(-log_scales)
    log_norm = fnp.sum(log_scales, axis=-1) + 0.5 * D * math.log(2 * math.pi)
    components = -0.5 * fnp.sum(z * z, axis=-1) - log_norm
    return -fnp.mean(fnp.logsumexp(components + logits - fnp.logsumexp(logits), axis=-1))


def inputs(dtype, n=3000):
    rng = np.random.default_rng(5)
    return (
        rng.standard_normal((K, D)).astype(dtype),
        (0.1 * rng.standard_normal((K, D))).astype(dtype),
        (0.1 * rng.standard_normal(K)).astype(dtype),
        (2 * rng.standard_normal((n, D))).astype(dtype),
    )


def _fused_loops_matching_the_interpreter(loss, args, argnums, dtype):
    """The kernel steps of jit(value_and_grad(loss, argnums)), after checking its value and
    gradients against the reference interpreter's (fuse=False)."""
    f = fg.jit(fg.value_and_grad(loss, argnums=argnums))
    value, grads = f(*args)
    ref_value, ref_grads = fg.jit(fg.value_and_grad(loss, argnums=argnums), fuse=False)(*args)
    tol = 2e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(value, ref_value, rtol=tol)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol)
    return [s for s in f.lower(*args).executable.plan if isinstance(s, _KernelStep)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mixture_gradient_stores_no_stack_and_matches_the_interpreter(dtype):
    args = inputs(dtype)
    loops = _fused_loops_matching_the_interpreter(mixture_nll, args, (0, 1, 2), dtype)
    n = args[3].shape[0]
    stored = [v.aval.shape for s in loops for v in s.source.outputs]
    assert (n, K, D) not in stored, stored  # x - means and exp(-log_scales): recomputed
    assert sum(s.loop.shape == (n, K, D) for s in loops) == 2  # forward and backward


def test_copied_work_keeps_second_derivatives():
    args = inputs(np.float64, n=40)
    fg.testing.check_grads(mixture_nll, args, order=2, modes=("rev",))


def test_a_plan_with_copied_work_is_stored_with_its_copies():
    """Fusion's copies are in no graph (a gradient of det through jvp once hit a KeyError in
    the plan cache when the two met): the plan codec stores each loop's own nodes, so the
    plan comes back with the same loops, copies included (bits: tests/test_plan_cache.py)."""
    from fastgrad.compiler.fusion import Loop, partition
    from fastgrad.compiler.passes import simplify
    from fastgrad.compiler.plan_codec import decode_plan, encode_plan

    f = fg.value_and_grad(mixture_nll, argnums=(0, 1, 2))
    traced = fg.make_graph(f)(*inputs(np.float64))
    graph = simplify(traced)
    steps = partition(graph)
    in_graph = {id(n) for n in graph.nodes}
    assert any(id(n) not in in_graph for s in steps if isinstance(s, Loop) for n in s.nodes)
    _, loaded, _ = decode_plan(traced, encode_plan(traced, graph, steps, {}))

    def loops(plan):
        return [[n.op.name for n in s.nodes] if isinstance(s, Loop) else None for s in plan]

    assert loops(loaded) == loops(steps)


def gelu_layer(x, w):
    h = x @ w
    g = 0.5 * h * (1 + fnp.tanh(0.7978845608 * (h + 0.044715 * h**3)))
    return fnp.sum((g @ w.T) ** 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_copy_reading_what_the_target_reads_anyway_is_made(dtype):
    """A GELU's backward loop reads h itself: its forward loop stores no 0.5 * h for it
    (4 arrays of h's shape before: 0.5 * h, 1 + tanh, the GELU, tanh^2; 3 without 0.5 * h;
    2 since it stores tanh for the backward to recompute 1 + tanh and tanh^2 from,
    test_fusion_roots), and value and gradients match the reference interpreter."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 32)).astype(dtype)
    w = (0.3 * rng.standard_normal((32, 48))).astype(dtype)
    loops = _fused_loops_matching_the_interpreter(gelu_layer, (x, w), (0, 1), dtype)
    forward = [s for s in loops if s.loop.shape == (64, 48) and "tanh" in s.source.ops]
    assert len(forward) == 1
    assert len(forward[0].source.outputs) == 2, forward[0].source.ops


def test_a_copy_into_a_loop_reading_its_inputs_keeps_second_derivatives():
    rng = np.random.default_rng(7)
    args = rng.standard_normal((6, 4)), 0.3 * rng.standard_normal((4, 5))
    fg.testing.check_grads(gelu_layer, args, order=2, modes=("rev",))
