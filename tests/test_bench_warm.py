"""The bench's warm runs: a system with a compile cache (fastgrad, JAX, torch.compile) is
timed again in a second fresh process on the cache its first process filled, and every
cold run starts from a new, empty cache.

A fake compiler stands in for the peers, with the child process replaced by a function
that compiles into the cache it is given, so these run without JAX or PyTorch; the
real peers are checked where they are installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastgrad_bench import child, report, runner, systems

COLD_S, WARM_S, SETTLE_S = 1.0, 0.01, 0.5


class FakeCompiler(systems.System):
    name, title, warm = "fake", "a compiler with a disk cache", True
    modules = ("numpy",)

    def cache_env(self, directory):
        return {"FAKE_CACHE_DIR": directory}


class FakeEager(FakeCompiler):
    name, title, warm = "fake-eager", "no compile cache", False

    def cache_env(self, directory):
        return {}


class FakeChild:
    """Stands for child.launch: a first call that compiles into the cache it is pointed
    at (slow) unless the executable is already there (fast)."""

    def __init__(self, fail_warm=False, warm_value=1.0):
        self.calls: list[tuple[dict, dict, list[str]]] = []
        self.fail_warm = fail_warm
        self.warm_value = warm_value  # what the warm process's first call computes

    def __call__(self, spec, env=None, timeout=None):
        env = env or {}
        cache = Path(env["FAKE_CACHE_DIR"]) if "FAKE_CACHE_DIR" in env else None
        seen = sorted(p.name for p in cache.iterdir()) if cache else []
        self.calls.append((spec, env, seen))
        if self.fail_warm and spec.get("first_call_only"):
            return {"status": "error", "error": "warm run died"}
        hit = cache is not None and (cache / "executable").exists()
        if cache is not None:
            (cache / "executable").write_text("compiled")
        first = WARM_S if hit else COLD_S
        result = {"status": "ok", "first_call_s": first, "steady_after_s": first + SETTLE_S}
        value = self.warm_value if spec.get("first_call_only") else 1.0
        result["fingerprint"] = {"value": value, "grads": []}
        if not spec.get("first_call_only"):
            result["median_s"] = 1e-3
        return result


@pytest.fixture
def suite(monkeypatch):
    for fake in (FakeCompiler(), FakeEager()):
        monkeypatch.setitem(systems.SYSTEMS, fake.name, fake)
    return runner.Suite(runner.parse(["W5", "--quick", "--compare", "numpy"]), threads=1)


def test_a_cached_system_gets_a_warm_run_on_the_cache_its_cold_run_filled(suite, monkeypatch):
    launch = FakeChild()
    monkeypatch.setattr(child, "launch", launch)
    w = suite.args.selected[0]
    first = suite.run_system(w, "fake")
    again = suite.run_system(w, "fake")
    for result in (first, again):  # each run cold, then warm
        assert result["first_call_s"] == COLD_S and result["steady_after_s"] == COLD_S + SETTLE_S
        assert result["first_call_warm_s"] == WARM_S
        assert result["steady_after_warm_s"] == WARM_S + SETTLE_S
    (cold, cold_env, cold_seen), (warm, warm_env, warm_seen) = launch.calls[:2]
    assert cold_seen == [] and warm_seen == ["executable"]
    assert warm_env == cold_env and warm["first_call_only"] and not cold.get("first_call_only")
    assert {k: v for k, v in warm.items() if k != "first_call_only"} == cold
    # A new, empty cache per run, removed afterwards.
    dirs = [Path(env["FAKE_CACHE_DIR"]) for _, env, _ in launch.calls]
    assert dirs[0] == dirs[1] != dirs[2] == dirs[3] and launch.calls[2][2] == []
    assert not any(d.exists() for d in dirs)


def test_a_system_without_a_compile_cache_runs_once_and_shows_no_warm_figure(suite, monkeypatch):
    launch = FakeChild()
    monkeypatch.setattr(child, "launch", launch)
    result = suite.run_system(suite.args.selected[0], "fake-eager")
    assert len(launch.calls) == 1 and launch.calls[0][1] == {}
    assert result["first_call_s"] == COLD_S and "first_call_warm_s" not in result
    row = report._result_row(report.normalize(result, "fake-eager", "no compile cache"))
    assert row.split()[1:6] == ["1", "s", "-", "1.5", "s"]  # first call, warm 1st, steady


def test_no_warm_skips_every_warm_run(monkeypatch):
    monkeypatch.setitem(systems.SYSTEMS, "fake", FakeCompiler())
    launch = FakeChild()
    monkeypatch.setattr(child, "launch", launch)
    args = runner.parse(["W5", "--quick", "--no-warm"])
    assert not args.warm and runner.parse(["W5"]).warm
    result = runner.Suite(args, threads=1).run_system(args.selected[0], "fake")
    assert len(launch.calls) == 1 and "first_call_warm_s" not in result


def test_a_failed_warm_run_keeps_the_cold_figures_with_a_note(suite, monkeypatch):
    monkeypatch.setattr(child, "launch", FakeChild(fail_warm=True))
    result = suite.run_system(suite.args.selected[0], "fake")
    assert result["status"] == "ok" and result["first_call_s"] == COLD_S
    assert "first_call_warm_s" not in result and "warm run died" in result["note"]


def test_a_warm_run_computing_other_values_is_not_timed(suite, monkeypatch):
    """A stale or damaged cache that answers otherwise is a note, not a warm figure."""
    monkeypatch.setattr(child, "launch", FakeChild(warm_value=1.5))
    result = suite.run_system(suite.args.selected[0], "fake")
    assert result["status"] == "ok" and result["first_call_s"] == COLD_S
    assert "first_call_warm_s" not in result and "other values" in result["note"]


def test_the_table_prints_a_peers_warm_columns(suite, monkeypatch):
    monkeypatch.setattr(child, "launch", FakeChild())
    result = report.normalize(suite.run_system(suite.args.selected[0], "fake"), "fake", "")
    cells = report._result_row(result).split()
    assert cells[:9] == ["fake", "1", "s", "10", "ms", "1.5", "s", "510", "ms"]


@pytest.mark.parametrize("name", ["jax", "torch-compile"])
def test_the_peers_compile_caches_fill_cold_and_are_read_warm(name, monkeypatch):
    """With the peer installed: its cold child writes the cache the bench points it at,
    and the warm child starts on that cache (JAX: one file per executable)."""
    system = systems.SYSTEMS[name]
    for module in system.modules:
        pytest.importorskip(module)
    seen, launch = [], child.launch

    def spy(spec, env=None, timeout=None):
        cache = Path(next(v for k, v in env.items() if k.endswith("CACHE_DIR")))
        seen.append(sorted(p.name for p in cache.iterdir()))
        return launch(spec, env=env, timeout=timeout)

    monkeypatch.setattr(child, "launch", spy)
    suite = runner.Suite(runner.parse(["W5", "--quick", "--compare", name]), threads=1)
    result = suite.run_system(suite.args.selected[0], name)
    assert result["status"] == "ok", result
    assert result["first_call_warm_s"] > 0 and result["steady_after_warm_s"] > 0
    assert seen[0] == [] and seen[1], seen
