"""The vector-math helpers' machine code (and that of Numba's runtime functions) is cached
in fastgrad's cache directory: a new process loads it instead of compiling it again;
NUMBA_CACHE_DIR does not move it; a damaged file is recompiled, never trusted."""

import os
import re
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


RUNTIME = textwrap.dedent(
    """
    import numba, numpy as np
    from numba.core.registry import cpu_target
    from numba.core.runtime import nrtdynmod
    from fastgrad.compiler import machine_code

    built = []
    create = nrtdynmod.create_nrt_module
    nrtdynmod.create_nrt_module = lambda ctx: built.append(1) or create(ctx)
    machine_code.initialize_runtime(cpu_target.target_context)

    @numba.njit
    def grow(x):  # allocates and returns arrays: the runtime's reference counts run
        parts = [x * 2.0, x + 1.0]
        return parts[0] + parts[1][::-1]

    x = np.linspace(-3, 3, 11)
    assert np.array_equal(grow(x), x * 2.0 + (x + 1.0)[::-1])
    print("built", len(built))
    """
)


def test_numbas_runtime_functions_load_from_the_cache(tmp_path):
    """Numba compiles its runtime's LLVM functions in every process; fastgrad keeps their
    machine code like a kernel's, behind a digest: a damaged or foreign file is compiled
    anew and replaced, never loaded; Numba's debug runtime is a file of its own. ~15 s (six
    processes, one small compile each)."""

    def built(**settings):
        env = dict(os.environ, FASTGRAD_CACHE_DIR=str(tmp_path), **settings)
        out = subprocess.run(
            [sys.executable, "-c", RUNTIME], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr
        return int(re.search(r"built (\d+)", out.stdout).group(1))

    assert built() == 1  # an empty cache: compiled and stored
    (stored,) = (tmp_path / "machine_code").glob("numba_runtime.*.nbm")
    good = stored.read_bytes()
    assert built() == 0  # loaded
    stored.write_bytes(good[:-1] + bytes([good[-1] ^ 0x20]))  # damaged
    assert built() == 1 and stored.read_bytes() == good
    other = tmp_path / "other"  # foreign: another function's machine code under its name
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(other))
    subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, capture_output=True)
    foreign = [f for f in (other / "machine_code").glob("*.nbm") if f.name != stored.name]
    stored.write_bytes(foreign[0].read_bytes())
    assert built() == 1 and stored.read_bytes() == good
    assert built(NUMBA_DEBUG_NRT="1") == 1  # its functions print each reference count
    assert built() == 0 and stored.read_bytes() == good
