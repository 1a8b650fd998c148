"""Work of a scan's steps done for all steps at once, outside the compiled loop.

After it: a carry that only adds up a batch sum, such as a weight's gradient in the
backward scan of a VJP (`acc + x_t.T @ g_t`, `acc + sum(g_t, 0)`), is summed as one
product over the stacked operands, `acc += X.T @ G` with X and G of shape (T * B, .):
one gemm in place of T small ones and T adds (float32 (128, 6400) @ (6400, 128) on one
thread: 2.9 ms, against 30 us for each of the 200 (128, 32) @ (32, 128) it replaces).
An unbatched step's `acc + g_t @ h_t.T` of columns (the weight gradient of `W @ h`) is
`acc += G.T @ H` likewise: unbatched RNN, f32, H = 256, T = 1000, value_and_grad 125 ->
13 ms of CPU (an outer product and its add per step were most of the backward loop).
Before it: a stacked input's slice times a const (`x_t @ w`, also `w @ x_t` of a vector
x_t) is one (T * B, D) @ (D, H), and a const's transpose that a product reads
(`g_t @ w.T`) is copied contiguous once: BLAS took 19.8 us for a float32 (32, 128) @
(128, 128) with the transposed view, 10.5 with the copy.
A transpose of a transpose is folded first (the VJP of `h @ w.T` reads `w.T.T` and sums
the transpose of `h_t.T @ g_t`, which is `g_t.T @ h_t`): the body then reads `w` itself,
and its weight gradient is summed after the loop like `w`'s.
The scan's graph is unchanged (its derivatives too): this is how the runtime runs it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastgrad.compiler.passes import fold_transposes
from fastgrad.core.ir import Aval, Graph, Node, Var, live_nodes
from fastgrad.transforms.scan import ScanCall, scan_loop

# The operands stacked for the sums may take up to this many bytes; beyond it (a very
# long loop, where memory matters more: checkpoint) the accumulators stay in the loop.
STACK_BUDGET = 64 << 20


@dataclass(frozen=True)
class Part:
    """One term of a step's batch sum: P_t.T @ Q_t (`kind` "matmul", `operands` P and Q)
    or the sum of E_t over `axes` (`kind` "sum", operand E). An operand is a stacked input
    of the scan (its index among them) or, when negative, the added stacked output
    -1 - index."""

    kind: str  # also "outer": P_t @ Q_t.T of columns (`W @ h`'s weight gradient)
    operands: tuple[int, ...]
    axes: tuple[int, ...] = ()

    def total(self, shape: tuple[int, ...], xs: Sequence[Any], added: Sequence[Any]) -> Any:
        stacks = [xs[i] if i >= 0 else added[-1 - i] for i in self.operands]
        if self.kind == "matmul":
            p, q = (s.reshape(-1, s.shape[-1]) for s in stacks)
            return np.matmul(p.T, q)  # NumPy finds the operands' addresses faster than ctypes
        if self.kind == "outer":  # columns P_t (m, 1), Q_t (k, 1): sum of P_t @ Q_t.T
            p, q = (s.reshape(len(s), s.shape[1]) for s in stacks)
            return np.matmul(p.T, q)
        return stacks[0].sum(axis=(0, *(a + 1 for a in self.axes))).reshape(shape)


@dataclass(frozen=True)
class Sum:
    """Carry `carry` is its initial value plus, over the steps, the sum of `parts`."""

    carry: int
    parts: tuple[Part, ...]

    def add_total(self, init: np.ndarray, xs: Sequence[Any], added: Sequence[Any]) -> Any:
        total = init
        for part in self.parts:
            total = np.add(total, part.total(init.shape, xs, added), dtype=init.dtype)
        return np.array(total, copy=True) if total is init else total


@dataclass(frozen=True)
class Product:
    """A stacked input of the inner scan computed before the loop: the scan's stacked
    input `x` (B, D per step, or a vector D) times its const `w` (D, H), as one
    (T * B, D) @ (D, H); with `left`, `w` (H, D) times the vector x_t (`W @ x_t`), as
    (T, D) @ w.T. `shape`: the product's per step."""

    x: int
    w: int
    shape: tuple[int, ...]
    left: bool = False

    def stack(self, consts: Sequence[Any], xs: Sequence[Any]) -> Any:
        x, w = xs[self.x], consts[self.w]
        flat = np.matmul(x.reshape(-1, x.shape[-1]), w.T if self.left else w)
        return flat.reshape(len(x), *self.shape)


