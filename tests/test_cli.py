"""The `fastgrad` command and the README's promises."""

import re
from pathlib import Path

from fastgrad.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_info_prints_versions_threads_and_cache(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTGRAD_CACHE_DIR", str(tmp_path))
    (tmp_path / "k.py").write_text("x = 1\n")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("fastgrad", "numpy", "numba", "llvmlite", "threads"):
        assert re.search(rf"^{key}\s+\S", out, re.M), key
    assert f"{tmp_path} (1 files" in out


def test_ci_runs_the_readme_test_command():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- test-command.*?```bash\n(.*?)\n```", text, re.S).group(1)
    assert block == 'pip install -e ".[test]" && python -m pytest -q -n 2'
    assert "test-command" in (ROOT / ".ci" / "run").read_text()
