"""A big matrix read once by both of its matrix-vector products: `z = X @ v`, elementwise
work on z giving r, then `X.T @ r` (bench M5's logistic-regression gradient: x @ w, then
x.T @ r in its backward pass) become one `Loop` that walks X in blocks of rows kept in
cache: per block, z's rows (a dot each), r's rows (the elementwise work that makes r from
z, other row vectors and scalars, vectorized over the block), then the block's share of
X.T @ r (a scaled row added per row). As two BLAS calls X crossed memory twice; both
products are bound by memory there (a (1e6, 100) float32 X is 400 MB).

Here the partition is rewritten (after `fusion.partition`), not the graph: the loop holds
the two products' nodes, the views between them and r's cone (its nodes copied in from
the loop that made r, which keeps them only where its other outputs need them), so the
plan stores and reloads as any other (`plan_codec` writes a loop's nodes whatever their
ops), the NumPy tier runs its nodes in order while the kernel compiles, and
`codegen.products` (which recognizes such a loop by its two matmul nodes) writes the
kernel. z is stored when anything else reads it (the loss's sum, say), r when anything
but the second product does.

Forms: the first product is `X @ v` or `v @ X.T`, the second `X.T @ r` or `r @ X`, with
v and r vectors (or a unit column or row); X may itself be a transposed array (`a.T`,
the products then `a.T @ v` and `a @ r`): the kernel then reads a's columns in blocks.

Taken where it pays (`pays`), measured on the 2-core AVX2 machine (one process
alternating with the plan before, median of 11-61 calls of the logistic gradient, load
3-6): rows of `MIN_COLUMNS` <= k <= `MAX_COLUMNS` elements: (1e6, 100) 1.85x faster
in float32 and 2.36x in float64, (1e5, 256) 1.74x and 1.45x, (5e4, 512) float32 1.22x;
k = 1000 level with
BLAS ((2e4, 1000): 1.08x float32, 0.99x float64), a square (4096, 4096) float32 0.96-0.97x
and (3000, 3000) float64 1.08x, so longer rows stay BLAS's. The matrix's size mattered
less than feared: (2500, 100) float32 (1 MB, in cache) 1.53x, (1e4, 100) 1.55x and
float64 1.93x, and a (200, 100) one 3x (two kernel calls rather than two GEMV rows, a
loop and views); matrices under `MIN_BYTES` are still left to BLAS, where microseconds
won do not repay a kernel of their own to compile. A lone product (a forward pass
alone) is left to BLAS.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastgrad.compiler.steps import REDUCTIONS, Call, Loop, Step
from fastgrad.core.ir import Graph, Node, Var

#: The matrix's bytes at least (tests lower it; module docstring).
MIN_BYTES = 1 << 20
#: Row lengths at most (module docstring): longer rows ran level with BLAS.
MAX_COLUMNS = 512
#: Row lengths at least: float32 rows of 2-8 elements ran 1.1-1.5x slower than BLAS's two
#: calls ((2^19, k) on one thread, one process per form alternating; float64's level at
#: 4, float32's at 16): a dot of a few elements a row is not vectorized across the block.
MIN_COLUMNS = 16

_VIEWS = ("transpose", "reshape")


@dataclass
class Product:
    """A matrix-vector product seen along the rows of `matrix` (n, k): "rows" computes
    `matrix @ vector` (n values), "columns" `matrix.T @ vector` (k values); `transposed`
    when the node's operand is `matrix.T` (the node then reads it through that view)."""

    node: Node
    matrix: Var
    vector: Var  # 1-D, or a unit column or row
    along: str  # "rows" or "columns"
    views: list[Node]  # the transpose and reshapes between the node and matrix, vector


def product(node: Node, made: dict[int, Node]) -> list[Product]:
    """The readings of matmul `node` as a matrix-vector product: along the rows of its
    matrix operand, and along the columns of the matrix that operand transposes."""
    if node.op.name != "matmul" or len(node.inputs) != 2:
        return []
    a, b = node.inputs
    dtype = node.out.aval.dtype
    if dtype.kind != "f" or a.aval.dtype != dtype or b.aval.dtype != dtype:
        return []
    if a.aval.ndim == 2 and _vector(b.aval.shape, a.aval.shape[1], first=False):
        matrix, vector, along = a, b, "rows"
    elif b.aval.ndim == 2 and _vector(a.aval.shape, b.aval.shape[0], first=True):
        matrix, vector, along = b, a, "columns"
    else:
        return []
    if min(matrix.aval.shape) < 2:
        return []
    vector, unwrapped = _unreshaped(vector, made)
    found = [Product(node, matrix, vector, along, unwrapped)]
    maker = made.get(id(matrix))
    if maker is not None and maker.op.name == "transpose" and maker.params["axes"] == (1, 0):
        flipped = "columns" if along == "rows" else "rows"
        found.append(Product(node, maker.inputs[0], vector, flipped, [maker, *unwrapped]))
    return found


