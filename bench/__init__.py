"""The fastgrad benchmark suite (run it with `fastgrad bench`)."""
