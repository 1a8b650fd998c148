"""Shared checks for the NumPy/SciPy-named functions: the value on plain arrays, traced and
fused, traced and run by the reference interpreter, against NumPy's or SciPy's value; and
derivatives at orders 1 and 2, in both modes, against finite differences. And for the
kernels' forms: compiled kernels against the reference interpreter, and the kernels'
sources (which form a loop took)."""

import numpy as np

import fastgrad as fg
from fastgrad.core.pytree import flatten
from fastgrad.runtime.executable import _KernelStep
from fastgrad.testing import check_grads

TOLERANCE = {np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-10}


def check_values(fun, reference, args, dtype, rtol=None, atol=None, fused=False):
    """fun(*args) eager, jitted (run by the reference interpreter, and with `fused` also
    compiled: each new pattern of shapes compiles kernels, so tests choose a few) equals
    reference(*args) in value, shape and dtype (reference computed in float64)."""
    dtype = np.dtype(dtype)
    rtol = TOLERANCE[dtype] if rtol is None else rtol
    atol = rtol if atol is None else atol
    wide = [np.asarray(a, np.float64) if np.asarray(a).dtype.kind == "f" else a for a in args]
    with np.errstate(all="ignore"):
        expected = flatten(reference(*wide))[0]
    runs = [fun, fg.jit(fun, fuse=False)] + ([fg.jit(fun)] if fused else [])
    for got in (run(*args) for run in runs):
        leaves = flatten(got)[0]
        assert len(leaves) == len(expected)
        for g, e in zip(leaves, expected, strict=True):
            g, e = np.asarray(g), np.asarray(e)
            assert g.shape == e.shape, (g.shape, e.shape)
            if g.dtype.kind == "f":
                assert g.dtype == dtype, (g.dtype, dtype)
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


def check_derivatives(fun, args, order=2, atol=None, rtol=None, eps=None, fused=False):
    """Orders 1..`order`, forward and reverse mode, against finite differences (float64),
    on plain calls and with the function jitted (compiled too with `fused`)."""
    check_grads(fun, args, order=order, modes=("fwd", "rev"), atol=atol, rtol=rtol, eps=eps)
    jitted = fg.jit(fun, fuse=fused)
    check_grads(jitted, args, order=1, modes=("fwd", "rev"), atol=atol, rtol=rtol, eps=eps)


def check_float32_gradients(fun, args):
    """Reverse-mode gradients of float32 arguments are float32, of their shapes."""
    args = tuple(np.asarray(a, np.float32) if np.asarray(a).dtype.kind == "f" else a for a in args)
    out, vjp_fn = fg.vjp(fun, *args)
    cts = fg.pytree.tree_map(lambda o: np.ones_like(np.asarray(o)), out)
    for g, a in zip(vjp_fn(cts), args, strict=True):
        if np.asarray(a).dtype.kind == "f":
            assert np.asarray(g).dtype == np.float32 and np.shape(g) == np.shape(a)


def fused_matches_reference(f, args, rtol, atol):
    """jit(f)(*args) from compiled kernels and from the reference interpreter: every output
    (any pytree) of the same dtype and shape, and values within rtol and atol. Returns the
    compiled outputs, flattened."""
    fused = flatten(fg.jit(f)(*args))[0]
    reference = flatten(fg.jit(f, fuse=False)(*args))[0]
    for u, r in zip(fused, reference, strict=True):
        u, r = np.asarray(u), np.asarray(r)
        assert u.dtype == r.dtype and u.shape == r.shape, (u.dtype, r.dtype, u.shape, r.shape)
        np.testing.assert_allclose(u, r, rtol=rtol, atol=atol)
    return fused


def kernel_sources(f, *args):
    """The sources of the kernels jit(f)'s plan runs for args."""
    plan = fg.jit(f).lower(*args).executable.plan
    return [s.source.source for s in plan if isinstance(s, _KernelStep)]
