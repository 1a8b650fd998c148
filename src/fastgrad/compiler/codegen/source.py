"""The text pieces a kernel is made of: scalar type names, reduction accumulators (with the
NaN tracking of max/min), an indenting line writer, the module header, and `KernelSource`,
what the generator gives back (the source and how to call it)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastgrad.compiler.codegen.outline import NAME as outlined_name
from fastgrad.compiler.codegen.outline import outline_chunks
from fastgrad.core.ir import Node, Var

_TYPE = {
    "float64": "f64", "float32": "f32", "int64": "np.int64", "int32": "np.int32",
    "int16": "np.int16", "int8": "np.int8", "uint64": "np.uint64", "uint32": "np.uint32",
    "uint16": "np.uint16", "uint8": "np.uint8", "bool": "np.bool_",
}  # fmt: skip


def scalar_type(dtype: np.dtype) -> str:
    return _TYPE[dtype.name]


def wrapped(expression: str, dtype: np.dtype) -> str:
    """`expression` (of `dtype`) as NumPy computes it: Numba computes narrow integers in 64
    bits, NumPy wraps each result to its type (uint8 200 * 200 is 64), which a store does
    but a sum reading the value in the same loop would not; NumPy's bool results are 0 or 1
    (True + True is True, where Numba adds to 2)."""
    if dtype.kind == "b":
        return f"(({expression}) != 0)"
    if dtype.kind in "iu" and dtype.itemsize < 8:
        return f"{scalar_type(dtype)}({expression})"
    return expression


def trips(shape: tuple[int, ...], a: int) -> str:
    """The trip count of a kernel's loop over axis `a`: a literal 1 for an axis of size 1.
    Every access then reads index 0 there, and a loop of a runtime count around a body
    that never changes with it (reductions marked reassociable inside) sent LLVM's loop
    vectorizer into a compile of minutes: more than 88 s of CPU, stopped, against 3 s
    with the count known (a (3, 1) loop of three tanh_f64 and two sums)."""
    return "np.uint64(1)" if shape[a] == 1 else f"np.uint64(n{a})"


def chunk_loop(a: int) -> str:
    """The loop over chunk c's part of axis `a`, bounds from c even where the axis has
    size 1: with a literal count there, the chunk loop's body never changes with c, and a
    (1,) loop of two power_f64 calls and two sums sent LLVM's loop vectorizer into a
    compile of minutes (492 s) just as `trips` describes for inner axes."""
    return (
        f"for i{a} in range(np.uint64((c * n{a}) // nchunks), "
        f"np.uint64(((c + 1) * n{a}) // nchunks)):"
    )


def accumulator_dtype(node: Node) -> np.dtype:
    """The dtype a reduction accumulates in: float64 for float32 sums, the result's
    otherwise. A float32 sum kept in float32 lost up to 15x NumPy's pairwise accuracy (an
    all-axes sum of 4096x1024 normal values: 7.8e-6 relative, NumPy 5.2e-7); widened on
    load, it is the float64 sum rounded once, at the same speed where the loop is bound
    by memory (docs/conventions.md, "Accuracy of reductions";
    tests/test_reduction_accuracy.py). Max and min round nothing; a product's relative
    error grows as n eps in any order, as NumPy's does."""
    dtype = node.out.aval.dtype
    return np.dtype(np.float64) if node.op.name == "sum" and dtype == np.float32 else dtype


def accumulator_type(node: Node) -> str:
    return scalar_type(accumulator_dtype(node))


def accumulator_init(node: Node) -> str:
    return reduction_init(node.op.name, accumulator_dtype(node))


def widen(node: Node, x: str) -> str:
    """A value of the reduction's result dtype `x` (a row value folded into a full
    reduction) in its accumulator's."""
    return f"{accumulator_type(node)}({x})" if accumulator_dtype(node) != node.out.aval.dtype else x