@dataclass
class HoistedScan:
    """`call` run as the scan `inner`: its body without the summed carries, stacking the
    sums' operands as its last `n_added` outputs, reading the stacked inputs `xs_read`
    and then the products computed before the loop."""

    call: ScanCall
    inner: ScanCall
    sums: list[Sum]
    n_added: int
    xs_read: list[int]
    products: list[Product]
    transposed: list[tuple[int, tuple[int, ...]]]  # (const, axes): consts after the consts
    # (stacked output, axes): stacked by the loop untransposed, transposed after it
    relaid: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)

    @property
    def as_rows(self) -> bool:
        """Whether its work around the loop has rows in the plan interpreter
        (runtime.loop_row): all but a sum over axes that are not leading (NumPy sums
        those pairwise)."""
        return all(
            part.kind != "sum" or part.axes == tuple(range(len(part.axes)))
            for s in self.sums
            for part in s.parts
        )

    def relay(self, ys: Sequence[Any]) -> list[Any]:
        """The scan's stacked outputs from the inner scan's: those `relaid` transposed
        (C-contiguous, as a stack of the transposed rows would be)."""
        ys = list(ys)
        for j, axes in self.relaid:
            ys[j] = np.ascontiguousarray(ys[j].transpose(0, *(a + 1 for a in axes)))
        return ys

    def run(
        self,
        arrays: Sequence[Any],
        body: Callable[[list[Any]], list[Any]],
        empty: Callable[[int, Aval], np.ndarray] | None = None,
        private: Collection[int] = (),
        loop: Callable[..., list[Any] | None] | None = None,
        handed: Collection[int] | None = None,
    ) -> list[Any]:
        call, summed = self.call, {s.carry for s in self.sums}
        nc, ncar = call.n_consts, call.n_carry
        kept = [k for k in range(ncar) if k not in summed]
        consts, xs = arrays[:nc], arrays[nc + ncar :]
        stacked = [*(xs[i] for i in self.xs_read), *(p.stack(consts, xs) for p in self.products)]
        fixed = [np.ascontiguousarray(consts[i].transpose(axes)) for i, axes in self.transposed]
        ins = [*consts, *fixed, *(arrays[nc + k] for k in kept), *stacked]
        n_ys = len(call.body.outputs) - ncar  # then the added stacks, which no caller sees
        private = {*private, *range(n_ys, n_ys + self.n_added)}
        outs = scan_loop(self.inner, ins, body, empty, private, loop, handed)
        added = outs[len(outs) - self.n_added :]
        carries: list[Any] = [None] * ncar
        for k, c in zip(kept, outs, strict=False):
            carries[k] = c
        for s in self.sums:
            carries[s.carry] = s.add_total(arrays[nc + s.carry], xs, added)
        return [*carries, *self.relay(outs[len(kept) : len(outs) - self.n_added])]


