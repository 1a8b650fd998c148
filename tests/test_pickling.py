"""Jitted functions and the functions transforms return travel to other processes.

They pickle with cloudpickle without their caches; a new process traces again and loads
the kernels from the disk cache instead of compiling; copies unpickled in one process
are one object, so a function sent with every task traces once per process.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp

cloudpickle = pytest.importorskip("cloudpickle")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # a new process cannot import us


def loss(w, x):
    return fnp.sum(fnp.tanh(x @ w) * fnp.exp(-w[0] * w[0]))


@fg.custom_vjp
def clipped(x):
    return fnp.sin(x)


clipped.defvjp(lambda x: (fnp.sin(x), x), lambda x, g: (fnp.clip(g * fnp.cos(x), -0.5, 0.5),))

W = np.array([0.3, -0.7, 1.1])
X = np.linspace(-1, 1, 12).reshape(4, 3)


def functions():
    """name -> (function, arguments) for everything that must survive pickling."""
    _, vjp_fn = fg.vjp(loss, W, X)
    return {
        "jit": (fg.jit(loss), (W, X)),
        "jit_value_and_grad": (fg.jit(fg.value_and_grad(loss)), (W, X)),
        "grad_of_jit": (fg.grad(fg.jit(loss)), (W, X)),
        "grad_argnums_aux": (fg.grad(lambda w, x: (loss(w, x), w * 2), (0, 1), True), (W, X)),
        "vjp_fn": (vjp_fn, (np.array(1.0),)),
        "jvp_of_grad": (lambda v: fg.jvp(fg.grad(loss), (W, X), (v, 0 * X))[1], (W,)),
        "hessian": (fg.hessian(loss), (W, X)),
        "custom_vjp": (fg.jit(fg.grad(lambda x: fnp.sum(clipped(x)))), (W * 3,)),
        "static": (fg.jit(lambda x, n: x**n, static_argnums=1), (W, 3)),
    }


def test_a_jitted_function_pickles_without_its_caches():
    f = fg.jit(fg.value_and_grad(loss))
    before = len(cloudpickle.dumps(f))
    f(W, X)
    assert f._cache
    assert len(cloudpickle.dumps(f)) == before  # the traced graphs and kernels stay home
    # In one process every copy is the same object, with its caches.
    assert cloudpickle.loads(cloudpickle.dumps(f)) is f
    assert pickle.loads(pickle.dumps(fg.jit(np.sin))) is not None


SCRIPT = textwrap.dedent(
    """
    import pickle, sys, numpy as np
    from fastgrad.compiler.kernel_cache import STATS
    with open(sys.argv[1], "rb") as f:
        payload = pickle.load(f)
    results = {name: fn(*args) for name, (fn, args) in payload.items()}
    again = pickle.loads(open(sys.argv[1], "rb").read())
    same = all(again[k][0] is payload[k][0] for k in payload if hasattr(payload[k][0], "lower"))
    with open(sys.argv[2], "wb") as f:
        pickle.dump((results, STATS.numba_compiles(), STATS.cache_loads(), same), f)
    """
)


def test_functions_run_in_a_new_process_and_load_kernels_from_disk(tmp_path):
    payload = functions()
    expected = {name: fn(*args) for name, (fn, args) in payload.items()}  # fills the cache
    src, out = tmp_path / "in.pkl", tmp_path / "out.pkl"
    src.write_bytes(cloudpickle.dumps(payload))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    results, compiles, hits, same = pickle.loads(out.read_bytes())
    assert same  # a second unpickling gives the same jitted objects
    assert compiles == 0 and hits > 0  # kernels came from the disk cache
    for name, want in expected.items():
        got_leaves, got_tree = fg.pytree.flatten(results[name])
        want_leaves, want_tree = fg.pytree.flatten(want)
        assert got_tree == want_tree, name
        for g, w in zip(got_leaves, want_leaves, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-14, err_msg=name)
