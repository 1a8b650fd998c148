"""The on-disk kernel cache: a new process loads instead of compiling; bad entries are
rebuilt, never trusted."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    from fastgrad.compiler.kernel_cache import STATS

    def loss(x, y):
        return fnp.sum(fnp.tanh(x * y) * fnp.exp(-y * y))

    x = np.linspace(-1, 1, 50); y = np.linspace(0, 2, 50)
    value, (gx, gy) = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)))(x, y)
    ref = fg.jit(fg.value_and_grad(loss, argnums=(0, 1)), fuse=False)(x, y)
    assert np.allclose(value, ref[0]) and np.allclose(gx, ref[1][0]) and np.allclose(gy, ref[1][1])
    print(STATS.numba_compiles(), STATS.numba_cache_hits(), STATS.modules_written)
    """
)


def run(cache_dir):
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(cache_dir))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    compiles, hits, written = map(int, out.stdout.split())
    return compiles, hits, written


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernels")
    assert run(cache) == (1, 0, 1)  # cold: one kernel compiled, its module written
    return cache


def test_a_new_process_loads_kernels_without_compiling(warm_cache):
    assert run(warm_cache) == (0, 1, 0)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "stale machine code"])
def test_a_damaged_entry_is_rebuilt(warm_cache, tmp_path, damage):
    cache = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(warm_cache), str(cache)], check=True)
    kernels = cache / "kernels"
    (module,) = [p for p in kernels.iterdir() if p.suffix == ".py"]
    if damage == "truncate":
        module.write_text(module.read_text()[:40])
    elif damage == "garbage":
        module.write_bytes(b"\xff\xfe not python \x00")
    else:  # machine code that no longer matches its module: Numba's index must not be used
        for entry in (kernels / "__pycache__").iterdir():
            entry.write_bytes(b"corrupt")
    compiles, hits, written = run(cache)
    assert compiles == 1 and hits == 0
    assert written == (0 if damage == "stale machine code" else 1)
    assert run(cache) == (0, 1, 0)  # and the rebuilt entry is good


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
    assert run(tmp_path) == (0, 1, 0)


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
    assert [p.suffix for p in kernels.iterdir() if p.is_file()] == [".py"]


def test_the_default_location_follows_xdg_cache_home(tmp_path):
    env = _without_cache_settings(tmp_path)
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    script = "from fastgrad.core.config import cache_dir; print(cache_dir())"
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert Path(out.stdout.strip()) == tmp_path / "xdg" / "fastgrad"
