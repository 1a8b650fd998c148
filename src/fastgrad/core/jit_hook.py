"""The Numba decorator for helper functions that kernels call rather than inline (gamma's
sampler in fastgrad.ops.threefry): the compiler layer installs one that keeps machine code
in fastgrad's cache directory (compiler.machine_code), so that an op module need not
import the compiler, and a new process loads those helpers instead of compiling them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Decorator = Callable[[Callable[..., Any]], Any]
_installed: Callable[..., Decorator] | None = None


def install(cached_njit: Callable[..., Decorator]) -> None:
    """Called by the compiler layer: `cached_njit(tag, **options)` gives a decorator."""
    global _installed
    _installed = cached_njit


def njit(tag: str, **options: Any) -> Decorator:
    """`numba.njit(**options)`, cached on disk under `tag` once the compiler layer has
    installed its decorator (it has, whenever a kernel is compiled); plain before.

    >>> twice = njit("doc twice")(lambda x: 2 * x)
    >>> twice(4)
    8
    """
    if _installed is not None:
        return _installed(tag, **options)
    import numba

    return numba.njit(**options)
