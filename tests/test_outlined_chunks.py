"""Loops storing into many arrays of their own vectorize (compiler.codegen.outline): a column
loop with 16 sums ran scalar when its partials were arrays allocated in the kernel, which
LLVM could not tell apart ("too many memory checks needed")."""

import re

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler.codegen.loops import generate
from fastgrad.compiler.codegen.math_names import VECTOR_MATH
from fastgrad.compiler.codegen.outline import NAME, outline_chunks
from fastgrad.compiler.fusion import Loop
from fastgrad.core.config import config

K = 16


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
    # Names bound together (a pair of results, codegen.pairs): the same, each of them.
    paired = [*lines[:3], "        u, v = a0[c], r[c]", "        r[c] = u + v"]
    moved = outline_chunks("def kernel(n0, nchunks, a0, o0):", paired, "")
    assert moved is not None and f"    {NAME}(a0, nchunks, r)" in moved
    assert (
        outline_chunks("def kernel(n0, nchunks, a0, o0):", [*paired, "    o0[0] = v"], "") is None
    )
    ahead = ["    lo, hi = f64(0), f64(1)", "    for c in range(nchunks):", "        a0[c] = hi"]
    assert f"    {NAME}(a0, hi, nchunks)" in outline_chunks("def kernel(nchunks, a0):", ahead, "")


def _lanes(x, b):  # (N, 8, 2) summed over N, reading x[:, None, :]: codegen.lanecolumns
    h, s = x[:, None, :] - b, 0.0
    for k in range(16):
        h = fnp.tanh(h + b)
        s = s + fnp.sum(h, axis=0) * (k + 1.0)
    return s


def _passes(x, b):  # 16 row means, then a pass reading the stored rows again
    h, t = x, 0.0
    for _ in range(16):
        h = fnp.tanh(h + b)
        d = h - fnp.mean(h, axis=1, keepdims=True)
        t = t + fnp.sum(d * d, axis=1)
    return fnp.sum(t)


def _nested(x, y):  # y broadcast over a reduced axis only: the nested column form
    h, s = x * y, 0.0
    for k in range(16):
        h = fnp.tanh(h + 0.5)
        s = s + fnp.sum(h, axis=(0, 1)) * (k + 1.0)
    return s


FORMS = {
    "columns": (powers, [(300, 8)]),
    "lanes": (_lanes, [(300, 2), (8, 2)]),
    "passes": (_passes, [(20, 256), (256,)]),
    "nested": (_nested, [(20, 30, 16), (20, 1, 16)]),
}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunk_loops_allocate_nothing(form, dtype):
    """Each form's chunk loop is outlined, and allocates no array of its own (one it did
    would be one LLVM cannot tell apart from the others again). Source only: no compile."""
    fun, shapes = FORMS[form]
    draw = np.random.default_rng(5)
    args = [draw.standard_normal(s).astype(dtype) for s in shapes]
    (source,) = fg.jit(fun).lower(*args).executable.kernels
    outlined = source.source.split(f"def {NAME}(")
    assert len(outlined) == 2, source.source
    assert not re.search(r"np\.(empty|full|zeros)\(", outlined[1]), outlined[1]


def test_parallel_row_passes_keep_a_row_per_thread():
    """A parallel row loop's stored rows are a row per thread, allocated before the chunk
    loop like a serial loop's one row: allocated per chunk in the prange, LLVM
    could not tell them apart; a buffer per chunk allocated before it took nchunks rows at
    once (64 rows of 400,000 float64: 770 MB more and 3x the time in page faults)."""
    for shape, parallel in (((16, 65536), True), ((8, 4096), False)):
        x, b = np.zeros(shape), np.zeros(shape[1])
        (source,) = fg.jit(_passes).lower(x, b).executable.kernels
        assert ("in prange(nchunks)" in source.source) == parallel
        before, _, loop = source.source.partition("for c in ")
        assert not re.search(r"np\.empty\(\(nchunks", source.source)
        assert (f"def {NAME}(" in source.source) == (not parallel)  # a prange: Numba's
        assert not re.search(r"np\.(empty|full|zeros)\(", loop)
        rows = "np.empty((nthreads, n1)" if parallel else "np.empty(n1"
        assert rows in before
        assert ("= get_thread_id()" in loop) == parallel


STAGES = 20


def _many_passes(x, b):  # 20 stored rows (a division each: dearer to recompute than load)
    h, t = x, 0.0
    for _ in range(STAGES):
        h = (h + b) / (h * h + 2.0)
        d = h - fnp.mean(h, axis=1, keepdims=True)
        t = t + fnp.sum(d * d, axis=1)
    return t


def _compiled(source):
    namespace: dict = {}
    exec(compile(source.source, "<kernel>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parallel_row_passes_vectorize(dtype, monkeypatch):
    """With 20 stored rows the parallel loop's passes are packed (`fdiv <n x T>`, whatever
    the vector width): its rows allocated in the prange, every one ran scalar. Its rows
    are NumPy's values, and (float64) the serial loop's bits."""
    monkeypatch.setattr(config, "plan_cache", False)  # a stored plan's constants are arrays
    shape = (4, 512)
    draw = np.random.default_rng(7)
    x, b = (draw.standard_normal(s).astype(dtype) for s in (shape, shape[1]))
    executable = fg.jit(_many_passes).lower(x, b).executable
    (loop,) = [s for s in executable.steps if isinstance(s, Loop)]
    results = []
    for parallel in (True, False) if dtype == np.float64 else (True,):  # compiles are slow
        source = generate(loop, parallel, VECTOR_MATH, executable.constants)
        assert ("in prange(nchunks)" in source.source) == parallel
        namespace = _compiled(source)
        params = re.search(r"def kernel\((.*)\):", source.source).group(1).split(", ")
        out = np.empty(shape[0], dtype)
        values = {"n0": shape[0], "n1": shape[1], "nchunks": 4, "o0": out}
        values |= {f"a{k}": x if v.aval.ndim == 2 else b for k, v in enumerate(source.inputs)}
        scalars = iter(executable.constants[id(v)].reshape(())[()] for v in source.scalars)
        namespace["kernel"](*(values[p] if p in values else next(scalars) for p in params))
        results.append(out)
        if parallel:
            chunks = namespace.get(NAME, namespace["kernel"])  # the function with the prange
            ir = chunks.inspect_llvm(chunks.signatures[0])
            kind = "float" if dtype == np.float32 else "double"
            assert len(re.findall(rf"= fdiv <\d+ x {kind}>", ir)) >= STAGES
    np.testing.assert_array_equal(results[0], results[-1])
    want, h = np.zeros(shape[0]), x.astype(np.float64)
    for _ in range(STAGES):
        h = (h + b) / (h * h + 2.0)
        d = h - h.mean(axis=1, keepdims=True)
        want = want + (d * d).sum(axis=1)
    np.testing.assert_allclose(results[0], want, rtol=1e-4 if dtype == np.float32 else 1e-10)
