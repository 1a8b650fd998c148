"""The documentation site builds without a warning, and every public name is documented.

The build runs Sphinx as the README's documentation command does, but with the gallery's
examples rendered without running them (tests/test_examples.py runs those), to keep the
suite fast. -W turns every warning (a broken cross-reference, bad markup in a docstring)
into a failure.
"""

import doctest
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import api_pages  # noqa: E402


def documented_names() -> list[tuple[str, object]]:
    found = []
    for modname, _ in api_pages.NAMESPACES:
        try:
            module = importlib.import_module(modname)
        except ImportError:
            continue
        own, _ = api_pages.public_names(module)
        found += [(f"{modname}.{name}", getattr(module, name)) for name in own]
    return found


def test_every_public_name_has_a_docstring():
    assert [name for name, obj in documented_names() if not (obj.__doc__ or "").strip()] == []


def test_every_public_name_has_an_example():
    # A runnable one: the suite runs with --doctest-modules, which runs it.
    assert [name for name, obj in documented_names() if ">>>" not in (obj.__doc__ or "")] == []


def test_every_example_runs_as_a_doctest():
    # Doctest looks at a module's functions and classes (and its __test__ dict), not at
    # instances: a family of scipy.stats is one, so its docstring must be in __test__.
    import fastgrad

    finder = doctest.DocTestFinder()
    collected = set()
    for info in pkgutil.walk_packages(fastgrad.__path__, "fastgrad."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra (Dask)
            continue
        collected |= {test.docstring for test in finder.find(module) if test.examples}
    documented = [(name, obj) for name, obj in documented_names() if ">>>" in (obj.__doc__ or "")]
    assert [name for name, obj in documented if obj.__doc__ not in collected] == []


@pytest.mark.skipif(importlib.util.find_spec("sphinx") is None, reason="needs the docs extra")
def test_the_site_builds_without_warnings(tmp_path):
    env = dict(os.environ, FASTGRAD_DOCS_GALLERY="0")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         str(ROOT / "docs"), str(tmp_path / "html")],
        env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    assert (tmp_path / "html" / "api" / "generated" / "fastgrad.grad.html").exists()
    assert (tmp_path / "html" / "gallery" / "em_gmm.html").exists()
