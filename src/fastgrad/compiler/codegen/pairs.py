"""Loops that take a sample's elements two at a time, where its sampler makes two at once.

A float64 normal comes from a Box-Muller pair: elements 2j and 2j + 1 are r cos and r sin of
one angle, from two Threefry blocks, one logarithm and one square root. A loop over a single
flat axis (a kernel's `for i0` chunk loop with no loop inside it) is rewritten to step over
pairs: the pair is computed once and the loop body runs for element 2j, then 2j + 1, each
with its half. An odd last element runs the body as it was (the sampler's element function
selects the same half of the same pair: the same bits; it is called, not inlined, so the
kernel holds one copy of the sampler). Any other loop keeps computing the pair per element.
"""

from __future__ import annotations

from fastgrad.compiler.codegen.source import chunk_loop

CHUNK = chunk_loop(0)  # the line a flat loop's kernel source holds, rewritten here
# Pairs split into chunks as elements do; a chunk's elements are its pairs' elements.
PAIR_CHUNK = (
    "for q0 in range(np.uint64((c * (n0 // 2)) // nchunks), "
    "np.uint64(((c + 1) * (n0 // 2)) // nchunks)):"
)


def pair_steps(lines: list[str], calls: dict[str, tuple[str, str]]) -> list[str]:
    """`lines` with every chunk loop over i0 that calls an element function of `calls`
    stepping over pairs. `calls` maps the element call's text to the pair call's (of the
    pair index q0) and to the element call the odd last element makes instead."""
    if not calls:
        return lines
    out: list[str] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        if line.strip() != CHUNK:
            out.append(line)
            k += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        inner = indent + "    "
        end = k + 1
        while end < len(lines) and lines[end].startswith(inner):
            end += 1
        body = lines[k + 1 : end]
        used = [c for c in calls if any(c in b for b in body)]
        nested = any(b.lstrip().startswith(("for ", "while ")) for b in body)
        if nested or not used:
            out.extend(lines[k:end])
            k = end
            continue
        out.append(indent + PAIR_CHUNK)
        for m, call in enumerate(used):
            out.append(f"{inner}zp{m}a, zp{m}b = {calls[call][0]}")
        for half, first in (("a", "np.uint64(2) * q0"), ("b", "np.uint64(2) * q0 + np.uint64(1)")):
            out.append(f"{inner}i0 = {first}")
            for b in body:
                for m, call in enumerate(used):
                    b = b.replace(call, f"zp{m}{half}")
                out.append(b)
        out.append(f"{indent}if c == nchunks - 1 and n0 % 2 == 1:  # the odd last element")
        out.append(f"{inner}i0 = np.uint64(n0 - 1)")
        for b in body:
            for call in used:
                b = b.replace(call, calls[call][1])
            out.append(b)
        k = end
    return out
