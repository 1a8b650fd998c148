"""The README's code runs and prints what the README says it prints.

Its ```python blocks run in order in one namespace, as a reader would run them; a ```text
block right after one is what that block prints on stdout, compared exactly. ```console
blocks (stderr, timings) and ```bash blocks are shown, not compared.
"""

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def blocks():
    """(language, code, expected stdout or None) for each python block, in order."""
    text = README.read_text()
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


def test_the_readme_has_code_with_output():
    found = blocks()
    assert len(found) >= 5 and sum(e is not None for _, e in found) >= 5


def test_every_python_block_runs_and_prints_what_the_readme_shows():
    scope: dict = {"__name__": "readme"}
    for number, (code, expected) in enumerate(blocks()):
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            exec(compile(code, f"README python block {number}", "exec"), scope)  # noqa: S102
        if expected is not None:
            assert stdout.getvalue() == expected, f"README python block {number}:\n{code}"
