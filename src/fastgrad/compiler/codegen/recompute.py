"""Recompute or store: which elem values a multi-pass loop (a layer norm, a softmax and
their gradients) keeps in a row-sized scratch buffer for its later passes instead of
computing them again. A value is stored when what a later pass would spend recomputing it
(its op and the earlier values only it needs, weighted: a transcendental function costs
~20 multiplies) exceeds writing it once and reading it back (one row stays in cache)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fastgrad.compiler.codegen.source import closure
from fastgrad.compiler.fusion import REDUCTIONS
from fastgrad.core.ir import Node

# Costs in multiplies (throughput, vectorized).
STORE_COST = 4  # one store in the pass that computes it, one load in each later pass
_CALL = 20  # tanh, exp, log, sin...: range reduction and a polynomial
_SLOW = 4  # a division, a square root
_POW = 40  # a scalar pow: a library call that does not vectorize
_CHEAP_CALLS = frozenset({"abs", "maximum", "minimum", "floor", "ceil", "rint", "isinf",
                          "isfinite"})  # fmt: skip


def op_cost(node: Node, reduced_power: bool) -> int:
    """What computing `node` once costs, in multiplies; `reduced_power`: a power the
    kernel writes as multiplies (codegen.powers)."""
    name, loop = node.op.name, node.op.loop or ""
    if name in ("broadcast_to", "reshape") or name in REDUCTIONS:
        return 0
    if name == "power":
        return 3 if reduced_power else _POW
    if node.op.extra.get("positional"):
        return _CALL  # a counter-based random sample: a few rounds of integer mixing
    if loop.startswith("call:"):
        fn = loop[5:]
        return 1 if fn in _CHEAP_CALLS else _SLOW if fn == "sqrt" else _CALL
    return _SLOW if "/" in loop else 1


def choose_stored(
    nodes: list[Node],
    level: dict[int, str],
    phase: dict[int, int],
    targets: Sequence[list[Node]],
    cost: Callable[[Node], int],
) -> set[int]:
    """Ids of the elem values to store. `targets[p]`: what pass p computes (its outputs
    and reductions). Greedy, latest value first: a value a later pass needs is stored if
    recomputing it (with what is already stored loaded) costs more than STORE_COST."""
    by_id = {id(n.out): n for n in nodes}
    order = {id(n.out): k for k, n in enumerate(nodes)}
    stored: set[int] = set()
    for p in range(1, len(targets)):
        while True:
            cut = {k for k in stored if phase[k] < p}
            earlier = {k for k in closure(targets[p], nodes, level, cut) if phase[k] < p}
            chosen = None
            for k in sorted(earlier - cut, key=order.__getitem__, reverse=True):
                cone = closure([by_id[k]], nodes, level, cut) & earlier
                if sum(cost(by_id[j]) for j in cone - cut) > STORE_COST:
                    chosen = k
                    break
            if chosen is None:
                break
            stored.add(chosen)
    return stored
