"""SciPy-like namespaces that work on plain arrays and traced values alike:
`fastgrad.scipy.special`, `fastgrad.scipy.linalg` and `fastgrad.scipy.stats`. Like
fastgrad.numpy they only gather functions that live with their primitives in fastgrad.ops.
"""

from fastgrad.scipy import linalg, special, stats

__all__ = ["linalg", "special", "stats"]
