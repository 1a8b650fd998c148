"""Describe a compiled function in words: its kernels, what each computes and recomputes,
and what stop_gradient kept out of the backward pass."""

from __future__ import annotations

from fastgrad.compiler.fusion import Call, Loop
from fastgrad.core.ir import Graph, consumers
from fastgrad.runtime.executable import Executable, _KernelStep


def stop_gradient_cones(graph: Graph) -> list[tuple[str, list[str]]]:
    """For each stop_gradient: its name, and the ops whose only use is to feed it.

    No cotangent reaches those ops, so differentiation built nothing for them.
    """
    users = consumers(graph)
    by_out = {id(n.out): n for n in graph.nodes}
    out = []
    for sg in graph.nodes:
        if sg.op.name != "stop_gradient":
            continue
        cone: set[int] = set()
        frontier = [by_out[id(v)] for v in sg.inputs if id(v) in by_out]
        while frontier:
            n = frontier.pop()
            if id(n.out) in cone or n.op.name == "const":
                continue
            if all(u is sg or id(u.out) in cone for u in users.get(id(n.out), [])):
                cone.add(id(n.out))
                frontier.extend(by_out[id(v)] for v in n.inputs if id(v) in by_out)
        ops = [n.op.name for n in graph.nodes if id(n.out) in cone]
        out.append((sg.params.get("name") or "unnamed", ops))
    return out


def explain(traced_graph: Graph, executable: Executable) -> str:
    loops = [s for s in executable.steps if isinstance(s, Loop)]
    calls = [s for s in executable.steps if isinstance(s, Call)]
    lines = [
        f"{len(executable.steps)} steps: {len(loops)} fused loop(s), {len(calls)} library call(s)"
    ]
    sources = {id(s.loop): s.source for s in executable.plan if isinstance(s, _KernelStep)}
    for k, step in enumerate(executable.steps, 1):
        if isinstance(step, Call):
            lines.append(f"  {k}. call {step.node.op.name} -> {step.node.out.aval}")
            continue
        axes = f", reducing axes {step.reduce_axes} per row" if step.reduce_axes else ""
        outs = ", ".join(str(v.aval) for v in step.outputs)
        lines.append(f"  {k}. loop over {step.shape}{axes} -> {outs}")
        source = sources.get(id(step))
        if source is None:  # runtime.matmul.fold_accumulations
            lines.append("       a sum of matmuls: accumulated by BLAS, no loop")
            continue
        lines.append(f"       ops: {', '.join(source.ops)}")
        lines.append(
            f"       reads {len(source.inputs)} array(s), writes {len(source.outputs)}"
            + (" (flat)" if source.flat else "")
        )
        if source.recomputed:
            lines.append(f"       recomputed instead of stored: {', '.join(source.recomputed)}")
    for name, ops in stop_gradient_cones(traced_graph):
        pruned = ", ".join(ops) if ops else "nothing upstream"
        lines.append(f"stop_gradient {name!r}: no gradient built for {pruned}")
    return "\n".join(lines)
