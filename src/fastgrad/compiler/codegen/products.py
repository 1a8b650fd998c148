"""The kernel of a loop that reads a big matrix once for its two matrix-vector products
(compiler.readonce): z = X @ v, r = f(z, row vectors, scalars), total = X.T @ r.

Rows are split into the loop's chunks (a count set by the loop's size, as for every
kernel), each walked in blocks of rows that stay in the L2 cache (`block_rows`): per
block, z's rows (each a sum over the row in vector lanes, as BLAS's GEMV sums them), r's
rows by the cone's own kernel (today's generator, called on the block's slices: the
same vector math as every loop), then the block's share of X.T @ r, each of the k
elements a sum over the block's rows in the matrix's dtype, added to the chunk's float64
partial. After the chunks, the partials are added in chunk order, then rounded to the
dtype once: results do not depend on the thread count.

Accuracy: z's elements are sums of k products in the dtype, in an order of LLVM's
vectorization (BLAS's own order differs: the last bits may too); each element of
X.T @ r sums at most a block of rows in the dtype, the blocks' and chunks' sums in
float64 (docs/conventions.md's accumulation policy), so it is as close to the exact
sum as BLAS's, or closer, but not BLAS's bits.

X as the transposed array `a.T` (a of shape (k, n)) reads a block of a's columns: z's
rows are then summed across the block's lanes, j after j, and X.T @ r's elements along
a's rows.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet

import numpy as np

from fastgrad.compiler.codegen.source import KernelSource
from fastgrad.compiler.readonce import Form, outside_reads
from fastgrad.compiler.steps import Loop
from fastgrad.core.ir import Var

#: The bytes of X a block of rows holds, about: two blocks' worth fit the L2 cache of
#: current x86 cores (>= 512 KiB) with room for z's and r's rows.
BLOCK_BYTES = 1 << 17

_FLAGS = "error_model='numpy', nogil=True, pipeline_class=NoAlias"


def block_rows(k: int, itemsize: int) -> int:
    """Rows per block for rows of k elements: BLOCK_BYTES' worth, 16 to 1024, a
    multiple of 16 (the same in the kernel, which works it out from k)."""
    return max(16, min(1024, BLOCK_BYTES // (k * itemsize) // 16 * 16))


def products_kernel(
    loop: Loop,
    parts: Form,
    parallel: bool,
    vector_math: AbstractSet[tuple[str, str]],
    constants: dict[int, np.ndarray],
    generate: Callable[..., KernelSource],
) -> KernelSource:
    """The kernel of `loop` (its `parts`); `generate` writes the cone's."""
    n = loop.shape[0]
    stored = {id(v) for v in loop.outputs}
    inner = Loop((n,), 0)
    inner.nodes = list(parts.cone)
    inner.level = {id(node.out): "elem" for node in parts.cone}
    cone_made = {id(node.out) for node in parts.cone}
    inner.inputs = outside_reads(parts.cone)
    inner.outputs = [parts.r] + [v for v in loop.outputs if id(v) in cone_made and v is not parts.r]
    cone = generate(inner, False, vector_math, constants)
    if not cone.flat:
        raise ValueError("a read-once loop's cone runs flat")
    dtype = parts.z.aval.dtype.name
    short = "f32" if dtype == "float32" else "f64"
    others = [v for v in cone.inputs if v is not parts.z]
    # (a square X's v may be a row vector of r's cone too: one argument)
    arrays = list({id(v): v for v in [parts.matrix, parts.vector, *others]}.values())
    names = {id(v): f"a{i}" for i, v in enumerate(arrays)}
    names.update({id(v): f"o{i}" for i, v in enumerate(loop.outputs)})
    scalars = [f"k{i}" for i in range(len(cone.scalars))]
    x, v = names[id(parts.matrix)], names[id(parts.vector)]

    def block_of(var: Var, scratch: str) -> str:
        """The block's rows of `var`: a slice of its array, or the scratch buffer."""
        if id(var) in stored:
            return f"{names[id(var)]}[b0:b1]"
        if var.aval.shape == (n,) and id(var) in names:
            return f"{names[id(var)]}[b0:b1]"
        return f"{scratch}[: b1 - b0]"

    zs = block_of(parts.z, "zb")
    rs = block_of(parts.r, "rb")
    cone_ins = [
        zs if w is parts.z else (block_of(w, "") if w.aval.shape == (n,) else names[id(w)])
        for w in cone.inputs
    ]
    cone_outs = [rs if w is parts.r else block_of(w, "") for w in cone.outputs]
    total = names[id(parts.total)]
    chunk_args = ["lo", "hi", "rows", *scalars, *names.values(), "zb", "rb", "gb", "part"]
    chunk_args = list(dict.fromkeys(chunk_args))
    lines = [
        f"@njit({_FLAGS})",
        f"def chunk({', '.join(chunk_args)}):",
        f"    k = {x}.shape[{0 if parts.transposed else 1}]",
        "    for b0 in range(lo, hi, rows):",
        "        b1 = min(b0 + rows, hi)",
        f"        zs = {zs}",
        f"        rs = {rs}",
        *_dots(x, v, parts, short),
        f"        cone(b1 - b0, 1, {', '.join([*scalars, *cone_ins, *cone_outs])})",
        *_axpys(x, parts, short),
        "        for j in range(k):",
        "            part[j] += gb[j]",
        "",
        "",
        f"@njit(parallel={parallel}, {_FLAGS})",
        f"def kernel(n0, nchunks, {', '.join([*scalars, *names.values()])}):",
        f"    k = {x}.shape[{0 if parts.transposed else 1}]",
        f"    rows = max(16, min(1024, {BLOCK_BYTES} // (k * {parts.z.aval.dtype.itemsize})"
        " // 16 * 16))",
        "    parts = np.zeros((nchunks, k), np.float64)",
        f"    for c in {'prange' if parallel else 'range'}(nchunks):",
        "        lo = (c * n0) // nchunks",
        "        hi = ((c + 1) * n0) // nchunks",
        f"        zb = np.empty(rows, np.{dtype})",
        f"        rb = np.empty(rows, np.{dtype})",
        f"        gb = np.empty(k, np.{dtype})",
        f"        chunk({', '.join(a if a != 'part' else 'parts[c]' for a in chunk_args)})",
        "    for j in range(k):",
        "        t = parts[0, j]",
        "        for c in range(1, nchunks):",
        "            t += parts[c, j]",
        f"        {_at(parts.total, total, 'j')} = {short}(t)",
    ]
    source = cone.source.replace("def kernel(", "def cone(", 1).rstrip("\n")
    return KernelSource(
        name="kernel",
        source="\n".join([source, "", "", *lines]) + "\n",
        inputs=arrays,
        scalars=list(cone.scalars),
        outputs=list(loop.outputs),
        flat=False,
        ops=[node.op.name for node in loop.nodes],
        imports=set(cone.imports),
    )


