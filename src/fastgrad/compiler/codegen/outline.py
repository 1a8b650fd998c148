"""A kernel's chunk loop as a function of its own, whose arrays are its arguments.

Arrays a kernel allocates (a column loop's partials or accumulators, one per reduction,
and float32 tiles; the lane form's transposed blocks; a multi-pass row loop's stored
values) come from Numba's allocator, which LLVM cannot see through: it does not know two
of them are apart, so a loop storing into several guards its vector form with run-time
checks that each pair of arrays it stores to and reads from do not overlap, and gives
up past a budget of them: the loop then runs scalar. A column loop of 14 sums or more
(a tanh network's gradient, 13 layers or more: a bias sum per layer, and the loss's) was
"not vectorized: too many memory checks needed" (LLVM 22; raising
-runtime-memory-check-threshold and -pragma-vectorize-memory-check-threshold did not
change it): 15 sums took 8.5x the time of 13; kept in one interleaved array its arrays
needed no checks, but its indices "too many SCEV assumptions" from 17 sums on
(lifted by raising -vectorize-scev-check-threshold: a process-wide option, and a budget
a larger loop meets again).

Passed as arguments of a function compiled with `support.NoAlias`, the arrays are
`noalias` pointers: LLVM knows them apart and checks nothing (32 sums vectorize), and
the loop's statements, and so its results' bits, are those it had in the kernel. The
arrays a chunk uses are allocated before the loop for that (a row per chunk), not in it.
A parallel kernel's prange is the outlined function's; the kernel itself is serial.

A multi-pass row loop's stored values take a row buffer each (`row_buffers`). A parallel
loop's chunks each allocated theirs in the prange, which kept LLVM from telling them
apart again: with 16 stored values its passes ran scalar, and on 2 threads the loop took
1.7x the serial loop's time. A buffer per chunk allocated before the loop took nchunks
rows at once (64 rows of 400,000 float64: 770 MB, 3x the time in page faults); a buffer
of a row per thread (Numba's thread ids count from 0 to its thread count) takes a few,
and each chunk's row is the running thread's: chunks on one thread run one at a time.
Allocated before the prange, the rows are arguments of the function Numba makes of its
body, noalias there as in an outlined loop; the kernel is not outlined as well (that
compiled in 1.25x the time, for the same machine code).
"""

from __future__ import annotations

import re

# The inner function's name: not a name any kernel assigns.
NAME = "kernel_chunks"
_WORD = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
# `name = ...`, `a, b = ...`, `name += ...` (group 2: the operator) or `for name in ...`.
_TARGET = re.compile(r"\s*(?:for\s+)?(\w+(?:\s*,\s*\w+)*)\s*(?:([-+*/%&|^]?)=(?!=)|in\b)")


# Names a parallel loop's row buffers use; none of them a name kernels assign.
_THREADS, _THREAD = "nthreads", "thread"


def row_buffers(
    rows: list[tuple[str, str, str]], parallel: bool, imports: set[str]
) -> tuple[list[str], list[str]]:
    """(lines before the chunk loop, lines opening each chunk) that give each (name,
    length, dtype) of `rows` a buffer of `length` values; adds to `imports` what they
    call."""
    if not parallel:
        return [f"{name} = np.empty({length}, {dtype})" for name, length, dtype in rows], []
    if not rows:
        return [], []
    imports |= {"numba:get_num_threads", "numba:get_thread_id"}
    before = [f"{_THREADS} = get_num_threads()"]
    before += [
        f"{name}s = np.empty(({_THREADS}, {length}), {dtype})" for name, length, dtype in rows
    ]
    chunk = [
        f"{_THREAD} = get_thread_id()",
        *(f"{name} = {name}s[{_THREAD}]" for name, _, _ in rows),
    ]
    return before, chunk


def _split(line: str) -> tuple[list[str], str]:
    """(the names `line` assigns, or binds in a for; the text it reads)."""
    m = _TARGET.match(line)
    if m is None:
        return [], line
    return m.group(1).replace(" ", "").split(","), line if m.group(2) else line[m.end() :]


def outline_chunks(signature: str, lines: list[str], flags: str) -> list[str] | None:
    """The kernel's lines with its chunk loop (the first `for c in ...` of its body)
    moved into `NAME`, followed by that function's lines; None where the loop cannot
    move: no chunk loop, or a name it assigns read after it (a scalar carried out)."""
    start = next((k for k, s in enumerate(lines) if re.match(r" {4}for c in ", s)), None)
    if start is None:
        return None
    end = next(
        (k for k in range(start + 1, len(lines)) if not lines[k].startswith(" " * 8)), len(lines)
    )
    params = signature[signature.index("(") + 1 : signature.rindex(")")].split(", ")
    before = set(params)
    for line in lines[:start]:
        before.update(_split(line)[0])
    block = lines[start:end]
    inside: set[str] = set()
    read: set[str] = set()
    for line in block:
        targets, text = _split(line)
        read.update(_WORD.findall(text))
        inside.update(targets)
    seen: set[str] = set()
    for line in lines[end:]:
        targets, text = _split(line)
        if any(w in inside and w not in seen for w in _WORD.findall(text)):
            return None
        seen.update(targets)
    args = ", ".join(sorted(read & before))
    return [
        *lines[:start],
        f"    {NAME}({args})",
        *lines[end:],
        "",
        "",
        f"@njit({flags})",
        f"def {NAME}({args}):",
        *block,
    ]