def _vector(shape: tuple[int, ...], k: int, first: bool) -> bool:
    """Whether an operand of `shape` is a vector of length k for the matrix's side."""
    return shape == (k,) or shape == ((1, k) if first else (k, 1))


def _unreshaped(v: Var, made: dict[int, Node]) -> tuple[Var, list[Node]]:
    """The 1-D vector that `v` (a unit column or row) reshapes, and that reshape; else
    `v` itself."""
    maker = made.get(id(v))
    if v.aval.ndim == 2 and maker is not None and maker.op.name == "reshape":
        source = maker.inputs[0]
        if source.aval.shape == (v.aval.size,):
            return source, [maker]
    return v, []


def pays(matrix: Var, rows: int) -> bool:
    """Whether one pass over `matrix`, `rows` (z's length) along one of its axes, pays
    against two BLAS calls (module docstring; MIN_COLUMNS)."""
    if matrix.aval.dtype.name not in ("float32", "float64"):
        return False
    k = matrix.aval.size // max(rows, 1)
    big = matrix.aval.size * matrix.aval.dtype.itemsize >= MIN_BYTES
    return big and MIN_COLUMNS <= k <= MAX_COLUMNS


def read_once(graph: Graph, steps: list[Step]) -> list[Step]:
    """`steps` (fusion.partition's) with each pair of products that may read their
    matrix once made one loop; `steps` itself where there is none."""
    made = {id(n.out): n for s in steps for n in _nodes(s)}
    at = 0
    while at < len(steps):
        fused = _pair(graph, steps, at, made)
        if fused is not None:
            steps = fused
            made = {id(n.out): n for s in steps for n in _nodes(s)}
        at += 1
    return steps


def _nodes(step: Step) -> list[Node]:
    return [step.node] if isinstance(step, Call) else step.nodes


def _pair(graph: Graph, steps: list[Step], at: int, made: dict[int, Node]) -> list[Step] | None:
    """The steps with the product computed by step `at` fused with a later one into a
    loop (module docstring), or None."""
    step = steps[at]
    if not isinstance(step, Call):
        return None
    for first in product(step.node, made):
        n = first.matrix.aval.shape[0 if first.along == "rows" else 1]
        if first.node.out.aval.size != n or not pays(first.matrix, n):
            continue
        for later in range(at + 1, len(steps)):
            other = steps[later]
            if not isinstance(other, Call):
                continue
            for second in product(other.node, made):
                if second.matrix is first.matrix and second.along != first.along:
                    fused = _fuse(graph, steps, at, later, first, second)
                    if fused is not None:
                        return fused
    return None


def _fuse(
    graph: Graph,
    steps: list[Step],
    at: int,
    later: int,
    first: Product,
    second: Product,
) -> list[Step] | None:
    """The steps with products `first` (step `at`) and `second` (step `later`) in one
    loop at `at`, r's cone copied in; None where r is not an elementwise function of z,
    of row vectors and of scalars made before `at`."""
    n = first.node.out.aval.size
    r = second.vector
    if r.aval.shape != (n,):
        return None
    position = {}  # id(var) -> index of the step that makes it
    for i, s in enumerate(steps):
        for node in _nodes(s):
            position.setdefault(id(node.out), i)
    spread = _as_vector(first.node.out, steps)  # z as a vector: X @ w of a 1-D w
    if spread is None:
        return None
    z = spread[-1].out if spread else first.node.out
    home = position.get(id(r))
    if home is None or not (at < home < later) or not isinstance(steps[home], Loop):
        return None
    source = steps[home]
    cone = _cone(source, r)
    if cone is None:
        return None
    inside = {id(node.out) for node in cone}
    reads = outside_reads(cone)
    if not any(v is z for v in reads):
        return None
    for v in reads:
        if v is z:
            continue
        if v.aval.shape != (n,) and v.aval.size != 1:
            return None
        if position.get(id(v), -1) >= at:
            return None
    views = [*first.views, *second.views, *spread]
    nodes = _unique([*first.views, first.node, *spread, *cone, *second.views, second.node])
    inside |= {id(node.out) for node in nodes}
    for v in outside_reads(nodes):
        if position.get(id(v), -1) >= at:
            return None
    fused: list[Step | None] = list(steps)
    fused[later] = None
    for view in views:  # their Calls, now inside the loop
        where = position.get(id(view.out))
        if where is not None and isinstance(steps[where], Call):
            fused[where] = None
    fused[home] = _without(source, inside)
    fused[at] = None
    readers = _readers(graph, [s for s in fused if s is not None])
    hidden = [view.out for view in views if view.out is not z]
    if any(id(v) in readers for v in [*hidden, *([first.node.out] if spread else [])]):
        return None  # a view something else reads stays where it is
    loop = Loop((n,), at)
    loop.nodes = nodes
    loop.level = {id(node.out): "elem" for node in [first.node, *cone]}
    loop.inputs = outside_reads(nodes)
    # What the loop stores: the second product, and z and r's cone where another step
    # reads them (the loss's sum reads z, say).
    kept = [v for v in [z, *(node.out for node in cone)] if id(v) in readers]
    loop.outputs = [*kept, second.node.out]
    fused[at] = loop
    return [s for s in fused if s is not None]


