"""The plan cache's folder stays under its size (compiler.cache_eviction): least recently
used files go first, down to 90% of the limit; a file written or read in the last minute is
never removed; evictions running at once in several threads agree; storing a plan evicts.

Cost: well under a second (files of a few bytes; one small jitted gradient).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import cache_eviction, plan_cache
from fastgrad.compiler.cache_eviction import GRACE, evict
from fastgrad.core.config import config


def _files(folder: Path, sizes: list[int], age: float = 3600.0) -> list[Path]:
    """Files of `sizes` bytes last used about `age` seconds ago, a second apart, the first
    the least recently used."""
    now = time.time()
    paths = []
    for k, size in enumerate(sizes):
        path = folder / f"f{k}.plan"
        path.write_bytes(b"x" * size)
        when = now - age - (len(sizes) - k)
        os.utime(path, (when, when))
        paths.append(path)
    return paths


def test_the_least_recently_used_go_first(tmp_path: Path) -> None:
    paths = _files(tmp_path, [100] * 10)
    assert evict(tmp_path, 1000) == 0  # at the limit: nothing to do
    assert evict(tmp_path, 500) == 600  # down to 90% of 500: the four newest stay
    assert [p.exists() for p in paths] == [False] * 6 + [True] * 4


def test_a_file_read_is_used(tmp_path: Path) -> None:
    paths = _files(tmp_path, [100] * 4)
    cache_eviction.touch(paths[0])  # the oldest, read now
    evict(tmp_path, 250)
    assert [p.exists() for p in paths] == [True, False, False, True]


def test_a_file_used_in_the_last_minute_stays(tmp_path: Path) -> None:
    """Even over the limit: it may be being read (or be a write's temporary file)."""
    paths = _files(tmp_path, [100] * 3, age=GRACE / 2)
    assert evict(tmp_path, 10) == 0 and all(p.exists() for p in paths)
    assert evict(tmp_path, 10, now=time.time() + GRACE) == 300


def test_a_missing_folder_is_nothing_to_evict(tmp_path: Path) -> None:
    assert evict(tmp_path / "none", 0) == 0
    with pytest.raises(FileNotFoundError):
        cache_eviction.touch(tmp_path / "none")


def test_evictions_at_once_agree(tmp_path: Path) -> None:
    """Several evictors over one folder: each file is removed once, none fails, and what
    is left is the newest files, within the limit."""
    paths = _files(tmp_path, [100] * 200)
    removed: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            removed.append(evict(tmp_path, 5000))
        except BaseException as error:  # pragma: no cover - the failure reported below
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    left = [p.exists() for p in paths]
    assert left == [False] * 155 + [True] * 45  # 90% of 5000 bytes: the 45 newest
    assert sum(removed) >= 15500  # a file two evictors raced for counts for both


def test_storing_a_plan_evicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Old files past `config.plan_cache_mb` go when a plan is stored; the plan stays."""
    monkeypatch.setattr(plan_cache, "path_of", lambda key, kind="plan": tmp_path / f"{key}.{kind}")
    monkeypatch.setattr(plan_cache, "MIN_NODES", 0)
    monkeypatch.setattr(config, "plan_cache_mb", 1)
    monkeypatch.setattr(config, "plan_cache", True)
    monkeypatch.setattr(plan_cache, "COUNTERS", plan_cache.Counters())
    old = _files(tmp_path, [600_000, 600_000])
    f = fg.jit(fg.value_and_grad(lambda x: fnp.sum(fnp.tanh(x) * x)))
    value, _ = f(np.linspace(-1.0, 1.0, 5))
    assert plan_cache.COUNTERS.saved >= 1
    assert not old[0].exists() and old[1].exists()
    assert len(list(tmp_path.glob("*.plan"))) == 2  # the new plan and the newer old file
    x = np.linspace(-1.0, 1.0, 5)
    np.testing.assert_allclose(value, np.sum(np.tanh(x) * x))


def test_the_setting_takes_whole_megabytes() -> None:
    assert config.plan_cache_mb >= 1
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="plan_cache_mb"):
            config.update("plan_cache_mb", bad)
