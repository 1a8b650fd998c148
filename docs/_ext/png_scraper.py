"""Show in the gallery the PNG files an example writes, as sphinx-gallery shows figures.

The examples save their figures to files (by default in the temp directory) instead of
leaving pyplot figures open; this scraper picks up every PNG written there since the
previous code block ran, in the order written.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from sphinx_gallery.scrapers import figure_rst


class WrittenPngs:
    """A sphinx-gallery image scraper (callable) for PNG files written during a block."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = Path(directory or tempfile.gettempdir())
        self.since = time.time()

    def __repr__(self) -> str:  # sphinx-gallery keys its cache on the scraper's repr
        return f"WrittenPngs({str(self.directory)!r})"

    def __call__(self, block: Any, block_vars: dict, gallery_conf: dict) -> str:
        written = sorted(
            (p for p in self.directory.glob("*.png") if p.stat().st_mtime >= self.since),
            key=lambda p: p.stat().st_mtime,
        )
        self.since = time.time()
        paths = []
        # The iterator yields as many names as asked for: zip stops at the last PNG.
        for png, target in zip(written, block_vars["image_path_iterator"], strict=False):
            shutil.copyfile(png, target)
            paths.append(target)
        return figure_rst(paths, gallery_conf["src_dir"])
