"""Row values read by later loops through their broadcast: stored as rows, broadcast again
where they are read.

A loop that makes a row value (one per outer index: a softmax's row sum, a layer norm's
root) and broadcasts it over its shape for its own elements may have that broadcast read
by a later loop too (a backward loop dividing by the same sums). Stored as it is, the
broadcast is a full array written once and read back for one value a row: bench M2's
softmax and its second layer norm each stored 0.5 MB in float32 so, for 1024 row values.
Fusion copies cheap work into the loops that read it (`fusion._copy_cheap_outputs` and
`_store_roots`, through `_cheap_cone`); these rules make a broadcast of the loop's own row
value such work: it is a load (the row value is read from memory, not recomputed: it may
be a reduction), and the loop stores the row value for the copies to read.
"""

from __future__ import annotations

from fastgrad.core.ir import Node, Var


def is_row_load(node: Node, made_here: dict[int, Node], shape: tuple[int, ...]) -> bool:
    """Whether `node` broadcasts a value its loop makes at a smaller shape than the loop's
    (a row value) to `shape`."""
    if node.op.name != "broadcast_to" or node.out.aval.shape != shape:
        return False
    source = made_here.get(id(node.inputs[0]))
    return source is not None and source.out.aval.shape != shape


def is_load(node: Node, made_here: dict[int, Node], shape: tuple[int, ...]) -> bool:
    """Whether a copy of `node` reads its value from memory: a broadcast of a value from
    outside the loop, or of a row value the loop makes."""
    outside = node.op.name == "broadcast_to" and id(node.inputs[0]) not in made_here
    return outside or is_row_load(node, made_here, shape)


def recomputed(node: Node, made_here: dict[int, Node], shape: tuple[int, ...]) -> list[Node]:
    """The nodes of its loop that a copy of `node` needs computed: none for a row load (its
    row value is stored)."""
    if is_row_load(node, made_here, shape):
        return []
    return [made_here[id(u)] for u in node.inputs if id(u) in made_here]


def store_rows_for(
    outputs: list[Var], v: Var, cone: list[Node], made_here: dict[int, Node]
) -> None:
    """The loop stores no `v` any more (copies of `cone` make it where it is read): take it
    from `outputs`, and add the row values those copies read from the loop, if not there."""
    outputs.remove(v)
    inside = {id(n.out) for n in cone}
    stored = {id(u) for u in outputs}
    for n in cone:
        source = n.inputs[0] if n.op.name == "broadcast_to" else None
        if source is not None and id(source) in made_here and id(source) not in inside:
            if id(source) not in stored:
                outputs.append(source)
                stored.add(id(source))
