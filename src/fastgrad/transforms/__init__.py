"""Graph-to-graph transformations: reverse mode (vjp_graph), forward mode (jvp_graph), and
the primitive that carries a user's custom VJP rule. Each pass interprets a graph node by
node, re-emitting it into a new trace together with derivative nodes built by the ops'
own rules, so the result is again a plain graph that can be fused or transformed again."""
