"""A loop body's small matrix-vector products as reductions: `W @ h` (W of shape (m, k),
h a column (k, 1)) becomes `sum(W[:, :, None] * h[None], axis=1)`, and `h @ W` (h a row
(1, k)) `sum(h[..., None] * W[None], axis=1)`, each a kernel of its own.

Such a product as a library call (runtime.vm_vectors' GEMV row, NumPy's cblas_?gemv) cost
~83 ns a step for a (16, 16) float32 W, measured by removing the row from a LOOP's body:
OpenBLAS's checks, its scaling of the output by beta = 0 and its copies for 256
multiply-adds, more than the body's kernel (45 ns). A loop body runs it at every
iteration: the unbatched RNN's value at H = 16 took 0.155 us a step, JAX's 0.12. The
reduction's kernel takes ~40 ns. Each output element sums its k terms in order
(compiler.codegen's row reduction), not as BLAS does: the body's results may differ from
`np.matmul`'s in the last bits. Every runner of the body (the LOOP, the Python loop, the
step runner) runs this same graph, so they agree bit for bit with one another.

The loop is 3-D, the product's length first (or last) and a unit axis, so that the
product's shape is not a row shape of the loop: the elementwise work reading it stays in
a kernel of its own, vectorized (taken into the reduction's loop, `tanh(W @ h + u)` ran
one row at a time: 138 ns a step against 88 for both kernels). A transposed matrix
(W.T @ h, after loop_hoisting copied a const's transpose or not) is read untransposed.
Only small products (LIMIT): at H = 32 (1024 multiply-adds) both forms measured level,
and larger ones gain BLAS's vector code.

Big products stay BLAS's too, top-level ones included (a pair of products reading one
matrix, as M5's gradient does, is read once instead: compiler.readonce). Written this
way for bench M5's
(1e6, 100) x (x @ w, then x.T @ r in its gradient; CPU time per call, one thread, one
process alternating, load 6-10 on 2 cores): x @ w as the (rows, k, 1) row reduction took
0.87x BLAS's time in float32 and 0.7-0.8x in float64, but x.T @ r as a column reduction
(any of (n, k), (n, k, 1), (n, 1, k)) 1.1-1.2x in float32 (0.75x in float64), so whole
M5 in float32 measured 0.91-1.03x BLAS's speed (float64: 1.3-1.4x; on two threads 1.3x
and 1.6-1.7x, against OpenBLAS slowed by its second thread). A square (1000, 1000): rows
1.3-1.6x faster, columns 2-4.5x slower. The column kernel reads the broadcast vector
through an index per element (codegen's merged-row column path).
"""

from __future__ import annotations

from fastgrad.core.ir import Aval, Graph, Node, Var
from fastgrad.core.primitive import REGISTRY

#: Products of at most this many multiply-adds become reductions (a (32, 32) W at most).
LIMIT = 1024


def fuse_small_products(graph: Graph) -> Graph:
    """`graph` with each small float matrix-vector product written as a reduction, or
    `graph` itself when it has none."""
    made = {id(n.out): n for n in graph.nodes}
    nodes: list[Node] = []
    for node in graph.nodes:
        found = _as_reduction(node, made) if _small(node) else None
        nodes += [node] if found is None else found
    if len(nodes) == len(graph.nodes):
        return graph
    return Graph(graph.inputs, nodes, graph.outputs).verify()


def _small(node: Node) -> bool:
    if node.op.name != "matmul" or any(v.aval.ndim != 2 for v in node.inputs):
        return False
    (m, k), (_, n) = (v.aval.shape for v in node.inputs)
    dtype = node.out.aval.dtype
    return (
        (m == 1 or n == 1)
        and m * k * n <= LIMIT
        and dtype.kind == "f"
        and all(v.aval.dtype == dtype for v in node.inputs)
    )


def _untransposed(v: Var, made: dict[int, Node]) -> tuple[Var, bool]:
    """`v`, or the matrix whose transpose it is (and True)."""
    node = made.get(id(v))
    if node is not None and node.op.name == "transpose" and node.params["axes"] == (1, 0):
        return node.inputs[0], True
    return v, False


def _whole(v: Var, made: dict[int, Node], vector: bool) -> bool:
    """Whether `v` is an input or the output of a step that writes an array of its own
    (a vector: also a reshape or transpose of one): so that the reshapes below are views,
    not copies (a copy is a host step, and the body would not run as a LOOP)."""
    node = made.get(id(v))
    while vector and node is not None and node.op.name in ("reshape", "transpose"):
        node = made.get(id(node.inputs[0]))
    return node is None or node.op.name not in _VIEWS


_VIEWS = frozenset({"reshape", "transpose", "slice", "broadcast_to"})


def _as_reduction(node: Node, made: dict[int, Node]) -> list[Node] | None:
    """The nodes computing matmul `node`'s output (its own Var, last) as a reduction over
    the middle axis of a 3-D loop, so that its reshape to the product's shape is not a
    shape of the loop's rows and the elementwise work reading it runs in a kernel of its
    own (taken into the reduction's loop, it ran one row at a time, unvectorized: 1.9x
    the time of both kernels apart for the RNN's tanh); None when an operand's layout may
    need a copy. A transposed matrix operand is read untransposed."""
    a, b = node.inputs
    (m, k), (_, n) = a.aval.shape, b.aval.shape
    dtype = node.out.aval.dtype
    nodes: list[Node] = []

    def add(name: str, inputs: list[Var], to: tuple[int, ...], **params: object) -> Var:
        out = Var(Aval(to, dtype))
        nodes.append(Node(REGISTRY[name], inputs, params, out))
        return out

    column = n == 1  # W @ h: the matrix is a; else h @ W, the matrix b
    matrix, vector = (a, b) if column else (b, a)
    matrix, transposed = _untransposed(matrix, made)
    if not (_whole(matrix, made, False) and _whole(vector, made, True)):
        return None
    rows = m if column else n  # the product's length
    spread = add("reshape", [vector], (1, k, 1), shape=(1, k, 1))
    if column != transposed:  # the matrix holds the product's rows: (rows, k)
        terms = add("reshape", [matrix], (rows, k, 1), shape=(rows, k, 1))
        spread = add("broadcast_to", [spread], (rows, k, 1), shape=(rows, k, 1))
        shape: tuple[int, ...] = (rows, 1)
    else:  # its columns: (k, rows)
        terms = add("reshape", [matrix], (1, k, rows), shape=(1, k, rows))
        spread = add("broadcast_to", [spread], (1, k, rows), shape=(1, k, rows))
        shape = (1, rows)
    product = add("multiply", [terms, spread], terms.aval.shape)
    if shape == node.out.aval.shape:
        nodes.append(Node(REGISTRY["sum"], [product], {"axis": (1,), "keepdims": False}, node.out))
    else:
        total = add("sum", [product], shape, axis=(1,), keepdims=False)
        nodes.append(Node(REGISTRY["reshape"], [total], {"shape": node.out.aval.shape}, node.out))
    return nodes
