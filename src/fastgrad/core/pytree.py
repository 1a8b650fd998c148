"""Pytrees: nested tuples, lists, dicts (and namedtuples) of array leaves.

`flatten` turns a tree into its leaves and a hashable `TreeDef`; `unflatten` rebuilds it.
`None` is an empty subtree, as in JAX. Dict keys are sorted so that equal dicts flatten alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple


class TreeDef(NamedTuple):
    """The structure of a pytree: a node kind, its auxiliary data, and its children."""

    kind: str  # "leaf", "none", "tuple", "list", "dict" or "namedtuple"
    aux: Any  # dict keys, or the namedtuple class
    children: tuple[TreeDef, ...]

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def __repr__(self) -> str:
        return f"TreeDef({_describe(self)})"


LEAF = TreeDef("leaf", None, ())
_NONE = TreeDef("none", None, ())


def _describe(t: TreeDef) -> str:
    if t.kind == "leaf":
        return "*"
    if t.kind == "none":
        return "None"
    inner = [_describe(c) for c in t.children]
    if t.kind == "tuple":
        return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
    if t.kind == "list":
        return "[" + ", ".join(inner) + "]"
    if t.kind == "dict":
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(t.aux, inner, strict=True)) + "}"
    return f"{t.aux.__name__}(" + ", ".join(inner) + ")"


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def flatten(tree: Any, path: str = "") -> tuple[list[Any], TreeDef]:
    """Flatten `tree` into (leaves, treedef); anything that is not a container is a leaf.

    >>> leaves, t = flatten({"b": (1, 2), "a": [3]})
    >>> leaves
    [3, 1, 2]
    >>> unflatten(t, [30, 10, 20])
    {'a': [30], 'b': (10, 20)}
    """
    leaves: list[Any] = []
    treedef = _flatten(tree, leaves)
    return leaves, treedef


def _flatten(x: Any, leaves: list[Any]) -> TreeDef:
    if x is None:
        return _NONE
    if _is_namedtuple(x):
        return TreeDef("namedtuple", type(x), tuple(_flatten(c, leaves) for c in x))
    if isinstance(x, tuple):
        return TreeDef("tuple", None, tuple(_flatten(c, leaves) for c in x))
    if isinstance(x, list):
        return TreeDef("list", None, tuple(_flatten(c, leaves) for c in x))
    if isinstance(x, dict):
        try:
            keys = tuple(sorted(x))
        except TypeError as e:
            raise TypeError(f"pytree dict keys must be sortable; got keys {list(x)!r}") from e
        return TreeDef("dict", keys, tuple(_flatten(x[k], leaves) for k in keys))
    leaves.append(x)
    return LEAF


def unflatten(treedef: TreeDef, leaves: Any) -> Any:
    """Rebuild a pytree of structure `treedef` from an iterable of leaves."""
    it = iter(leaves)
    out = _unflatten(treedef, it)
    if next(it, _sentinel) is not _sentinel:
        raise ValueError(f"too many leaves for {treedef!r}")
    return out


_sentinel = object()


def _unflatten(t: TreeDef, it: Iterator[Any]) -> Any:
    if t.kind == "leaf":
        leaf = next(it, _sentinel)
        if leaf is _sentinel:
            raise ValueError("too few leaves for the tree structure")
        return leaf
    if t.kind == "none":
        return None
    children = [_unflatten(c, it) for c in t.children]
    if t.kind == "tuple":
        return tuple(children)
    if t.kind == "list":
        return children
    if t.kind == "dict":
        return dict(zip(t.aux, children, strict=True))
    return t.aux(*children)


@functools.lru_cache(maxsize=256)
def builder(treedef: TreeDef) -> Callable[[Sequence[Any]], Any]:
    """A fast `unflatten` for one structure: jitted functions call it on every result.

    Nested tuples, lists and None are written out as one expression; other structures
    fall back to `unflatten`.
    """
    text = expression(treedef, [f"o[{i}]" for i in range(treedef.num_leaves)])
    if text is None:
        return lambda leaves: unflatten(treedef, leaves)
    return eval(f"lambda o: {text}")  # noqa: S307  built from the structure alone


def expression(treedef: TreeDef, leaves: Sequence[str]) -> str | None:
    """Python source building the structure `treedef` from the expressions `leaves`, one
    per leaf in order; None unless it is made of tuples, lists, None and leaves.

    >>> expression(flatten((1, [2, None]))[1], ["a", "b"])
    '(a, [b, None])'
    """
    counter = iter(leaves)

    def expr(t: TreeDef) -> str | None:
        if t.kind == "leaf":
            return next(counter)
        if t.kind == "none":
            return "None"
        if t.kind not in ("tuple", "list"):
            return None
        parts = [expr(c) for c in t.children]
        if any(p is None for p in parts):
            return None
        inner = ", ".join(parts) + ("," if t.kind == "tuple" and len(parts) == 1 else "")  # type: ignore[arg-type]
        return f"({inner})" if t.kind == "tuple" else f"[{inner}]"

    return expr(treedef)


def leaf_paths(tree: Any, prefix: str = "") -> list[str]:
    """Readable paths of the leaves, in `flatten` order: ``params['w']``, ``xs[0]``."""
    paths: list[str] = []

    def walk(x: Any, p: str) -> None:
        if x is None:
            return
        if isinstance(x, tuple | list):
            for i, c in enumerate(x):
                walk(c, f"{p}[{i}]")
        elif isinstance(x, dict):
            for k in sorted(x):
                walk(x[k], f"{p}[{k!r}]")
        else:
            paths.append(p)

    walk(tree, prefix)
    return paths


def tree_map(f: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """Apply `f` leafwise to `tree` (and to trees of the same structure in `rest`)."""
    leaves, t = flatten(tree)
    others = []
    for r in rest:
        r_leaves, r_t = flatten(r)
        if r_t != t:
            raise ValueError(f"tree structures differ: {t!r} and {r_t!r}")
        others.append(r_leaves)
    return unflatten(t, [f(*xs) for xs in zip(leaves, *others, strict=True)])
