"""The on-disk kernel cache: a new process loads instead of compiling; bad entries are
rebuilt, never trusted; everything stays under FASTGRAD_CACHE_DIR."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.compiler.kernel_cache import STATS
    op = getattr(fnp, os.environ.get("FG_TEST_OP", "tanh"))

    def loss(x, y):
        return fnp.sum(op(x * y) * fnp.exp(-y * y))

    x = np.linspace(-1, 1, 50); y = np.linspace(0, 2, 50)
    value, (gx, gy) = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))(x, y)
    ref = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)), fuse=False)(x, y)
    assert np.allclose(value, ref[0]) and np.allclose(gx, ref[1][0]) and np.allclose(gy, ref[1][1])
    print(STATS.numba_compiles(), STATS.cache_loads())
    """
)


def run(cache_dir, **env_vars):
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(cache_dir), **env_vars)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "CacheWarning" not in out.stderr
    compiles, hits = map(int, out.stdout.split())
    return compiles, hits


def entries(cache: Path) -> list[Path]:
    return sorted((cache / "kernels").iterdir())


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernels")
    assert run(cache) == (1, 0)  # cold: one kernel compiled, its machine code saved
    assert [p.suffix for p in entries(cache)] == [".nbm"]
    return cache


def test_a_new_process_loads_kernels_without_compiling(warm_cache):
    assert run(warm_cache) == (0, 1)


def _copy(cache: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(cache), str(copy)], check=True)
    return copy


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "flip a bit"])
def test_a_damaged_entry_is_rebuilt(warm_cache, tmp_path, damage):
    cache = _copy(warm_cache, tmp_path)
    (entry,) = entries(cache)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2 :]
    elif damage == "garbage":
        data = bytearray(b"\xff\xfe not machine code \x00" * 10)
    elif damage == "empty":
        data = bytearray()
    else:
        data[len(data) // 3] ^= 0x04
    entry.write_bytes(bytes(data))
    assert run(cache) == (1, 0)
    if damage == "flip a bit":
        assert run(cache) == (0, 1)  # and the rebuilt entry is good


def test_entries_swapped_between_kernels_are_not_run(warm_cache, tmp_path):
    """Two valid files under each other's names (before, Numba ran the wrong kernel, or
    failed with a TypeError): a digest binds each to its own name, so both are rebuilt."""
    cache = _copy(warm_cache, tmp_path)
    assert run(cache, FG_TEST_OP="cosh") == (1, 0)  # a second kernel: cosh for tanh
    a, b = entries(cache)
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    assert run(cache) == (1, 0) and run(cache, FG_TEST_OP="cosh") == (1, 0)


def test_numba_cache_files_are_neither_read_nor_written(tmp_path):
    """Damaged files where Numba's own cache would look (NUMBA_CACHE_DIR, the kernels'
    __pycache__) change nothing (before: UnpicklingError in every later run), and a
    compile writes nothing there or under ~/.cache/numba."""
    cache = tmp_path / "cache"
    numba_cache = tmp_path / "numba"
    for folder in (numba_cache / "kernels_0123", cache / "kernels" / "__pycache__"):
        folder.mkdir(parents=True)
        (folder / "fastgrad_kernel_x.kernel-1.py311.nbi").write_bytes(b"\x80\x04garbage")
        (folder / "fastgrad_kernel_x.kernel-1.py311.1.nbc").write_bytes(b"\x80\x04garbage")
    home = tmp_path / "home"
    before = sorted(numba_cache.rglob("*"))
    assert run(cache, NUMBA_CACHE_DIR=str(numba_cache), HOME=str(home)) == (1, 0)
    assert sorted(numba_cache.rglob("*")) == before
    assert not (home / ".cache").exists()
    assert len(list((cache / "kernels").glob("*.nbm"))) == 1


def test_two_processes_filling_one_entry_at_once(tmp_path):
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    assert run(tmp_path) == (0, 1)


def test_the_suite_never_uses_the_default_cache():
    # The root conftest points FASTGRAD_CACHE_DIR away from ~/.cache/fastgrad.
    from fastgrad.core.config import cache_dir

    home_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastgrad"
    assert os.environ.get("FASTGRAD_CACHE_DIR")
    assert cache_dir().resolve() != home_cache.resolve()


def _without_cache_settings(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FASTGRAD_CACHE_DIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(tmp_path / "home")  # a temporary home: nothing is left behind
    return env


def test_the_default_location_is_the_user_cache(tmp_path):
    env = _without_cache_settings(tmp_path)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    kernels = tmp_path / "home" / ".cache" / "fastgrad" / "kernels"
    assert [p.suffix for p in kernels.iterdir() if p.is_file()] == [".nbm"]


def test_the_default_location_follows_xdg_cache_home(tmp_path):
    env = _without_cache_settings(tmp_path)
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    script = "from fastgrad.core.config import cache_dir; print(cache_dir())"
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert Path(out.stdout.strip()) == tmp_path / "xdg" / "fastgrad"


def test_needs_build_asks_the_cache_folder_in_use(tmp_path, monkeypatch):
    """Whether a kernel is stored is asked of the folder the environment names at the
    time (kept per folder: kernel_cache's `_kernels_folder`). (~0.01 s)"""
    from fastgrad.compiler import kernel_cache

    source = f"def fastgrad_kernel(x):  # {tmp_path}\n    return x\n"
    stored, empty = tmp_path / "stored", tmp_path / "empty"
    (stored / kernel_cache.FOLDER).mkdir(parents=True)
    name = f"fastgrad_kernel_{kernel_cache.kernel_key(source)}.0.nbm"
    (stored / kernel_cache.FOLDER / name).write_bytes(b"")
    for folder, builds in ((empty, True), (stored, False), (empty, True), (stored, False)):
        monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(folder))
        assert kernel_cache.needs_build(source) is builds


GAMMA = textwrap.dedent(
    """
    import sys, numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.ops import threefry

    op = getattr(fnp, sys.argv[1])
    a = np.full(5, 2.5)
    z = fg.jit(lambda key, a: op(fg.random.gamma(key, a, (5,))))(fg.random.key(3), a)
    assert np.all(np.isfinite(z))
    print(sum(sum(f.stats.cache_misses.values()) for f in threefry.called_build().values()))
    """
)


def test_gamma_sampler_is_compiled_once_for_all_processes(tmp_path):
    """Gamma's sampler, which kernels call rather than inline (~3 s of CPU to compile), is
    cached on disk like a kernel: a later process compiling a new kernel that samples
    gamma loads it. About 8 s of CPU."""
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(tmp_path), FASTGRAD_COMPILE="sync")
    built = []
    for op in ("exp", "sin"):  # two kernels, so the second process compiles one too
        out = subprocess.run(
            [sys.executable, "-c", GAMMA, op], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        built.append(int(out.stdout))
    assert built[0] > 0 and built[1] == 0, built
