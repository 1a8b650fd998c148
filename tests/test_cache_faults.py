"""A cache directory that cannot be used costs a compile in memory and one warning that
says what is wrong and how to fix it; never a crash or a wrong result.

Before, each of these faults crashed the program: FASTGRAD_CACHE_DIR naming a file, its
`kernels` folder a file, a kernel's entry a directory, a read-only cache, a full disk.
Each test runs a program that needs two new kernels in a faulty cache, in this process
(the kernels already compiled here are forgotten first, so that the cache is consulted).
"""

import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.compiler import kernel_cache, machine_code
from fastgrad.compiler.machine_code import COUNTERS, CacheWarning


# Kernels without vector-math calls: they compile in a fraction of the time.
def loss(x):
    return fnp.sum(x * x * 0.5 + x)


def other(x):
    return fnp.sum(fnp.abs(x) * x - x)


X = np.linspace(-1.3, 2.1, 37)


def run_in(cache: Path, monkeypatch) -> list[warnings.WarningMessage]:
    """Run `loss` and `other` (two kernels) with `cache` as the cache directory; check their
    results against the NumPy reference; return the CacheWarnings given."""
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(cache))
    monkeypatch.setattr(kernel_cache, "_MEMORY", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for f in (loss, other):
            value, grad = fg.jit(fg.value_and_grad(f))(X)
            ref_value, ref_grad = fg.jit(fg.value_and_grad(f), fuse=False)(X)
            np.testing.assert_allclose(value, ref_value, rtol=1e-13)
            np.testing.assert_allclose(grad, ref_grad, rtol=1e-13, atol=1e-15)
    return [w for w in caught if issubclass(w.category, CacheWarning)]


def assert_one_warning(caught: list[warnings.WarningMessage], *words: str) -> None:
    assert len(caught) == 1, [str(w.message) for w in caught]
    text = str(caught[0].message)
    assert "compiled in memory" in text and "FASTGRAD_CACHE_DIR" in text
    for word in words:
        assert word in text


def test_a_good_cache_gives_no_warning_and_is_used(tmp_path, monkeypatch):
    assert run_in(tmp_path, monkeypatch) == []
    assert len(list((tmp_path / "kernels").glob("*.nbm"))) == 2
    loaded = COUNTERS.loaded
    assert run_in(tmp_path, monkeypatch) == []
    assert COUNTERS.loaded == loaded + 2


def test_cache_dir_is_a_file(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    path.write_text("not a directory")
    assert_one_warning(run_in(path, monkeypatch), "NotADirectoryError", str(path))
    assert path.read_text() == "not a directory"


def test_kernels_folder_is_a_file(tmp_path, monkeypatch):
    (tmp_path / "kernels").write_text("not a directory")
    assert_one_warning(run_in(tmp_path, monkeypatch), "NotADirectoryError")


def test_a_kernel_entry_is_a_directory(tmp_path, monkeypatch):
    run_in(tmp_path, monkeypatch)
    for entry in (tmp_path / "kernels").glob("*.nbm"):
        entry.unlink()
        (entry / "in the way").mkdir(parents=True)
    assert_one_warning(run_in(tmp_path, monkeypatch), "IsADirectoryError")


def _make_read_only(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o555)
        return
    # root writes through file modes; the immutable attribute stops it too
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)]).returncode != 0:
        pytest.skip("running as root without a way to make a directory read-only")


def _make_writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=False)
    path.chmod(0o755)


@pytest.mark.parametrize("filled", [False, True], ids=["empty", "filled"])
def test_read_only_cache(tmp_path, monkeypatch, filled):
    cache = tmp_path / "cache"
    (cache / "kernels").mkdir(parents=True)
    if filled:  # one kernel stored before the cache became read-only: it is still loaded
        monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(cache))
        monkeypatch.setattr(kernel_cache, "_MEMORY", {})
        fg.jit(fg.value_and_grad(loss))(X)
    _make_read_only(cache / "kernels")
    try:
        loaded = COUNTERS.loaded
        caught = run_in(cache, monkeypatch)
        assert COUNTERS.loaded == loaded + filled
    finally:
        _make_writable(cache / "kernels")
    assert_one_warning(caught, "PermissionError" if os.geteuid() else "Error")


def test_full_disk(tmp_path, monkeypatch):
    """Writes fail with ENOSPC, as on a full disk: each temporary file is opened on
    /dev/full, which the kernel answers so."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full to simulate a full disk")
    made = []

    def mkstemp(dir=None, prefix=None, suffix=None):
        fd, name = tempfile.mkstemp(dir=dir, prefix=prefix, suffix=suffix)
        os.close(fd)
        made.append(name)
        return os.open("/dev/full", os.O_WRONLY), name

    monkeypatch.setattr(machine_code, "tempfile", type("T", (), {"mkstemp": staticmethod(mkstemp)}))
    caught = run_in(tmp_path, monkeypatch)
    assert_one_warning(caught, "No space left on device")
    assert made and not any(os.path.exists(name) for name in made)  # no leftovers
    assert list((tmp_path / "kernels").iterdir()) == []


def test_flipped_bits_in_machine_code_are_caught(tmp_path, monkeypatch):
    """A bit flipped anywhere in a stored kernel (before: wrong results 3 times in 12, and
    crashes) fails its digest, before anything in the file is used: the entry is dropped.
    24 random bits over the two kernels' files; then a whole run on flipped files compiles
    both kernels again and gives the right results."""
    run_in(tmp_path, monkeypatch)
    dispatchers = list(kernel_cache._MEMORY.values())
    entries = sorted((tmp_path / "kernels").glob("*.nbm"))
    assert len(dispatchers) == len(entries) == 2
    originals = {e: e.read_bytes() for e in entries}
    rng = np.random.default_rng(0)
    for trial in range(24):
        d = dispatchers[trial % 2]
        (sig,) = d.signatures
        (entry,) = [e for e in entries if e.name.startswith(d.py_func.__module__ + ".")]
        assert d._cache.load_overload(sig, d.targetctx) is not None  # intact: loads
        flipped = bytearray(originals[entry])
        bit = int(rng.integers(len(flipped) * 8))
        flipped[bit // 8] ^= 1 << (bit % 8)
        entry.write_bytes(bytes(flipped))
        dropped = COUNTERS.dropped
        assert d._cache.load_overload(sig, d.targetctx) is None, f"bit {bit} of {entry.name}"
        assert COUNTERS.dropped == dropped + 1 and not entry.exists()
        entry.write_bytes(originals[entry])
    for entry, data in originals.items():
        entry.write_bytes(data[:-1] + bytes([data[-1] ^ 0x80]))
    dropped = COUNTERS.dropped
    assert run_in(tmp_path, monkeypatch) == []
    assert COUNTERS.dropped == dropped + 2
