"""Print a graph as readable pseudo-code: infix operators, slices as `x[a:b]`, scalar
constants inline, one node a line."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fastgrad.core.ir import Graph


def _scalar_text(value: np.ndarray) -> str:
    return str(value[()])  # NumPy's shortest round-trip text for the value's own dtype


def format_graph(graph: Graph, title: str = "graph") -> str:
    """Render a graph as readable pseudo-code, one node a line."""
    names: dict[int, str] = {}
    used: set[str] = set()

    def fresh(hint: str | None) -> str:
        base = hint or "t"
        name = base if base not in used and not base[-1].isdigit() else f"{base}{len(used)}"
        while name in used:
            name = f"{base}_{len(used)}"
        used.add(name)
        return name

    letters = iter(
        [chr(c) for c in range(ord("a"), ord("z") + 1)]
        + [a + chr(c) for a in "abcdefghijklmnopqrstuvwxyz" for c in range(ord("a"), ord("z") + 1)]
    )

    def auto_name() -> str:
        for cand in letters:
            if cand not in used:
                used.add(cand)
                return cand
        return fresh(None)

    for v in graph.inputs:
        names[id(v)] = fresh(v.hint or "x")
    inline: dict[int, str] = {}
    lines = []
    for node in graph.nodes:
        if node.op.name == "const" and node.out.aval.ndim == 0:
            inline[id(node.out)] = _scalar_text(node.params["value"])
            continue
        args = [inline.get(id(v)) or names[id(v)] for v in node.inputs]
        if node.op.format is not None:
            rhs = node.op.format(args, node.params)
        else:
            shown = {k: v for k, v in node.params.items() if not k.startswith("_")}
            rhs = f"{node.op.name}({', '.join(args + [f'{k}={v!r}' for k, v in shown.items()])})"
        names[id(node.out)] = auto_name()
        lines.append(f"    {names[id(node.out)]}: {node.out.aval} = {rhs}")
    head_args = ", ".join(f"{names[id(v)]}: {v.aval}" for v in graph.inputs)
    outs = [inline.get(id(v)) or names[id(v)] for v in graph.outputs]
    ret = ", ".join(outs) + ("," if len(outs) == 1 else "")
    return "\n".join([f"{title}({head_args}):", *lines, f"    return ({ret})"])
