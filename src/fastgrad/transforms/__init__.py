"""Graph-to-graph transformations: reverse mode (vjp_graph), forward mode (jvp_graph),
batching for vmap (batch_graph), and the primitives that carry a user's custom VJP rule
or call back into Python. Each pass interprets a graph node by node, re-emitting it into
a new trace with the nodes built by the ops' own rules, so the result is again a plain
graph that can be fused or transformed again."""
