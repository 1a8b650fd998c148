"""Seeing values inside traced code: `fg.debug.print(fmt, *values)` prints what the values
are when the code runs, at every call of a jitted function, compiled or not.
"""

from fastgrad.ops.debug import debug_print as print  # noqa: A001  named as in JAX

__all__ = ["print"]
