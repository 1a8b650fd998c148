"""The record builder of NumPy-named elementwise ops, shared by the elementwise, math and
piecewise families: `elementwise(...)` takes the type rule from the NumPy ufunc the op
mirrors; `loop` is the scalar expression a fused loop computes (a template over operands
{0}, {1}, ... with {T} the output's scalar type, or "call:NAME" for a math function; see
fastgrad.compiler.codegen.loops).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.core.ir import SUPPORTED_DTYPES, Aval
from fastgrad.core.primitive import Point, Primitive, register
from fastgrad.ops.base import batch_stacked


@functools.cache
def _result_dtype(ufunc: Any, dtypes: tuple[np.dtype, ...]) -> np.dtype:
    with np.errstate(all="ignore"):
        return np.asarray(ufunc(*(np.zeros((), d) for d in dtypes))).dtype


def _elementwise_eval(name: str, ufunc: Any) -> Callable[..., Aval]:
    def abstract_eval(*avals: Aval) -> Aval:
        first = avals[0]
        shape, weak = first.shape, first.weak
        for a in avals[1:]:  # (loops, not generators: this runs at every traced op)
            if a.shape != shape:
                raise ValueError(
                    f"{name} needs operands of one shape, got {[a.shape for a in avals]}"
                )
            weak = weak and a.weak
        dtype = _result_dtype(ufunc, tuple([a.dtype for a in avals]))
        if dtype not in SUPPORTED_DTYPES:  # float16, from small integers (sqrt of int8)
            raise TypeError(
                f"{name} of {' and '.join(a.dtype.name for a in avals)} gives {dtype.name}, "
                "which fastgrad does not support; convert to float32 or float64 first"
            )
        if dtype == first.dtype and weak == first.weak:
            return first  # (avals are immutable: the output shares its input's)
        return Aval(shape, dtype, weak)

    return abstract_eval


_INFIX = {
    "add": "+", "subtract": "-", "multiply": "*", "divide": "/", "power": "**",
    "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
    "equal": "==", "not_equal": "!=", "logical_and": "&", "logical_or": "|",
}  # fmt: skip


def format_infix(symbol: str) -> Callable[[list[str], dict[str, Any]], str]:
    return lambda args, params: f"{args[0]} {symbol} {args[1]}"


def elementwise(
    name: str,
    ufunc: Any,
    vjp: Callable[..., Any] | None,
    domain: tuple[str, ...] = (),
    impl: Callable[..., Any] | None = None,
    loop: str | None = None,
    jvp: Callable[..., Any] | None = None,
    special_points: tuple[Point, ...] = (),
) -> Primitive:
    fmt = None
    if name in _INFIX:
        fmt = format_infix(_INFIX[name])
    elif name == "negative":
        fmt = lambda args, params: f"-{args[0]}"  # noqa: E731
    return register(
        Primitive(
            name,
            _elementwise_eval(name, ufunc),
            impl or ufunc,
            vjp,
            jvp,
            batch_stacked(name),
            kind="elementwise",
            domain=domain,
            format=fmt,
            ufunc=ufunc,
            loop=loop or f"call:{name}",
            special_points=special_points,
        )
    )
