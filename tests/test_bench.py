"""Tests for the benchmark suite (`fastgrad bench`, package fastgrad_bench).

The end-to-end runs use --quick and only the systems every machine has (fastgrad,
NumPy, Numba); peers are made to look uninstalled with FASTGRAD_BENCH_HIDE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from fastgrad_bench import child, hand_numba, hand_numpy, models, report, runner, systems, workloads


def run_bench(args, tmp_path, hide=""):
    env = {**os.environ, systems.HIDE_ENV: hide}
    return subprocess.run(
        [sys.executable, "-m", "fastgrad_bench", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "bench.json"
    # Two workloads, not five: each costs fastgrad a cold compile, and CI has two cores.
    # W2 covers stop_gradient, integer indexing and logsumexp; W5 the per-call path.
    args = ["W2", "W5", "--quick", "--compare", "numpy", "--json", str(out), "--note", "ci"]
    proc = run_bench(args, tmp)
    return proc, json.loads(out.read_text()) if out.exists() else None


def test_quick_run_succeeds_and_json_has_every_field(quick_run):
    proc, doc = quick_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["schema"] == report.SCHEMA
    assert doc["notes"][0] == "ci"
    assert doc["settings"]["warm"] is True
    env = doc["environment"]
    for key in ("python", "cpu_model", "threads", "versions"):
        assert env[key]
    for name in ("numpy", "numba", "llvmlite", "jax", "torch", "autograd"):
        assert name in env["versions"]
    assert env["threads"] >= 1
    assert doc["bandwidth"]["gbps"] > 0
    assert [e["key"] for e in doc["workloads"]] == ["W2", "W5"]
    for entry in doc["workloads"]:
        assert set(report.WORKLOAD_FIELDS) <= set(entry)
        by_system = {r["system"]: r for r in entry["results"]}
        assert list(by_system) == ["fastgrad", "numpy"]
        for r in entry["results"]:
            assert set(report.RESULT_FIELDS) <= set(r)
            assert r["status"] == "ok", (entry["key"], r["system"], r["error"])
            for field in (
                "first_call_s",
                "steady_after_s",
                "median_s",
                "peak_rss_mb",
                "peak_rss_delta_mb",
                "gbps",
                "pct_bandwidth",
                "speedup_vs_numpy",
                "ratio_to_fastest_peer",
            ):
                assert r[field] is not None and r[field] >= 0, (entry["key"], field)
            assert r["repeats"] >= 3
            assert r["check"] == "ok", (entry["key"], r["system"], r["check_rel_err"])
        fastgrad = by_system["fastgrad"]
        assert fastgrad["first_call_warm_s"] > 0
        assert fastgrad["steady_after_s"] >= fastgrad["first_call_s"]
        assert fastgrad["steady_after_warm_s"] >= fastgrad["first_call_warm_s"]
        assert by_system["numpy"]["speedup_vs_numpy"] == 1.0
        assert by_system["numpy"]["first_call_warm_s"] is None  # no compile cache: "-"
        assert entry["fastest_peer"] == "numpy"


def test_quick_run_prints_table_and_progress(quick_run):
    proc, _ = quick_run
    assert "W2 softmax-xent" in proc.stdout and "W5 overhead" in proc.stdout
    assert "memory bandwidth" in proc.stdout
    assert "[1/4]" in proc.stderr  # progress goes to stderr, not into the table


@pytest.fixture(scope="module")
def unavailable_run(tmp_path_factory):
    """Peers hidden as if not installed, and fastgrad hidden so that it fails."""
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "bench.json"
    proc = run_bench(
        [
            "W1",
            "W5",
            "--quick",
            "--compare",
            "numpy,autograd,jax,torch,torch-compile",
            "--json",
            str(out),
        ],
        tmp,
        hide="autograd,jax,torch,fastgrad",
    )
    results = json.loads(out.read_text())["workloads"][-1]["results"]
    return proc, {r["system"]: r for r in results}


def test_uninstalled_peers_are_said_once_with_the_install_command(unavailable_run):
    proc, results = unavailable_run
    assert list(results) == ["fastgrad", "numpy", "autograd", "jax", "torch", "torch-compile"]
    assert results["numpy"]["status"] == "ok"
    for name in ("autograd", "jax", "torch", "torch-compile"):
        assert results[name]["status"] == "skipped"  # the JSON keeps every system
        assert "not installed" in results[name]["note"]
    note = (
        "not installed, so not run: autograd, jax, torch, torch-compile "
        '(install them with: pip install -e ".[compare]")'
    )
    # Two workloads, four missing peers: one line in the table, one in the progress.
    assert proc.stdout.count(note) == 1 and "skipped" not in proc.stdout
    assert proc.stderr.count(note) == 1 and "skipped" not in proc.stderr


def test_a_system_that_errors_is_reported_with_its_message(unavailable_run):
    proc, results = unavailable_run
    assert proc.returncode == 1  # an error, unlike a skip, fails the command
    fastgrad = results["fastgrad"]
    assert fastgrad["status"] == "error"
    assert "ModuleNotFoundError" in fastgrad["error"] and "fastgrad" in fastgrad["error"]
    assert "ERROR (during import): ModuleNotFoundError" in proc.stdout
    assert "errors in: W1 fastgrad, W5 fastgrad" in proc.stderr


def test_child_reports_a_module_that_fails_to_import_as_skipped(monkeypatch):
    monkeypatch.setenv(systems.HIDE_ENV, "numba")
    spec = {
        "kind": "workload",
        "system": "numba",
        "workload": "W5",
        "size": 16,
        "dtype": "float64",
        "repeat": 3,
        "budget_s": 1.0,
        "threads": 1,
    }
    result = child.launch(spec, timeout=120)
    assert result["status"] == "skipped"
    assert "numba is not installed" in result["note"]


def test_a_child_that_dies_is_an_error_not_a_crash():
    result = child.launch({"kind": "workload", "system": "no-such-system"}, timeout=60)
    assert result["status"] == "error"
    assert "KeyError" in result["error"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["W9"], "unknown workload 'W9'"),
        (["--dtype", "float16"], "invalid choice: 'float16'"),
        (["--compare", "numpy,tensorflow"], "unknown system 'tensorflow'"),
        (["--compare", ","], "expected a comma-separated list"),
        (["--size", "0"], "expected a positive integer"),
        (["--size", "1.5"], "expected a positive integer"),
        (["--size", "lots"], "expected a positive integer"),
        (["--repeat", "-2"], "expected a positive integer"),
        (["--size", "1e13"], "too large for W1"),
        (["--json", "/no/such/dir/out.json"], "does not exist"),
        (["--plot", "."], "is a directory"),
    ],
)
def test_bad_arguments_get_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        runner.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(systems.HIDE_ENV, "matplotlib")
    with pytest.raises(SystemExit) as exc:
        runner.main(["--quick", "--plot", str(tmp_path / "b.png")])
    assert exc.value.code == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_arguments_parse_as_documented():
    args = runner.parse(
        ["w1", "softmax-xent", "--size", "1e5", "--compare", "numpy,fastgrad,Numba", "--quick"]
    )
    assert [w.key for w in args.selected] == ["W1", "W2"]
    assert args.size == 100_000
    assert args.compare == ["numpy", "numba"]
    assert args.repeat == runner.QUICK_REPEAT
    defaults = runner.parse([])
    assert defaults.selected == list(workloads.WORKLOADS)
    assert defaults.compare == list(systems.PEERS)
    assert defaults.repeat == runner.DEFAULT_REPEAT


def test_list(capsys):
    assert runner.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "W4" in out and "torch-compile" in out


def _finite_difference(loss, args, argnum, index, eps=1e-6):
    plus = [a.copy() for a in args]
    minus = [a.copy() for a in args]
    plus[argnum][index] += eps
    minus[argnum][index] -= eps
    return (loss(*plus)[0] - loss(*minus)[0]) / (2 * eps)


@pytest.mark.parametrize("workload", workloads.WORKLOADS, ids=lambda w: w.key)
def test_hand_written_numpy_gradients_match_finite_differences(workload):
    size = {"N": 7, "rows": 5, "batch": 3}[workload.size_name]
    args = workload.make_inputs(size, np.float64, np.random.default_rng(1))
    loss = hand_numpy.IMPLEMENTATIONS[workload.key]
    _, grads = loss(*args)
    rng = np.random.default_rng(2)
    for argnum, grad in zip(workload.argnums, grads, strict=True):
        assert grad.shape == args[argnum].shape
        for _ in range(3):
            index = tuple(int(rng.integers(n)) for n in grad.shape)
            expected = _finite_difference(loss, args, argnum, index)
            assert grad[index] == pytest.approx(expected, rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("key", sorted(hand_numba.IMPLEMENTATIONS))
def test_hand_fused_numba_matches_hand_written_numpy(key, dtype):
    workload = workloads.find(key)
    size = {"N": 100, "rows": 6}[workload.size_name]
    args = workload.make_inputs(size, dtype, np.random.default_rng(3))
    value, grads = hand_numba.IMPLEMENTATIONS[key](*args)
    ref_value, ref_grads = hand_numpy.IMPLEMENTATIONS[key](*args)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    assert value == pytest.approx(ref_value, rel=rtol)
    for g, r in zip(grads, ref_grads, strict=True):
        assert g.dtype == dtype
        np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol * np.abs(r).max())


def test_plot_writes_a_png(quick_run, tmp_path):
    pytest.importorskip("matplotlib")
    _, doc = quick_run
    path = tmp_path / "bench.png"
    report.plot(doc, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_dask_workload_runs_on_a_cluster_and_splits_its_time():
    pytest.importorskip("distributed")
    spec = {
        "kind": "workload",
        "system": "dask-2",
        "workload": "D1",
        "size": 3000,
        "dtype": "float64",
        "repeat": 3,
        "budget_s": 1.0,
        "threads": 2,
    }
    result = child.launch(spec, timeout=600)
    assert result["status"] == "ok", result
    b = result["breakdown"]
    assert b["calls"] == len(b["walls_s"]) and 0 < b["compute_s"] <= b["wall_s"]
    assert b["overhead_s"] == pytest.approx(b["wall_s"] - b["compute_s"])
    # The same numbers as hand-written NumPy on the same chunks, made in this process.
    w, x, y = workloads.DASK.make_inputs(3000, np.dtype("float64"), None)
    value, (grad,) = hand_numpy.logistic(w, x, y)
    assert result["value"] == pytest.approx(value, rel=1e-12)
    assert result["fingerprint"]["grads"][0]["l2"] == pytest.approx(np.linalg.norm(grad), rel=1e-9)
    assert workloads.find("dask") is workloads.DASK and workloads.DASK not in workloads.WORKLOADS


def test_the_models_group_expands_and_its_workloads_are_named():
    args = runner.parse(["models", "W4", "--quick"])
    assert [w.key for w in args.selected] == ["W4", "M1", "M2", "M3", "M4", "M5"]
    assert workloads.find("transformer") is models.MODELS[1]
    assert all(w.systems == models.MODEL_SYSTEMS for w in models.MODELS)
    suite = runner.Suite(runner.parse(["models", "--compare", "jax"]), threads=1)
    assert suite.systems_for(models.MODELS[0]) == ["fastgrad", "jax"]
    dask = runner.Suite(runner.parse(["dask", "--compare", "jax"]), threads=1)
    assert dask.systems_for(workloads.DASK) == ["fastgrad", "dask-1", "dask-2"]


@pytest.mark.parametrize("workload", models.MODELS, ids=lambda w: w.key)
def test_model_gradients_match_finite_differences(workload):
    """The models' maths, run by fastgrad's reference interpreter at tiny sizes: the
    gradients (or the Hessian-vector product) against central differences."""
    import fastgrad as fg

    fastgrad = systems.Fastgrad()
    fastgrad.setup(threads=1)
    ops = fastgrad.ops
    size = {"T": 2, "batch": 1, "N": 6, "rows": 8}[workload.size_name]
    args = workload.make_inputs(size, np.dtype(np.float64), np.random.default_rng(4))
    if workload.key == "M2":  # a shorter sequence keeps the interpreter quick
        args = (*args[:-1], args[-1][:, :4])
    loss = systems.bind(workload, ops)

    def value(*a):
        return float(fg.jit(loss, fuse=False)(*a))

    if workload.transform == "hvp":
        x, v = args
        hvp = fg.jit(lambda x, v: fg.jvp(fg.grad(loss), (x,), (v,))[1], fuse=False)(x, v)
        eps = 1e-4
        grad = fg.jit(fg.grad(loss), fuse=False)
        expected = (grad(x + eps * v) - grad(x - eps * v)) / (2 * eps)
        np.testing.assert_allclose(hvp, expected, rtol=1e-6, atol=1e-8)
        return
    vg = fg.jit(fg.value_and_grad(loss, argnums=workload.argnums), fuse=False)
    got, grads = vg(*args)
    assert got == pytest.approx(value(*args), rel=1e-12)
    rng = np.random.default_rng(5)
    for argnum, grad in zip(workload.argnums, grads, strict=True):
        index = tuple(int(rng.integers(n)) for n in grad.shape)
        plus = [a.copy() for a in args]
        minus = [a.copy() for a in args]
        plus[argnum][index] += 1e-6
        minus[argnum][index] -= 1e-6
        expected = (value(*plus) - value(*minus)) / 2e-6
        assert grad[index] == pytest.approx(expected, rel=1e-5, abs=1e-8), argnum


def test_per_example_gradients_match_a_loop_of_jitted_gradients():
    # V1 (run when named): fastgrad's jit(vmap(value_and_grad)) against fastgrad-loop.
    w = workloads.find("per-example")
    assert w is workloads.PER_EXAMPLE and w not in workloads.WORKLOADS
    assert "fastgrad-loop" not in systems.PEERS  # runs only where a workload names it
    outs = {}
    for name in ("fastgrad", "fastgrad-loop"):
        system = systems.SYSTEMS[name]
        system.setup(1)
        args = system.inputs(w, 5, np.dtype(np.float64))
        outs[name] = system.to_numpy(system.build(w)(*args))
    (value, grads), (loop_value, loop_grads) = outs["fastgrad"], outs["fastgrad-loop"]
    assert value == pytest.approx(loop_value, rel=1e-12)
    assert [g.shape for g in grads] == [(5, 64, 64), (5, 64), (5, 64, 10), (5, 10)]
    for g, h in zip(grads, loop_grads, strict=True):
        np.testing.assert_allclose(g, h, rtol=1e-10, atol=1e-14)
    with pytest.raises(systems.NotApplicable):
        systems.SYSTEMS["fastgrad-loop"].build(workloads.find("W1"))
