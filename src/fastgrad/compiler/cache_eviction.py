"""A cache folder kept under a size, least recently used files removed first.

A file's modification time is when it was last used: written, or read (`touch`, which
compiler.plan_cache calls before it reads a plan). `evict` removes the oldest files of a
folder over its limit, down to `KEEP` of it. Processes may evict the same folder at once
(a file another one removed first counts as removed), and none removes a file used in the
last `GRACE` seconds as its re-check before the unlink sees it: a reader touches a file
before it opens it, so a file being read is almost always kept, and on POSIX a file
removed after a reader opened it still reads whole. A reader that touches its file in the
instant between that re-check and the unlink finds it gone: it prepares the plan again,
as for any miss (a miss, never a wrong plan).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

GRACE = 60.0  # seconds since a file's last use during which it is never removed
KEEP = 0.9  # an eviction leaves this share of the limit, so the next save does not evict


def touch(path: Path) -> None:
    """Mark `path` used now. Raises FileNotFoundError when it is not there; a cache that
    can be read but not written (one shared read-only) is read without marking."""
    try:
        os.utime(path)
    except FileNotFoundError:
        raise
    except OSError:
        pass


def evict(folder: Path, limit: int, now: float | None = None) -> int:
    """Remove the least recently used files of `folder` when they hold more than `limit`
    bytes, down to `KEEP * limit`, sparing files used in the last GRACE seconds (so the
    folder may stay over its limit while they are). Returns the bytes removed."""
    files: list[tuple[float, str, int]] = []
    total = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    stat = entry.stat(follow_symlinks=False)
                except OSError:  # removed meanwhile
                    continue
                files.append((stat.st_mtime, entry.name, stat.st_size))
                total += stat.st_size
    except OSError:  # no folder (nothing stored yet) or not readable: nothing to do
        return 0
    if total <= limit:
        return 0
    now = time.time() if now is None else now
    removed = 0
    for _, name, size in sorted(files):  # oldest first
        if total - removed <= KEEP * limit:
            break
        path = folder / name
        try:
            if now - os.stat(path).st_mtime < GRACE:  # read since the listing, or new
                continue
            path.unlink()
        except FileNotFoundError:  # another process removed it first
            pass
        except OSError:  # in use (Windows) or not ours to remove: keep it
            continue
        removed += size
    return removed
