"""Loops storing into many arrays of their own vectorize (compiler.codegen.outline): a column
loop with 20 sums ran scalar when its partials were arrays allocated in the kernel, which
LLVM could not tell apart ("too many memory checks needed")."""

import re

import numpy as np

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.codegen.outline import NAME, outline_chunks

K = 20


def powers(x):
    h, s = x, 0.0
    for k in range(K):
        h = h * x
        s = s + fnp.sum(h, axis=0) * (k + 1.0)
    return s


def test_many_column_sums_vectorize():
    """The loop's K multiplies are packed (`fmul <n x double>`, whatever the vector width):
    without the chunk loop outlined, every one was scalar. Its results equal NumPy's."""
    x = np.random.default_rng(3).standard_normal((300, 8))
    f = fg.jit(powers)
    f.compile(x)
    got = f(x)
    want, h = np.zeros(8), x
    for k in range(K):
        h = h * x
        want = want + h.sum(axis=0) * (k + 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    (source,) = f.lower(x).executable.kernels
    # Compiled here by Numba alone (no machine code from the cache, which has no IR).
    namespace: dict = {}
    exec(compile(source.source, "<kernel>", "exec"), namespace)
    kernel = namespace["kernel"]
    params = re.search(r"def kernel\((.*)\):", source.source).group(1).split(", ")
    values = {"n0": 300, "n1": 8, "nchunks": 1, "a0": x, "o0": np.empty(8)}
    kernel(*(values.get(p, 1.0) for p in params))
    ir = kernel.inspect_llvm(kernel.signatures[0])
    assert len(re.findall(r"= fmul <\d+ x double>", ir)) >= K
    assert f"def {NAME}(" in source.source


def test_chunk_loop_moves_only_when_nothing_flows_out():
    lines = [
        "    s = f64(0)",
        "    r = np.empty(n0, f64)",
        "    for c in range(nchunks):",
        "        r[c] = a0[c]",
        "        s = radd(s, a0[c])",
    ]
    moved = outline_chunks("def kernel(n0, nchunks, a0, o0):", [*lines, "    o0[0] = r[0]"], "")
    assert moved is not None
    assert f"    {NAME}(a0, nchunks, r, s)" in moved
    assert f"def {NAME}(a0, nchunks, r, s):" in moved
    # A scalar the loop assigns, read after it: it would not come back from the function.
    carried = [*lines, "    o0[0] = s"]
    assert outline_chunks("def kernel(n0, nchunks, a0, o0):", carried, "") is None
    # Assigned again after the loop before it is read: nothing flows out.
    rebound = [*lines, "    s = f64(1)", "    o0[0] = s"]
    assert outline_chunks("def kernel(n0, nchunks, a0, o0):", rebound, "") is not None
    assert outline_chunks("def kernel(n0, a0):", ["    o0[0] = a0[0]"], "") is None