def hoist(call: ScanCall) -> HoistedScan | None:
    """`call` with its carries that add up a batch sum per step summed after the loop, and
    its products of a stacked input by a const and its consts' transposes that products
    read computed before it; None when it has none of them (or their stacks would exceed
    STACK_BUDGET)."""
    body, nc, ncar = fold_transposes(call.body), call.n_consts, call.n_carry
    made = {id(n.out): n for n in body.nodes}
    uses = Counter(id(v) for n in body.nodes for v in n.inputs)
    uses.update(id(v) for v in body.outputs)
    at = {id(v): i for i, v in enumerate(body.inputs)}
    added: list[Var] = []
    sums: list[Sum] = []
    budget = STACK_BUDGET
    for k in range(ncar):
        carry_in, carry_out = body.inputs[nc + k], body.outputs[k]
        if uses[id(carry_out)] != 1:  # also a per-step output, or read by the body
            continue
        term = _added_term(made.get(id(carry_out)), carry_in, uses)
        found = _batch_sum(made.get(id(term)) if term is not None else None, made)
        if found is None or not carry_out.aval.is_float:
            continue
        values = [v for _, part_values, _ in found for v in part_values]
        if any(at.get(id(v), nc + ncar) < nc + ncar for v in values):
            continue  # a const or a carry: not stacked
        new = [v for v in {id(v): v for v in values}.values() if id(v) not in at]
        new = [v for v in new if all(v is not w for w in added)]
        cost = sum(_stack_bytes(v, call.length) for v in new)
        if cost > budget:
            continue
        budget -= cost
        added += new
        parts = [
            Part(kind, tuple(_operand(v, at, added, nc + ncar) for v in part_values), axes)
            for kind, part_values, axes in found
        ]
        sums.append(Sum(k, tuple(parts)))
    summed = {s.carry for s in sums}
    outputs = [v for k, v in enumerate(body.outputs[:ncar]) if k not in summed]
    outputs += [*body.outputs[ncar:], *added]
    # A stacked output that is a stacked input transposed (`x_t.T`, in a gradient of a
    # gradient): the loop stacks the input's rows as they are (each iteration's output
    # a view of another layout, which the LOOP does not copy: its Python loop ran), and
    # the stack is transposed once after it.
    relaid: list[tuple[int, tuple[int, ...]]] = []
    for j, v in enumerate(body.outputs[ncar:]):
        node = made.get(id(v))
        if (
            node is not None
            and node.op.name == "transpose"
            and at.get(id(node.inputs[0]), 0) >= nc + ncar
        ):
            outputs[ncar - len(summed) + j] = node.inputs[0]
            relaid.append((j, tuple(node.params["axes"])))
    products, hoisted = [], set()
    transposed: list[Node] = []
    multiplied = {id(v) for n in body.nodes if n.op.name == "matmul" for v in n.inputs}
    for node in live_nodes(body.nodes, outputs):
        found_product = _stacked_product(node, at, made, nc, ncar)
        if found_product is not None and _stack_bytes(node.out, call.length) <= budget:
            budget -= _stack_bytes(node.out, call.length)
            products.append(found_product)
            hoisted.add(id(node.out))
        elif (
            node.op.name == "transpose"
            and at.get(id(node.inputs[0]), nc) < nc
            and id(node.out) in multiplied
        ):  # BLAS takes a contiguous operand ~2x faster: copied once, before the loop
            transposed.append(node)
            hoisted.add(id(node.out))
    if not sums and not products and not transposed and not relaid and body is call.body:
        return None
    nodes = live_nodes([n for n in body.nodes if id(n.out) not in hoisted], outputs)
    read = {id(v) for n in nodes for v in n.inputs} | {id(v) for v in outputs}
    xs_read = [
        i for i in range(len(body.inputs) - nc - ncar) if id(body.inputs[nc + ncar + i]) in read
    ]
    inputs = [*body.inputs[:nc], *(n.out for n in transposed)]
    inputs += [v for k, v in enumerate(body.inputs[nc : nc + ncar]) if k not in summed]
    inputs += [body.inputs[nc + ncar + i] for i in xs_read]
    copied = {id(n.out) for n in transposed}
    inputs += [n.out for n in body.nodes if id(n.out) in hoisted and id(n.out) not in copied]
    graph = Graph(inputs, nodes, outputs).verify()
    inner = ScanCall(graph, nc + len(transposed), ncar - len(sums), call.length, call.reverse)
    fixed = [(at[id(n.inputs[0])], tuple(n.params["axes"])) for n in transposed]
    return HoistedScan(call, inner, sums, len(added), xs_read, products, fixed, relaid)


