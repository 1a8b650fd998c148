"""Loops over 3-D and larger shapes as loops over fewer axes: adjacent axes of the same kind
(kept or reduced) merged into one where every operand's layout allows it.

The row-block and column-block forms (codegen.rowblocks, codegen.columns) handle 2-D loops
only: over more axes a block's rows would need an index table, and LLVM then vectorizes
nothing. A (N, 8, 2) loop reducing axis -1 is a (N*8, 2) loop reducing axis -1, and one
reducing axis 0 is a (N, 16) column reduction (bench M4's mixture: its reductions over the
last axis of (1e6, 8, 2) ran scalar). The kernel keeps its call (the sizes and arrays of
the loop's own shape) and reshapes its operands first: no copy for C-contiguous arrays,
a copy of a non-contiguous input (never an output: the runtime allocates those)."""

from __future__ import annotations

import math

import numpy as np

from fastgrad.compiler.codegen.source import KernelSource
from fastgrad.compiler.fusion import REDUCTIONS, Loop, row_drop
from fastgrad.core.ir import Aval, Node, Var


def runs(loop: Loop) -> list[list[int]]:
    """The loop's axes in runs of adjacent axes all kept or all reduced."""
    out: list[list[int]] = []
    for a in range(len(loop.shape)):
        if out and (a in loop.reduce_axes) == (out[-1][0] in loop.reduce_axes):
            out[-1].append(a)
        else:
            out.append([a])
    return out


def _merged_dims(
    shape: tuple[int, ...], loop: Loop, groups: list[list[int]]
) -> list[list[int]] | None:
    """For a value of `shape`: per merged dim, the loop axes it spans (empty: a broadcast
    dim of size 1); None where a run mixes broadcast and full axes. A value of the loop's
    row shape without the reduced axes spans the kept axes, any other its loop's trailing
    axes (as codegen.loops addresses them)."""
    drop = row_drop(loop.shape, loop.reduce_axes)
    kept = [a for a in range(len(loop.shape)) if a not in loop.reduce_axes]
    axes = kept if shape == drop and shape != loop.shape else list(range(len(loop.shape)))
    if len(shape) > len(axes):
        return None
    at = dict(zip(axes[len(axes) - len(shape) :], shape, strict=True))
    dims: list[list[int]] = []
    for run in groups:
        covered = [a for a in run if a in at]
        if not covered:
            if any(a in axes for a in run) and dims:
                return None  # a gap inside the value's axes
            continue
        if all(at.get(a, 1) == loop.shape[a] for a in run):
            dims.append(run)  # axes it lacks count where the loop's are of size 1
        elif all(at.get(a, 1) == 1 for a in run):
            dims.append([])
        else:
            return None  # broadcast along part of the run only
    return dims


