"""A kernel that once hung LLVM compiles in seconds: the 0-d Hessian-vector product whose
tanh feeds the cheap-then-rerun sin and cos.

Every operand was read as `a[0]` inside the loop, so the whole body was loop-invariant;
the NaN-check reduction made the loop vectorizable, and LLVM's vectorizer (VPlan's
unrolling, `isUniformAcrossVFsAndUFs`) walked that body's shared values as a tree, for
minutes. One-element inputs are now read before the loop (codegen.loops). The test forces
the trig scheme onto the 0-d loop, as it was then, and compiles the kernel afresh in a
child process under a bound.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.compiler import kernel_cache
    from fastgrad.compiler.codegen import loops

    loops.BOUNDED_MIN_SIZE = 1  # the scheme that hung, on a loop of one element
    kernel_cache.FOLDER = sys.argv[1]  # this kernel compiles afresh; helpers stay cached
    fg.config.update("compile", "sync")

    def f(x):
        return fnp.cos(2.0 * fnp.tanh(x)) * 0.123457

    def hvp(x, v):
        return fg.jvp(fg.grad(f), (x,), (v,))[1]

    x, v = np.float64(0.3), np.float64(0.7)
    jitted = fg.jit(hvp)
    print(float(jitted(x, v)), float(fg.jit(hvp, fuse=False)(x, v)))
    (traced,) = jitted._cache.values()
    (kernel,) = traced.executable.kernels
    print(kernel.source)
    """
)


def test_the_once_hanging_0d_kernel_compiles_within_a_bound(tmp_path):
    run = [sys.executable, "-c", SCRIPT, str(tmp_path / "kernels")]
    env = {k: v for k, v in os.environ.items() if k != "FASTGRAD_COMPILE"}
    # The patched generator is not part of the plan cache's key: plan afresh, store nothing.
    env["FASTGRAD_PLAN_CACHE"] = "0"
    # Minutes when it hung; seconds now (plus the vector-math helpers on a cold cache).
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, *source = out.stdout.splitlines()
    fused, reference = map(float, first.split())
    np.testing.assert_allclose(fused, reference, rtol=1e-13)
    source = "\n".join(source)
    assert "bad = False" in source and "sin_bounded_f64" in source  # the scheme that hung
    assert "a0_0 = a0[0]" in source  # read before the loop
