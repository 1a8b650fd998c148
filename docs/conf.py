"""Sphinx configuration for fastgrad's documentation site.

Build with `python -m sphinx -W -b html docs docs/_build/html` (README: "Documentation").
The API pages are written at build time from each public namespace's `__all__`, so a new
public name gets its page without anyone editing a list; the gallery runs `examples/`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import api_pages  # noqa: E402  (docs/_ext, on the path just above)
from png_scraper import WrittenPngs  # noqa: E402

import fastgrad  # noqa: E402

project = "fastgrad"
author = "the fastgrad developers"
copyright = "2026, the fastgrad developers"
release = version = fastgrad.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "gallery/*.ipynb", "gallery/*.py", "gallery/*.zip"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Docstrings write `name` for code, as Markdown does: render it as code, not as a
# reference title.
default_role = "code"
autodoc_typehints = "none"  # the signature line is enough; hints clutter the pages
autosummary_generate = True
autodoc_default_options = {"members": False}
# The gallery's configuration holds functions (argv, the PNG scraper), which Sphinx cannot
# pickle for its incremental cache: it then rebuilds the gallery pages, which is fine.
suppress_warnings = ["config.cache"]
nitpicky = False  # cross-references are checked by -W: an unresolved :func: fails

html_theme = "pydata_sphinx_theme"
html_title = "fastgrad"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path: list[str] = []

# The Dask examples start a two-worker cluster; their default data sets (1.8 million rows
# for dask_logistic) take minutes on a laptop, so the gallery runs them smaller.
GALLERY_ARGV = {
    "dask_logistic.py": ["--rows", "200000", "--chunk-rows", "50000", "--iterations", "15"],
    "dask_optimizers.py": ["--rows", "50000"],
}

# The gallery: each example runs once per build (FASTGRAD_DOCS_GALLERY=0 renders the pages
# without running them, for the quick check in the test suite). Underscored modules are
# shared helpers, not examples.
sphinx_gallery_conf = {
    "examples_dirs": str(DOCS.parent / "examples"),
    "gallery_dirs": "gallery",
    "filename_pattern": r"/[a-z][^/]*\.py$",
    "ignore_pattern": r"(^|/)_[^/]*\.py$",
    "plot_gallery": os.environ.get("FASTGRAD_DOCS_GALLERY", "1") != "0",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "within_subsection_order": "FileNameSortKey",
    "min_reported_time": 1,
    "matplotlib_animations": False,
    "capture_repr": (),
    "image_scrapers": ("matplotlib", WrittenPngs()),
    "reset_argv": lambda conf, script: GALLERY_ARGV.get(Path(script["src_file"]).name, []),
}

# Written now, not from an event: autosummary reads the pages to generate its stubs when
# the builder starts, before any handler of ours would run.
api_pages.write(DOCS / "api")