def _stacked_product(
    node: Node, at: dict[int, int], made: dict[int, Node], nc: int, ncar: int
) -> Product | None:
    """`node` as a Product when it is a 2-D stacked input's slice times a 2-D const, or a
    1-D one's made a row (`x_t @ w`) or a column (`w @ x_t`)."""
    if node.op.name != "matmul" or any(v.aval.ndim != 2 for v in node.inputs):
        return None
    if np.result_type(*(v.aval.dtype for v in node.inputs)) != node.out.aval.dtype:
        return None
    shape = node.out.aval.shape
    for left in (False, True):
        w, x = node.inputs[::-1] if not left else node.inputs
        if not 0 <= at.get(id(w), -1) < nc:
            continue
        vector = made.get(id(x))
        if vector is not None and vector.op.name == "reshape" and vector.inputs[0].aval.ndim == 1:
            if x.aval.shape[1 if left else 0] != 1:
                continue
            x = vector.inputs[0]  # the vector x_t, a row (1, D) or a column (D, 1)
        elif left:
            continue
        i = at.get(id(x), -1)
        if i >= nc + ncar:
            return Product(i - nc - ncar, at[id(w)], shape, left)
    return None


def _stack_bytes(v: Var, length: int) -> int:
    return length * v.aval.dtype.itemsize * int(np.prod(v.aval.shape))


def _added_term(node: Node | None, carry: Var, uses: Counter[int]) -> Var | None:
    """The term `node` adds to `carry`, when it is `carry + term` and nothing else reads
    `carry`."""
    if node is None or node.op.name != "add" or uses[id(carry)] != 1:
        return None
    a, b = node.inputs
    term = b if a is carry else a if b is carry else None
    if term is None or term.aval.shape != node.out.aval.shape:
        return None
    return term if term.aval.dtype == node.out.aval.dtype else None


def _batch_sum(node: Node | None, made: dict[int, Node]) -> list[Any] | None:
    """The terms of `node` as a batch sum, each ("matmul", (P, Q), ()) for `P.T @ Q` of
    2-D values or ("sum", (E,), axes) for a sum of E over `axes` (maybe reshaped), when it
    is one term or the sum of such terms (a weight used twice in a step); else None."""
    if node is not None and node.op.name == "reshape":
        node = made.get(id(node.inputs[0]))
    if node is None:
        return None
    if node.op.name == "add" and all(v.aval.shape == node.out.aval.shape for v in node.inputs):
        terms = [_batch_sum(made.get(id(v)), made) for v in node.inputs]
        return None if None in terms else [t for found in terms if found for t in found]
    if node.op.name == "sum":
        e = node.inputs[0]
        axis = node.params.get("axis")
        axes = tuple(range(e.aval.ndim)) if axis is None else tuple(axis)
        return [("sum", (e,), axes)]
    if node.op.name == "matmul":
        pt, q = node.inputs
        t = made.get(id(pt))
        if t is None or t.op.name != "transpose" or tuple(t.params.get("axes", ())) != (1, 0):
            return _outer(node, made)
        p = t.inputs[0]
        if p.aval.ndim == 2 and q.aval.ndim == 2 and p.aval.shape[0] == q.aval.shape[0]:
            return [("matmul", (p, q), ())]
    return None


def _outer(node: Node, made: dict[int, Node]) -> list[Any] | None:
    """`P @ Q.T` of columns P (m, 1) and Q (k, 1) (the weight gradient of `W @ h`) as the
    term ("outer", (P, Q), ())."""
    p, qt = node.inputs
    t = made.get(id(qt))
    if t is None or t.op.name != "transpose" or tuple(t.params.get("axes", ())) != (1, 0):
        return None
    q = t.inputs[0]
    if p.aval.ndim == 2 and q.aval.ndim == 2 and p.aval.shape[1] == q.aval.shape[1] == 1:
        return [("outer", (p, q), ())]
    return None


def _operand(v: Var, at: dict[int, int], added: list[Var], first_stacked: int) -> int:
    """Where a sum reads `v`: its index among the stacked inputs, or -1 - its index among
    the added stacked outputs."""
    return at[id(v)] - first_stacked if id(v) in at else -1 - _index(added, v)


def _index(values: list[Var], v: Var) -> int:
    return next(i for i, w in enumerate(values) if w is v)
