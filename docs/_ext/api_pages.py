"""Write the API reference's pages from each public namespace's `__all__`.

One page per namespace, with an autosummary table whose entries get their own pages from
their docstrings. Names a namespace re-exports from NumPy (constants, `arange`, ...) are
listed as NumPy's, not documented again.
"""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import numpy

_MISSING = object()

# (module, one line on what it is): the order of the reference's table of contents.
NAMESPACES = [
    ("fastgrad", "Transforms (jit, grad, jvp, ...), control flow, configuration."),
    ("fastgrad.numpy", "NumPy's functions on traced and plain arrays."),
    ("fastgrad.numpy.linalg", "numpy.linalg, differentiable."),
    ("fastgrad.scipy.special", "scipy.special, differentiable."),
    ("fastgrad.scipy.linalg", "scipy.linalg, differentiable."),
    ("fastgrad.scipy.stats", "Log-densities and distribution functions."),
    ("fastgrad.random", "Random numbers from explicit keys."),
    ("fastgrad.testing", "Gradient checks."),
    ("fastgrad.testing.strategies", "Hypothesis strategies."),
    ("fastgrad.debug", "Printing values inside compiled code."),
    ("fastgrad.dask", "Data-parallel gradients on a Dask cluster."),
]


def public_names(module: object) -> tuple[list[str], list[str]]:
    """The module's own public names (submodules aside), and those it re-exports from NumPy."""
    own, numpy_names = [], []
    for name in sorted(getattr(module, "__all__", [])):
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):  # a namespace: it has its own page
            continue
        origin = getattr(obj, "__module__", None) or ""
        if getattr(numpy, name, _MISSING) is obj or origin.split(".")[0] == "numpy":
            numpy_names.append(name)  # NumPy's own constant, function or class
        else:
            own.append(name)
    return own, numpy_names


def namespace_page(modname: str, blurb: str) -> tuple[str, list[str]] | None:
    """The namespace's page, and the names autosummary gives a page of their own."""
    try:
        module = importlib.import_module(modname)
    except ImportError:  # an optional namespace (Dask) or one not yet written
        return None
    own, numpy_names = public_names(module)
    lines = [modname, "=" * len(modname), "", f".. automodule:: {modname}", "", blurb, ""]
    if own:
        lines += [".. autosummary::", "   :toctree: generated", "   :nosignatures:", ""]
        lines += [f"   {name}" for name in own]
        lines.append("")
    if numpy_names:
        listed = ", ".join(f"``{n}``" for n in numpy_names)
        lines += [f"Re-exported from NumPy unchanged (plain arrays): {listed}.", ""]
    return "\n".join(lines), [f"{modname}.{name}" for name in own]


def write(directory: Path) -> None:
    """Write index.rst and one page per namespace into `directory` (only if changed)."""
    directory.mkdir(exist_ok=True)
    entries, documented = [], set()
    for modname, blurb in NAMESPACES:
        found = namespace_page(modname, blurb)
        if found is None:
            continue
        page, names = found
        _write_if_changed(directory / f"{modname}.rst", page)
        entries.append(modname)
        documented |= set(names)
    _drop_stale_stubs(directory / "generated", documented)
    index = ["API reference", "=============", "", ".. toctree::", "   :maxdepth: 1", ""]
    index += [f"   {name}" for name in entries]
    _write_if_changed(directory / "index.rst", "\n".join(index) + "\n")


def _drop_stale_stubs(generated: Path, documented: set[str]) -> None:
    """Remove autosummary's pages of names no longer public: Sphinx would warn that no
    table of contents includes them."""
    if not generated.is_dir():
        return
    for stub in generated.glob("*.rst"):
        if stub.stem not in documented:
            stub.unlink()


def _write_if_changed(path: Path, text: str) -> None:
    # Rewriting an unchanged page would make Sphinx rebuild every page on every build.
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
