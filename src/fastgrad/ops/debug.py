"""Debug printing from traced code: the `debug_print` effect behind `fg.debug.print`.

Inside a trace the call is a node that prints its values when the graph runs, at every
call, compiled or interpreted. It is an effect (core.primitive): never pruned, merged or
folded, chained to the effect before it so prints come in program order, and a library
call of its own for fusion, so it costs no more than keeping the printed values.
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, register
from fastgrad.core.pytree import TreeDef, flatten, unflatten
from fastgrad.core.tracing import Tracer, aval_of, current_trace

__all__: list[str] = []  # public as fastgrad.debug.print


def _format(fmt: str, tree: TreeDef, leaves: list[Any]) -> str:
    args, kwargs = unflatten(tree, leaves)
    return fmt.format(*args, **kwargs)


def _print_impl(token: Any, *values: np.ndarray, fmt: str, tree: TreeDef) -> np.ndarray:
    builtins.print(_format(fmt, tree, [np.asarray(v) for v in values]), flush=True)
    return np.asarray(True)


def _print_eval(token: Aval, *values: Aval, fmt: str, tree: TreeDef) -> Aval:
    return Aval((), np.dtype(bool))


DEBUG_PRINT = register(
    Primitive(
        "debug_print",
        _print_eval,
        _print_impl,
        None,  # prints what it is given; nothing to differentiate
        kind="other",
        effect=True,
        format=lambda args, params: f"debug_print({params['fmt']!r}, {', '.join(args[1:])})",
    )
)


def debug_print(fmt: str, *args: Any, **kwargs: Any) -> None:
    """Print `fmt.format(*args, **kwargs)` with the values `args` have when the code runs.

    Under `fg.jit` it prints at every call (not once, at tracing, as `print` would), in
    order with other debug prints, in compiled and interpreted runs alike; under `grad` or
    `jvp` it prints the values of the function being differentiated. Arguments are arrays
    and numbers, or pytrees of them.

    >>> import fastgrad as fg, fastgrad.numpy as fnp
    >>> @fg.jit
    ... def f(x):
    ...     fg.debug.print("x = {}, sum = {s}", x, s=fnp.sum(x))
    ...     return x * 2
    >>> _ = f(np.array([1.0, 2.0]))
    x = [1. 2.], sum = 3.0
    >>> _ = f(np.array([3.0, 4.0]))
    x = [3. 4.], sum = 7.0
    """
    if not isinstance(fmt, str):
        raise TypeError(f"fg.debug.print: the format must be a str, got {type(fmt).__name__}")
    leaves, tree = flatten((args, kwargs))
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, Tracer | np.ndarray | np.generic | bool | int | float):
            raise TypeError(
                f"fg.debug.print: value {i} is a {type(leaf).__name__}; pass arrays and "
                "numbers (text goes in the format string)"
            )
    # A format that does not fit the values fails here, while tracing, not when it runs.
    _format(fmt, tree, [np.zeros(aval_of(leaf).shape, aval_of(leaf).dtype) for leaf in leaves])
    trace = current_trace()
    if trace is None:
        _print_impl(None, *leaves, fmt=fmt, tree=tree)
        return
    # The first argument stands for the effect token, which the trace puts in its place.
    trace.emit(DEBUG_PRINT, [None, *leaves], {"fmt": fmt, "tree": tree})
