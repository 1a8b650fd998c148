"""The repository's text files hold no leftovers of an unfinished merge: a conflict marker
in a Markdown page still builds (Sphinx shows it as text) and would reach readers."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".rst", ".sh"}
# "=======" alone is also a reStructuredText title rule: the two outer markers suffice.
MARKER = re.compile(r"^(<<<<<<<|>>>>>>>) ", re.MULTILINE)


def _text_files() -> list[Path]:
    skip = {".git", ".venv", "build", "_build", "__pycache__", ".hypothesis"}
    return [
        path
        for path in ROOT.rglob("*")
        if path.suffix in TEXT_SUFFIXES
        and path.is_file()
        and not skip & set(path.relative_to(ROOT).parts)
    ]


def test_no_merge_conflict_markers():
    found = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
        for path in _text_files()
        for text in [path.read_text(errors="replace")]
        for match in MARKER.finditer(text)
    ]
    assert not found, f"merge conflict markers left in: {found}"