def narrow(node: Node, acc: str) -> str:
    """An accumulated value `acc` in the reduction's result dtype."""
    dtype = node.out.aval.dtype
    return f"{scalar_type(dtype)}({acc})" if accumulator_dtype(node) != dtype else acc


def reduction_init(reduction: str, dtype: np.dtype) -> str:
    t = scalar_type(dtype)
    if reduction == "sum":
        return f"{t}(0)"
    if reduction == "prod":
        return f"{t}(1)"
    if dtype.kind == "f":
        return f"{t}({'-' if reduction == 'max' else ''}np.inf)"
    if dtype == np.bool_:
        return "False" if reduction == "max" else "True"
    info = np.iinfo(dtype)
    return f"{t}({info.min if reduction == 'max' else info.max})"


def tracks_nan(node: Node) -> bool:
    """Float max/min reductions inside inner loops use an ordered maximum that vectorizes,
    plus a flag that records NaNs, so the result still propagates NaN as NumPy's does."""
    return node.op.name in ("max", "min") and node.out.aval.dtype.kind == "f"


def accumulate(node: Node, acc: str, x: str, flag: str | None = None) -> list[str]:
    """Statements folding `x` into `acc` (NaN flag `flag`) inside an inner loop."""
    flag = flag or f"{acc}n"
    if tracks_nan(node):
        return [f"{acc} = r{node.op.name}({acc}, {x})", f"{flag} = {flag} | ({x} != {x})"]
    return [f"{acc} = {combine(node.op.name, acc, x)}"]


def settle(node: Node, acc: str, flag: str | None = None) -> str:
    """The accumulated value, NaN if a NaN was seen."""
    if tracks_nan(node):
        return f"({acc} if not {flag or acc + 'n'} else {scalar_type(node.out.aval.dtype)}(np.nan))"
    return acc


def init_scalars(w: Writer, scalar_reductions: list[Node]) -> None:
    """Per-chunk accumulators (and NaN flags) of the full reductions."""
    for k, n in enumerate(scalar_reductions):
        w(f"s{k} = {accumulator_init(n)}")
        if tracks_nan(n):
            w(f"s{k}n = False")


def combine(reduction: str, acc: str, x: str) -> str:
    if reduction == "sum":
        return f"radd({acc}, {x})"
    if reduction == "prod":
        return f"{acc} * {x}"
    return f"{reduction}imum({acc}, {x})"


def sample_call(node: Node, key: str, axes: list[str], args: list[str]) -> tuple[str, set[str]]:
    """(expression, imports as "module:name") of a random sample's element: its op's loop
    template formatted with K0, K1 (the words of `key`, an array name), I (the C-order flat
    index from the loop indices `axes`, sizes n1, n2, ...), T and the node's params; `args`
    are the operands after the key."""
    index = f"np.uint64({axes[0]})"
    for a, i in enumerate(axes[1:], start=1):
        index = f"({index} * np.uint64(n{a}) + np.uint64({i}))"
    assert node.op.loop is not None
    module, names = node.op.extra["imports"]
    fields = {"K0": f"np.uint64({key}[0])", "K1": f"np.uint64({key}[1])", "I": index}
    t = scalar_type(node.out.aval.dtype)
    text = node.op.loop.format("", *args, T=t, **fields, **node.params)
    return f"({text})", {f"{module}:{name}" for name in names}


@dataclass
class KernelSource:
    """A kernel's module source and how to call it."""

    name: str
    source: str
    inputs: list[Var]
    scalars: list[Var]  # single-element constants, passed (in this order) before the arrays
    outputs: list[Var]
    flat: bool  # arrays are passed raveled to 1-D (0-d ones always as shape (1,))
    ops: list[str]
    recomputed: list[str] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)
    index_checks: list[Var] = field(default_factory=list)  # column indices into axis 1
    # Reduced axes lead: rows are walked in order, the kept positions split into chunks,
    # and results do not depend on the chunk count (one per thread suffices).
    column: bool = False


class Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1
        self.opened: list[int] = []  # line count when each open block began
        self.run_marks: list[int] = []  # where each open run's body begins (codegen.runs)

    def __call__(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def indent(self) -> None:
        self.depth += 1
        self.opened.append(len(self.lines))

    def dedent(self, n: int = 1) -> None:
        for _ in range(n):
            if self.opened.pop() == len(self.lines):
                self("pass")  # a block with nothing to do (e.g. a pass that only loads)
            self.depth -= 1


@functools.cache
def _module_hash(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()[:16]


def module_text(
    signature: str, lines: list[str], imports: set[str], parallel: bool, outline: bool = False
) -> str:
    """The kernel module; `imports` are vecmath names, or "module:name" from elsewhere.
    `outline`: its chunk loop in a function of its own, its arrays arguments
    (codegen.outline)."""
    module_imports = {tuple(i.split(":")) for i in imports if ":" in i}
    imports = {i for i in imports if ":" not in i}
    header = [
        '"""Generated by fastgrad: one fused loop."""',
        "import numpy as np",
        "from numba import njit, prange",
        f"from fastgrad.compiler.codegen.support import {', '.join(_SUPPORT)}",
    ]
    if imports:
        header.append(f"from fastgrad.compiler.codegen.vecmath import {', '.join(sorted(imports))}")
    for module in sorted({m for m, _ in module_imports}):
        names = sorted(n for m, n in module_imports if m == module)
        # The source is the kernel's cache key: the imported module's hash in it means a
        # change there compiles the kernel again rather than loading a stale one.
        header.append(f"from {module} import {', '.join(names)}  # {_module_hash(module)}")
    # A local named like an imported name makes it local to the whole function, and Numba
    # refuses the kernel (a fold of node 64 named `f64` did: the loop then ran NumPy).
    names = {"np", "njit", "prange", *_SUPPORT, *imports, *(n for _, n in module_imports)}
    names.add(outlined_name)
    shadowed = {m.group(1) for line in lines for m in [_ASSIGNED.match(line)] if m} & names
    if shadowed:
        raise RuntimeError(f"fastgrad internal error: a kernel's locals shadow {shadowed}")
    flags = f"parallel={parallel}, error_model='numpy', nogil=True, pipeline_class=NoAlias"
    moved = outline_chunks(signature, lines, flags) if outline else None
    if moved is not None:  # the chunk loop's function runs in parallel, not the kernel
        lines = moved
        flags = flags.replace(f"parallel={parallel}", "parallel=False")
    return "\n".join([*header, "", "", f"@njit({flags})", signature, *lines]) + "\n"


_SUPPORT = ("NoAlias", "f32", "f64", "maximum", "minimum", "radd", "rmax", "rmin")
_ASSIGNED = re.compile(r"\s*(?:for\s+)?(\w+)\s*(?:=[^=]|in\b)")


def closure(
    sinks: list[Node], nodes: list[Node], level: dict[int, str], cut: AbstractSet[int] = frozenset()
) -> set[int]:
    """Ids of the elem values needed to compute `sinks` (their own included when elem);
    values in `cut` are needed but not their inputs (they come from a scratch buffer)."""
    by_id = {id(n.out): n for n in nodes}
    needed: set[int] = set()
    stack = [s for s in sinks]
    while stack:
        n = stack.pop()
        targets = [n] if level[id(n.out)] == "elem" else []
        if level[id(n.out)] != "elem":
            targets = [by_id[id(v)] for v in n.inputs if id(v) in by_id and level[id(v)] == "elem"]
        for t in targets:
            if id(t.out) in needed:
                continue
            needed.add(id(t.out))
            if id(t.out) in cut:
                continue
            stack.extend(
                by_id[id(v)] for v in t.inputs if id(v) in by_id and level[id(v)] == "elem"
            )
    return needed