def merge(
    loop: Loop, constants: dict[int, np.ndarray]
) -> tuple[Loop, dict[int, Var], dict[int, list[list[int]]], dict[int, np.ndarray]] | None:
    """(the merged loop, new var -> old var, old var -> its merged dims, the constants by
    new var) or None when no
    axes merge (fewer than 3 axes, row picks and random samples, which
    index by axis, or an operand whose strides do not merge)."""
    groups = runs(loop)
    if (
        len(loop.shape) < 3
        or len(groups) == len(loop.shape)
        or any(n.op.name in ("gather", "scatter_add") or n.op.extra.get("positional")
               for n in loop.nodes)
    ):  # fmt: skip
        return None
    shape = tuple(math.prod(loop.shape[a] for a in run) for run in groups)
    reduce_axes = tuple(k for k, run in enumerate(groups) if run[0] in loop.reduce_axes)
    fresh: dict[int, Var] = {}
    dims_of: dict[int, list[list[int]]] = {}
    back: dict[int, Var] = {}

    def new(v: Var) -> Var | None:
        if id(v) in fresh:
            return fresh[id(v)]
        if id(v) in constants and constants[id(v)].size == 1 or v.aval.shape == ():
            dims: list[list[int]] | None = [[] for _ in v.aval.shape]
        else:
            dims = _merged_dims(v.aval.shape, loop, groups)
        if dims is None:
            return None
        s = tuple(math.prod(loop.shape[a] for a in d) for d in dims)
        if id(v) in constants and constants[id(v)].size == 1:
            s = tuple(1 for _ in v.aval.shape)
        u = Var(Aval(s, v.aval.dtype, v.aval.weak), v.hint)
        fresh[id(v)], dims_of[id(v)], back[id(u)] = u, dims, v
        return u

    nodes = []
    for n in loop.nodes:
        ins = [new(v) for v in n.inputs]
        out = new(n.out)
        if out is None or any(u is None for u in ins):
            return None
        params = dict(n.params)
        if n.op.name in REDUCTIONS and params.get("axis"):
            axis = {a % len(loop.shape) for a in params["axis"]}
            params["axis"] = tuple(k for k, run in enumerate(groups) if axis & set(run))
        if "shape" in params:
            params["shape"] = out.aval.shape
        nodes.append(Node(n.op, ins, params, out))
    outer = [new(v) for v in (*loop.inputs, *loop.outputs)]
    if any(u is None for u in outer):
        return None
    merged = Loop(
        shape,
        loop.position,
        reduce_axes,
        nodes,
        {id(fresh[k]): lv for k, lv in loop.level.items() if k in fresh},
        [fresh[id(v)] for v in loop.inputs],
        [fresh[id(v)] for v in loop.outputs],
    )
    known = {id(fresh[k]): constants[k] for k in constants if k in fresh}
    return merged, back, dims_of, known


def relabel(
    source: KernelSource, back: dict[int, Var], dims_of: dict[int, list[list[int]]], loop: Loop
) -> KernelSource:
    """The merged loop's kernel called as the original loop's: sizes s0, s1, ... of the
    original axes and arrays of their own shapes (0-d ones as (1,)), reshaped first."""
    signature = next(line for line in source.source.splitlines() if line.startswith("def "))
    name, args = signature[4:-2].split("(", 1)
    args = [a.strip() for a in args.split(",")]
    sizes = [a for a in args if a.startswith("n") and a[1:].isdigit()]
    groups = runs(loop)
    assert len(sizes) == len(groups)
    prologue = [f"    n{k} = {' * '.join(f's{a}' for a in run)}" for k, run in enumerate(groups)]
    renamed = []
    arrays = [a for a in args if a[0] in "ao" and a[1:].isdigit()]
    by_name = dict(zip(arrays, [*source.inputs, *source.outputs], strict=True))
    for a in args:
        if a in by_name:
            v = by_name[a]
            dims = dims_of[id(back[id(v)])]
            shape = ", ".join(" * ".join(f"s{x}" for x in d) if d else "1" for d in dims)
            shape = f"({shape},)" if len(dims) == 1 else f"({shape})"
            raw = f"{a}_"
            if a[0] == "a" and dims:
                prologue.append(f"    {a} = np.ascontiguousarray({raw}).reshape({shape})")
            elif dims:
                prologue.append(f"    {a} = {raw}.reshape({shape})")
            else:
                prologue.append(f"    {a} = {raw}")
            renamed.append(raw)
        elif a in sizes:
            continue
        else:
            renamed.append(a)
    head = [f"s{a}" for a in range(len(loop.shape))]
    new_signature = f"def {name}({', '.join([*head, *renamed])}):"
    text = source.source.replace(signature, "\n".join([new_signature, *prologue]), 1)
    source.source = text
    source.inputs = [back[id(v)] for v in source.inputs]
    source.scalars = [back[id(v)] for v in source.scalars]
    source.outputs = [back[id(v)] for v in source.outputs]
    source.index_checks = [back[id(v)] for v in source.index_checks]
    return source
