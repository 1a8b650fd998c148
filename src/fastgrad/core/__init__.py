"""The core: the IR (avals, vars, nodes, graphs), the op record and its registry, pytrees,
tracing (how Python code becomes a graph) and the reference interpreter (how a graph runs
on NumPy, or is inlined into another trace). It knows no particular op."""
