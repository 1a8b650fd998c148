"""The README's and the guides' code runs and prints what the page says it prints.

Each page's ```python blocks run in order in one namespace, as a reader would run them; a
```text block right after one is what that block prints on stdout, compared exactly.
```console blocks (stderr, timings) and ```bash blocks are shown, not compared.
"""

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def blocks(page: Path = README) -> list[tuple[str, str | None]]:
    """(code, expected stdout or None) for each python block of `page`, in order."""
    text = page.read_text()
    found = [(m.group(1), m.group(2), m.start(), m.end()) for m in BLOCK.finditer(text)]
    out = []
    for i, (lang, code, _, end) in enumerate(found):
        if lang != "python":
            continue
        expected = None
        if i + 1 < len(found):
            nxt_lang, nxt_code, nxt_start, _ = found[i + 1]
            if nxt_lang == "text" and not text[end:nxt_start].strip():
                expected = nxt_code
        out.append((code, expected))
    return out


def run_page(page: Path) -> list[tuple[str, str | None, str]]:
    """Run a page's python blocks in order: (code, expected, printed) for each."""
    scope: dict = {"__name__": "docs"}
    results = []
    for number, (code, expected) in enumerate(blocks(page)):
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            exec(compile(code, f"{page.name} python block {number}", "exec"), scope)  # noqa: S102
        results.append((code, expected, stdout.getvalue()))
    return results


def test_the_readme_has_code_with_output():
    found = blocks()
    assert len(found) >= 5 and sum(e is not None for _, e in found) >= 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs_and_prints_what_the_page_shows(page):
    for number, (code, expected, printed) in enumerate(run_page(page)):
        if expected is not None:
            assert printed == expected, f"{page.name} python block {number}:\n{code}"


if __name__ == "__main__":  # print what each block of a page prints, to write the page
    import sys

    for code, _, printed in run_page(Path(sys.argv[1])):
        print("=" * 30, code.splitlines()[0] if code else "", "\n" + printed, end="")
