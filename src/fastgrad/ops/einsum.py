"""einsum: Einstein summation over any subscripts, as a plan of existing primitives.

The subscripts are parsed (explicit or implicit output, ellipses, the sublist form), each
operand's repeated labels become diagonals, size-1 axes broadcast, labels found nowhere
else are summed at once, and the operands are contracted in pairs in the order
``numpy.einsum_path`` chooses to minimise work. A pair that sums over shared labels is a
(batched) matmul, so BLAS does it; one that shares no summed label is a broadcast
multiply, and one that leaves no free label a multiply-and-sum: both fuse.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import astype, coerce, promote, reshape, sum
from fastgrad.ops.elementwise import multiply
from fastgrad.ops.products import matmul
from fastgrad.ops.selection import diagonal
from fastgrad.ops.shape import transpose

__all__ = ["einsum", "einsum_path"]

_LETTERS = string.ascii_letters


class _Term:
    """One operand during the plan: its value and one label per axis."""

    def __init__(self, value: Any, labels: str):
        self.value = value
        self.labels = labels

    @property
    def shape(self) -> tuple[int, ...]:
        return aval_of(self.value).shape


# ---------------------------------------------------------------- parsing


def _from_sublists(args: Sequence[Any]) -> tuple[str, list[Any]]:
    """The subscripts string and operands of einsum(op0, sub0, op1, sub1, ..., [out])."""
    args = list(args)
    output = args.pop() if len(args) % 2 else None

    def letters(sub: Any) -> str:
        out = ""
        for s in sub:
            if s is Ellipsis:
                out += "..."
            elif isinstance(s, int | np.integer) and 0 <= s < len(_LETTERS):
                out += _LETTERS[s]
            else:
                raise ValueError(
                    f"einsum: sublist labels must be ints in [0, 52) or ..., got {s!r}"
                )
        return out

    inputs = ",".join(letters(sub) for sub in args[1::2])
    return inputs + ("" if output is None else "->" + letters(output)), args[0::2]


def _parse(subscripts: str, ndims: list[int]) -> tuple[list[str], str]:
    """Each operand's labels and the output's, with ellipses spelled out as spare letters
    (right-aligned: an operand with fewer broadcast axes takes the last ones)."""
    subscripts = subscripts.replace(" ", "")
    lhs, arrow, rhs = subscripts.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise ValueError(
            f"einsum: {len(terms)} operand subscripts in {subscripts!r} for {len(ndims)} operands"
        )
    if "->" in rhs:
        raise ValueError(f"einsum: subscripts {subscripts!r} have more than one '->'")
    for term in [*terms, rhs]:
        if term.count("...") > 1 or any(c not in _LETTERS for c in term.replace("...", "")):
            raise ValueError(
                f"einsum: {term!r} in {subscripts!r} is not labels (a-z, A-Z) with at most "
                "one ellipsis"
            )
    width = []  # each operand's number of broadcast (ellipsis) axes
    for term, ndim in zip(terms, ndims, strict=True):
        named = len(term.replace("...", ""))
        if ("..." in term and named > ndim) or ("..." not in term and named != ndim):
            raise ValueError(
                f"einsum: subscripts {term!r} do not fit an operand of {ndim} dimensions"
            )
        width.append(ndim - named)
    spare = [c for c in _LETTERS if c not in subscripts]
    if max(width) > len(spare):
        raise ValueError("einsum: too many labels (at most 52 in all)")
    ellipsis = "".join(spare[: max(width)])
    labels = [
        term.replace("...", ellipsis[len(ellipsis) - w :])
        for term, w in zip(terms, width, strict=True)
    ]
    if arrow:
        output = rhs.replace("...", ellipsis)
    else:  # NumPy's implicit output: the broadcast axes, then labels seen once, sorted
        seen = "".join(labels)
        output = ellipsis + "".join(
            sorted(c for c in set(seen) - set(ellipsis) if seen.count(c) == 1)
        )
    for c in output:
        if output.count(c) > 1:
            raise ValueError(f"einsum: output label {c!r} appears more than once")
        if not any(c in t for t in labels):
            raise ValueError(f"einsum: output label {c!r} is in no operand")
    return labels, output


# ---------------------------------------------------------------- the plan


def _arranged(term: _Term, order: Sequence[str]) -> Any:
    return transpose(term.value, [term.labels.index(c) for c in order])


def _take_diagonals(term: _Term) -> _Term:
    """A label repeated within one operand means its diagonal (NumPy's 'ii->i')."""
    while True:
        repeated = [c for c in term.labels if term.labels.count(c) > 1]
        if not repeated:
            return term
        c = repeated[0]
        i = term.labels.index(c)
        j = term.labels.index(c, i + 1)
        if term.shape[i] != term.shape[j]:
            raise ValueError(
                f"einsum: label {c!r} is repeated on axes of sizes {term.shape[i]} and "
                f"{term.shape[j]}; a diagonal needs equal sizes"
            )
        rest = "".join(x for k, x in enumerate(term.labels) if k not in (i, j))
        term = _Term(diagonal(term.value, 0, i, j), rest + c)


def _label_sizes(terms: list[_Term]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for t in terms:
        for c, d in zip(t.labels, t.shape, strict=True):
            known = sizes.get(c, 1)
            if d != known and 1 not in (d, known):
                raise ValueError(f"einsum: label {c!r} has sizes {known} and {d}, which differ")
            sizes[c] = d if known == 1 else known
    return sizes


def _without_broadcast_axes(term: _Term, sizes: dict[str, int]) -> _Term:
    """A size-1 axis whose label is longer elsewhere is constant along it: drop it."""
    keep = [k for k, c in enumerate(term.labels) if term.shape[k] == sizes[c]]
    if len(keep) == len(term.labels):
        return term
    labels = "".join(term.labels[k] for k in keep)
    return _Term(reshape(term.value, tuple(term.shape[k] for k in keep)), labels)


def _sum_unused(term: _Term, needed: set[str]) -> _Term:
    """`term` summed over the labels nothing later needs."""
    axes = tuple(k for k, c in enumerate(term.labels) if c not in needed)
    if not axes:
        return term
    labels = "".join(c for c in term.labels if c in needed)
    return _Term(sum(term.value, axis=axes), labels)


def _contract(a: _Term, b: _Term, keep: set[str]) -> _Term:
    """The contraction of two operands, keeping the labels in `keep`."""
    a = _sum_unused(a, keep | set(b.labels))
    b = _sum_unused(b, keep | set(a.labels))
    shared = [c for c in a.labels if c in b.labels]
    batch = [c for c in shared if c in keep]
    summed = [c for c in shared if c not in keep]
    free_a = [c for c in a.labels if c not in shared]
    free_b = [c for c in b.labels if c not in shared]
    size = dict(zip(a.labels, a.shape, strict=True)) | dict(zip(b.labels, b.shape, strict=True))
    dims = lambda cs: tuple(size[c] for c in cs)  # noqa: E731
    out_labels = "".join(batch + free_a + free_b)
    if not summed:  # an outer product over the batch: a broadcast multiply (fuses)
        x = reshape(_arranged(a, batch + free_a), dims(batch + free_a) + (1,) * len(free_b))
        y = reshape(_arranged(b, batch + free_b), dims(batch) + (1,) * len(free_a) + dims(free_b))
        return _Term(multiply(x, y), out_labels)
    if not free_a and not free_b:  # a batched dot product: multiply and sum (fuses)
        x = _arranged(a, batch + summed)
        y = _arranged(b, batch + summed)
        return _Term(sum(multiply(x, y), axis=tuple(range(len(batch), len(shared)))), out_labels)
    # A batched matrix product, for BLAS.
    lead, nk = (math.prod(dims(batch)),) if batch else (), math.prod(dims(summed))
    x = reshape(_arranged(a, batch + free_a + summed), (*lead, math.prod(dims(free_a)), nk))
    y = reshape(_arranged(b, batch + summed + free_b), (*lead, nk, math.prod(dims(free_b))))
    return _Term(reshape(matmul(x, y), dims(batch + free_a + free_b)), out_labels)


def _path(terms: list[_Term], output: str, optimize: Any) -> list[tuple[int, ...]]:
    """Which operands to contract, in order (positions in the shrinking operand list)."""
    if optimize is False:
        return [(0, 1)] * (len(terms) - 1)
    if isinstance(optimize, list | tuple) and optimize and optimize[0] == "einsum_path":
        return [tuple(p) for p in optimize[1:]]
    strategy = "greedy" if optimize is True else optimize
    spec = ",".join(t.labels for t in terms) + "->" + output
    stand_ins = [np.broadcast_to(np.zeros(()), t.shape) for t in terms]
    return [tuple(p) for p in np.einsum_path(spec, *stand_ins, optimize=strategy)[0][1:]]


def einsum(*operands: Any, dtype: Any = None, optimize: Any = "greedy") -> Any:
    """Einstein summation, as ``numpy.einsum``: subscripts with an explicit or implicit
    output, repeated labels (diagonals), ellipses and broadcasting, or the sublist form.

    Operands are contracted in pairs in the order `optimize` gives ("greedy", "optimal",
    False for left to right, or a path from `einsum_path`); summed products go to BLAS.

    >>> a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    >>> np.array_equal(einsum("ij,jk->ik", a, b), a @ b)
    True
    >>> einsum("ii->i", np.arange(9.0).reshape(3, 3))
    array([0., 4., 8.])
    """
    if not operands:
        raise TypeError("einsum needs subscripts and at least one operand")
    if isinstance(operands[0], str):
        subscripts, arrays = operands[0], list(operands[1:])
    else:
        subscripts, arrays = _from_sublists(operands)
    if not arrays:
        raise TypeError("einsum needs at least one operand")
    arrays = [a if isinstance(a, Tracer) else np.asarray(a) for a in arrays]
    avals = [aval_of(a) for a in arrays]
    common = np.dtype(dtype) if dtype is not None else promote(avals)[0]
    tracing = any(isinstance(a, Tracer) for a in arrays)
    arrays = [coerce(a, v, common, v.shape, tracing) for a, v in zip(arrays, avals, strict=True)]
    labels, output = _parse(subscripts, [v.ndim for v in avals])
    terms = [_take_diagonals(_Term(a, t)) for a, t in zip(arrays, labels, strict=True)]
    sizes = _label_sizes(terms)
    terms = [_without_broadcast_axes(t, sizes) for t in terms]
    for pair in _path(terms, output, optimize):
        picked = [terms[i] for i in pair]
        terms = [t for i, t in enumerate(terms) if i not in pair]
        keep = set(output).union(*(t.labels for t in terms))
        result = picked[0]
        for k, other in enumerate(picked[1:], start=2):
            later = set().union(*(t.labels for t in picked[k:]))
            result = _contract(result, other, keep | later)
        terms.append(result)
    (last,) = terms
    last = _sum_unused(last, set(output))
    return astype(_arranged(last, output), common) if dtype is not None else _arranged(last, output)


def einsum_path(*operands: Any, optimize: Any = "greedy") -> Any:
    """``numpy.einsum_path`` (the contraction order einsum follows); traced operands
    stand for arrays of their shape.

    >>> einsum_path('ij,jk,kl->il', np.ones((2, 3)), np.ones((3, 4)), np.ones((4, 5)))[0]
    ['einsum_path', (1, 2), (0, 1)]
    """
    stand_ins = [
        np.broadcast_to(np.zeros((), a.dtype), a.shape) if isinstance(a, Tracer) else a
        for a in operands
    ]
    return np.einsum_path(*stand_ins, optimize=optimize)