def _dots(x: str, v: str, parts: Form, short: str) -> list[str]:
    """z's rows of the block into `zs`."""
    vj = _at(parts.vector, v, "j")
    if parts.transposed:  # a's columns b0..b1: lanes along a's rows, j after j
        return [
            "        for i in range(b1 - b0):",
            f"            zs[i] = {short}(0)",
            "        for j in range(k):",
            f"            vj = {vj}",
            "            for i in range(b0, b1):",
            f"                zs[i - b0] += {x}[j, i] * vj",
        ]
    return [
        "        for i in range(b0, b1):",
        f"            acc = {short}(0)",
        "            for j in range(k):",
        f"                acc = radd(acc, {x}[i, j] * {vj})",
        "            zs[i - b0] = acc",
    ]


def _axpys(x: str, parts: Form, short: str) -> list[str]:
    """The block's share of X.T @ r into `gb`."""
    if parts.transposed:  # along a's rows
        return [
            "        for j in range(k):",
            f"            acc = {short}(0)",
            "            for i in range(b0, b1):",
            f"                acc = radd(acc, {x}[j, i] * rs[i - b0])",
            "            gb[j] = acc",
        ]
    return [
        "        for j in range(k):",
        f"            gb[j] = {short}(0)",
        "        for i in range(b0, b1):",
        "            ri = rs[i - b0]",
        "            for j in range(k):",
        f"                gb[j] += {x}[i, j] * ri",
    ]


def _at(var: Var, name: str, index: str) -> str:
    """Element `index` of vector `var` (1-D, or a unit column or row) named `name`."""
    shape = var.aval.shape
    if len(shape) == 1:
        return f"{name}[{index}]"
    return f"{name}[{index}, 0]" if shape[1] == 1 else f"{name}[0, {index}]"
