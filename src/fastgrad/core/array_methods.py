"""The array methods of a traced value (`.T`, `.reshape`, `.sum`, ...), and the array
functions behind them and behind its operators: each method calls the function of its
name that fastgrad.ops installs (`install_array_functions`), which core does not import.
"""

from __future__ import annotations

from typing import Any


class _ArrayFunctions:
    """The array functions (add, reshape, sum, ...) behind a tracer's operators and methods.

    fastgrad.ops fills this in when it is imported; until then there is nothing to trace.
    """

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"array function {name!r} is not installed: import fastgrad, not only fastgrad.core"
        )


_fn: Any = _ArrayFunctions()


def install_array_functions(functions: dict[str, Any]) -> None:
    """Make `functions` (name -> function) what a tracer's operators and methods call."""
    vars(_fn).update(functions)


class ArrayMethods:
    """NumPy's array methods on a tracer (core.tracing.Tracer derives from this)."""

    __slots__ = ()

    @property
    def T(self) -> Any:
        return _fn.transpose(self)

    def transpose(self, *axes: Any) -> Any:
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], tuple | list)):
            return _fn.transpose(self, axes[0])
        return _fn.transpose(self, axes or None)

    def reshape(self, *shape: Any) -> Any:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return _fn.reshape(self, shape)

    def astype(self, dtype: Any) -> Any:
        return _fn.astype(self, dtype)

    def sum(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _fn.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _fn.mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _fn.max(self, axis=axis, keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _fn.min(self, axis=axis, keepdims=keepdims)

    def prod(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _fn.prod(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis: Any = None) -> Any:
        return _fn.argmax(self, axis=axis)

    def argmin(self, axis: Any = None) -> Any:
        return _fn.argmin(self, axis=axis)

    def squeeze(self, axis: Any = None) -> Any:
        return _fn.squeeze(self, axis=axis)

    def var(self, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Any:
        return _fn.var(self, axis=axis, keepdims=keepdims, ddof=ddof)

    def std(self, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Any:
        return _fn.std(self, axis=axis, keepdims=keepdims, ddof=ddof)

    def dot(self, other: Any) -> Any:
        return _fn.dot(self, other)

    def clip(self, a_min: Any = None, a_max: Any = None) -> Any:
        return _fn.clip(self, a_min, a_max)

    def swapaxes(self, axis1: int, axis2: int) -> Any:
        return _fn.swapaxes(self, axis1, axis2)

    def copy(self) -> Any:
        return self  # traced values are immutable: a copy is the value itself

    def ravel(self) -> Any:
        return _fn.reshape(self, (-1,))

    flatten = ravel

    def cumsum(self, axis: Any = None) -> Any:
        return _fn.cumsum(self, axis=axis)

    def cumprod(self, axis: Any = None) -> Any:
        return _fn.cumprod(self, axis=axis)

    def round(self, decimals: int = 0) -> Any:
        return _fn.round(self, decimals)

    def any(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _fn.any(self, axis=axis, keepdims=keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _fn.all(self, axis=axis, keepdims=keepdims)

    def argsort(self, axis: Any = -1) -> Any:
        return _fn.argsort(self, axis=axis)

    def diagonal(self, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Any:
        return _fn.diagonal(self, offset, axis1, axis2)

    def repeat(self, repeats: Any, axis: Any = None) -> Any:
        return _fn.repeat(self, repeats, axis)

    def take(self, indices: Any, axis: Any = None) -> Any:
        return _fn.take(self, indices, axis)

    def conj(self) -> Any:
        return _fn.conj(self)

    conjugate = conj

    @property
    def real(self) -> Any:
        return _fn.real(self)

    @property
    def imag(self) -> Any:
        return _fn.imag(self)
