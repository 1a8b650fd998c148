"""The vector-math helpers' machine code is cached in fastgrad's cache directory: a new
process loads it instead of compiling it again; NUMBA_CACHE_DIR does not move it; a
damaged file is recompiled, never trusted."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import numba, numpy as np
    from fastgrad.compiler import machine_code
    from fastgrad.compiler.codegen.vecmath import exp_f64

    @numba.njit
    def loop(x, out):
        for i in range(x.size):
            out[i] = exp_f64(x[i])

    x = np.linspace(-3, 3, 101)
    out = np.empty_like(x)
    loop(x, out)
    assert np.allclose(out, np.exp(x), rtol=1e-15, atol=0)
    c = machine_code.COUNTERS
    print(c.loaded, c.saved, c.dropped)
    """
)


def run(cache, numba_cache):
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(cache), NUMBA_CACHE_DIR=str(numba_cache))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return tuple(map(int, out.stdout.split()))


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    cache = tmp_path_factory.mktemp("helpers")
    numba_cache = tmp_path_factory.mktemp("numba")
    loaded, saved, dropped = run(cache, numba_cache)
    assert loaded == 0 and saved > 0 and dropped == 0
    return cache, numba_cache, saved


def test_a_new_process_loads_the_helpers(filled):
    cache, numba_cache, saved = filled
    assert run(cache, numba_cache) == (1, 0, 0)  # exp_f64 itself; its callees are inside it
    files = list((cache / "machine_code").iterdir())
    assert len(files) == saved and all(f.suffix == ".nbm" for f in files)
    assert not any(numba_cache.iterdir())  # nothing went where NUMBA_CACHE_DIR points


@pytest.mark.parametrize("damage", ["flip a byte", "truncate"])
def test_a_damaged_file_is_recompiled(filled, tmp_path, damage):
    cache, numba_cache, saved = filled
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(cache), str(copy)], check=True)
    for f in (copy / "machine_code").iterdir():
        data = bytearray(f.read_bytes())
        if damage == "truncate":
            del data[len(data) // 2 :]
        else:
            data[len(data) // 2] ^= 0x10
        f.write_bytes(bytes(data))
    # every file tried (exp_f64, then each callee as it is compiled again) is dropped and
    # written anew
    assert run(copy, numba_cache) == (0, saved, saved)
    assert run(copy, numba_cache) == (1, 0, 0)