def _as_vector(v: Var, steps: list[Step]) -> list[Node] | None:
    """[] for a 1-D `v`; for a unit column or row, [the reshape Call making it 1-D];
    None where there is none."""
    if v.aval.ndim == 1:
        return []
    for s in steps:
        if isinstance(s, Call) and s.node.op.name == "reshape" and s.node.inputs[0] is v:
            if s.node.out.aval.shape == (v.aval.size,):
                return [s.node]
    return None


def _cone(loop: Loop, r: Var) -> list[Node] | None:
    """The nodes of `loop` that compute `r`, in order, when all are elementwise over the
    loop's elements; else None."""
    by_out = {id(node.out): node for node in loop.nodes}
    needed = set()
    stack = [r]
    while stack:
        v = stack.pop()
        node = by_out.get(id(v))
        if node is None or id(v) in needed:
            continue
        if loop.level.get(id(v)) != "elem" or not _elementwise(node):
            return None
        needed.add(id(v))
        stack.extend(node.inputs)
    return [node for node in loop.nodes if id(node.out) in needed]


def _elementwise(node: Node) -> bool:
    if node.op.extra.get("positional") or node.op.name in REDUCTIONS:
        return False  # (a sampler's values depend on the element's flat index)
    if node.op.name in ("broadcast_to", "reshape"):
        return node.inputs[0].aval.size == 1  # a scalar spread over the rows
    return node.op.kind == "elementwise" and node.op.name != "gather"


def outside_reads(nodes: list[Node]) -> list[Var]:
    """The values `nodes` read that none of them makes, in order of first reading."""
    inside = {id(node.out) for node in nodes}
    seen: dict[int, Var] = {}
    for node in nodes:
        for v in node.inputs:
            if id(v) not in inside:
                seen.setdefault(id(v), v)
    return list(seen.values())


def _unique(nodes: list[Node]) -> list[Node]:
    seen: dict[int, Node] = {}
    for node in nodes:
        seen.setdefault(id(node), node)
    return list(seen.values())


def _readers(graph: Graph, steps: list[Step]) -> set[int]:
    """The ids of the values `steps` or the graph's outputs read."""
    read = {id(v) for v in graph.outputs}
    for s in steps:
        read.update(id(v) for v in (s.node.inputs if isinstance(s, Call) else s.inputs))
    return read


def _without(loop: Loop, moved: set[int]) -> Loop | None:
    """A copy of `loop` without the values the fused loop now makes that it needs only
    for them (None when nothing is left)."""
    kept_outputs = [v for v in loop.outputs if id(v) not in moved]
    by_out = {id(node.out): node for node in loop.nodes}
    needed: set[int] = set()
    stack = list(kept_outputs)
    while stack:
        v = stack.pop()
        node = by_out.get(id(v))
        if node is None or id(v) in needed:
            continue
        needed.add(id(v))
        stack.extend(node.inputs)
    if not kept_outputs:
        return None
    kept = Loop(loop.shape, loop.position, loop.reduce_axes)
    kept.nodes = [node for node in loop.nodes if id(node.out) in needed]
    kept.level = {k: level for k, level in loop.level.items() if k in needed}
    kept.outputs = kept_outputs
    read = {id(v) for node in kept.nodes for v in node.inputs}
    kept.inputs = [v for v in loop.inputs if id(v) in read]
    return kept


@dataclass
class Form:
    """A fused loop's parts, for its kernel (codegen.products): X's rows are `matrix`'s
    (`transposed`: its columns, X = matrix.T), z = X @ `vector`, r's `cone` of nodes,
    `total` = X.T @ r."""

    matrix: Var
    transposed: bool
    vector: Var
    z: Var
    cone: list[Node]
    r: Var
    total: Var


def form(loop: Loop) -> Form | None:
    """The parts of `loop` when it is one `read_once` made (two matmul nodes), else None."""
    products = [node for node in loop.nodes if node.op.name == "matmul"]
    if len(products) != 2:
        return None
    made = {id(node.out): node for node in loop.nodes}
    for first in product(products[0], made):
        for second in product(products[1], made):
            if second.matrix is not first.matrix or second.along == first.along:
                continue
            z = first.node.out
            spread = [n for n in loop.nodes if n.op.name == "reshape" and n.inputs[0] is z]
            views = {id(node) for node in [*first.views, *second.views, *products, *spread]}
            cone = [node for node in loop.nodes if id(node) not in views]
            transposed = first.along == "columns"
            z, r = (spread[0].out if spread else z), second.vector
            return Form(first.matrix, transposed, first.vector, z, cone, r, second.node.out)
    return None
