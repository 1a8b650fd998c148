"""Settings read from the environment: where compiled kernels are cached.

`FASTGRAD_CACHE_DIR` overrides the default, `$XDG_CACHE_HOME/fastgrad` (or
`~/.cache/fastgrad`).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The directory for fastgrad's on-disk cache (not created here)."""
    explicit = os.environ.get("FASTGRAD_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fastgrad"


def dir_size(path: Path) -> tuple[int, int]:
    """(number of files, total bytes) under `path`; (0, 0) if it does not exist."""
    files = total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:  # removed while we walk: another process cleaning up
                pass
    return files, total
