"""The package keeps its shape: imports point only down the layers, no two modules import
each other in a circle, and no module grows past ~600 lines.

docs/architecture.md describes the layers; LAYERS below is the same list, lowest first.
Imports under `if TYPE_CHECKING:` are for annotations only and are not counted.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fastgrad

PACKAGE = Path(fastgrad.__file__).parent
MAX_LINES = 600

# Lowest first. A module may import from its own layer and the layers before it.
LAYERS = [
    ("core", ["fastgrad.core"]),
    ("ops", ["fastgrad.ops"]),
    ("namespaces", ["fastgrad.numpy", "fastgrad.scipy"]),
    ("transforms", ["fastgrad.transforms"]),
    ("compiler", ["fastgrad.compiler"]),
    ("runtime", ["fastgrad.runtime"]),
    ("api", ["fastgrad.api"]),
    ("top", ["fastgrad", "fastgrad.debug", "fastgrad.testing", "fastgrad.cli", "fastgrad.dask"]),
]


def module_name(path: Path) -> str:
    parts = ["fastgrad", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    best, depth = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(path: Path) -> set[str]:
    """The fastgrad modules `path` imports, at any depth (inside functions too)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "fastgrad")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "fastgrad":
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in MODULES else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


GRAPH = {name: imported_modules(path) for name, path in MODULES.items()}


def test_every_module_belongs_to_a_layer():
    for name in MODULES:
        layer_of(name)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module):
    here = layer_of(module)
    upward = [
        f"{target} ({LAYERS[layer_of(target)][0]})"
        for target in sorted(GRAPH[module])
        if layer_of(target) > here
    ]
    assert not upward, f"{module} ({LAYERS[here][0]}) imports from a later layer: {upward}"


def test_no_import_cycles():
    # A package's __init__ runs before its submodules: a submodule importing a sibling
    # is not a cycle through the package, so edges into a module's own parents are dropped.
    def edges(module: str) -> set[str]:
        return {t for t in GRAPH[module] if not module.startswith(t + ".") and t in GRAPH}

    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges(module)):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                walk(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            walk(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{module} has {lines} lines (limit {MAX_LINES}): split it by what its parts do"
    )


def test_the_layer_list_matches_the_architecture_note():
    note = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            short = prefix.removeprefix("fastgrad.")
            if prefix != "fastgrad":
                assert f"`{short}" in note or f"`{prefix}" in note, (name, prefix)


def test_nothing_but_fastgrad_dask_imports_dask():
    # Dask is an optional extra: importing fastgrad and its namespaces must not need it.
    for module, path in MODULES.items():
        if not module.startswith("fastgrad.dask"):
            tree = ast.parse(path.read_text())
            names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            assert not [n for n in names if n.split(".")[0] in ("dask", "distributed")], module
    code = "import sys, fastgrad, fastgrad.numpy; print('dask' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


LAZY_LAYERS = """
import sys, warnings
import fastgrad as fg
loaded = sorted(m for m in sys.modules if m.startswith(("fastgrad.compiler", "fastgrad.runtime")))
assert not loaded, f"import fastgrad loaded {loaded}"
fg.jit(lambda x: x)
assert "fastgrad.runtime.executable" in sys.modules and "numba" not in sys.modules
from fastgrad.compiler.machine_code import CacheWarning
assert fg.CacheWarning is CacheWarning and "CacheWarning" in dir(fg)
try:
    fg.no_such_name
except AttributeError as error:
    assert "no_such_name" in str(error)
else:
    raise AssertionError("fg.no_such_name did not raise")
"""


def test_import_leaves_the_compiler_and_runtime_to_jit():
    # They cost ~25 ms of `import fastgrad`'s ~65 ms beyond NumPy's (bytecode cached):
    # jit(f) loads them (api.trace.load_layers). ~0.5 s.
    out = subprocess.run([sys.executable, "-c", LAZY_LAYERS], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
