"""Functions of integers: bitwise and, or, xor, invert, shifts and bit counts, gcd and lcm.
Records and functions; public under fastgrad.numpy (and `& | ^ ~ << >>` on traced arrays).

Their results are integers, so they have no derivative. They run as NumPy's ufuncs over
whole arrays; on booleans, and, or, xor and invert are the fused logical ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.core.primitive import Primitive, at, register
from fastgrad.core.tracing import Tracer, aval_of
from fastgrad.ops.base import apply_elementwise, batch_stacked
from fastgrad.ops.elementwise import logical_and, logical_not, logical_or, logical_xor

__all__ = [
    "bitwise_and", "bitwise_count", "bitwise_invert", "bitwise_left_shift", "bitwise_not",
    "bitwise_or", "bitwise_right_shift", "bitwise_xor", "gcd", "invert", "lcm", "left_shift",
    "right_shift",
]  # fmt: skip


def _check_kinds(name: str, kinds: str, avals: Any) -> None:
    if any(a.dtype.kind not in kinds for a in avals):
        wanted = "integers or booleans" if "b" in kinds else "integers"
        got = " and ".join(a.dtype.name for a in avals)
        raise TypeError(f"{name}: expected {wanted}, got {got}")


def _integer_eval(name: str, ufunc: Any, kinds: str) -> Callable[..., Aval]:
    def abstract_eval(*avals: Aval) -> Aval:
        if any(a.shape != avals[0].shape for a in avals):
            raise ValueError(f"{name} needs operands of one shape, got {avals}")
        _check_kinds(name, kinds, avals)
        dtype = np.asarray(ufunc(*(np.zeros((), a.dtype) for a in avals))).dtype
        return Aval(avals[0].shape, dtype, weak=all(a.weak for a in avals))

    return abstract_eval


_KINDS: dict[str, str] = {}  # name -> the dtype kinds it takes


# Special points: 0, -1 (all bits set), the extremes of int64, uint8's; shifts by 0 and by
# the width less one; booleans for the logical ones; gcd and lcm of 0 and of negatives.
_I64 = np.iinfo(np.int64)
_INTS = np.array([0, -1, 1, 6, -4, _I64.max, _I64.min, 12])
_OTHERS = np.array([0, 5, -1, -4, 6, 1, -1, 18])
_U8 = np.array([0, 255, 1, 128], dtype=np.uint8)
_POINTS = {
    "unary": (at(_INTS), at(_U8)),
    "binary": (at(_INTS, _OTHERS), at(_U8, _U8[::-1])),
    "logical": (at(_INTS, _OTHERS), at(_U8, _U8[::-1]),
                at(np.array([True, False, True]), np.array([True, True, False]))),
    "shift": (at(np.array([1, -8, 5, -1, 0]), np.array([0, 1, 63, 62, 3])),
              at(_U8, np.array([0, 7, 1, 3], dtype=np.uint8))),
}  # fmt: skip


def _integer_record(name: str, ufunc: Any, kinds: str = "iu") -> None:
    _KINDS[name] = kinds
    kind = "logical" if "b" in kinds else "unary" if ufunc.nin == 1 else "binary"
    kind = "shift" if "shift" in name else kind
    register(
        Primitive(
            name,
            _integer_eval(name, ufunc, kinds),
            ufunc,
            None,
            batch=batch_stacked(name),
            special_points=_POINTS[kind],
        )  # fmt: skip
    )


for _name, _ufunc, _kinds in [
    ("bitwise_and", np.bitwise_and, "biu"), ("bitwise_or", np.bitwise_or, "biu"),
    ("bitwise_xor", np.bitwise_xor, "biu"), ("invert", np.invert, "iu"),
    ("left_shift", np.left_shift, "iu"), ("right_shift", np.right_shift, "iu"),
    ("bitwise_count", np.bitwise_count, "iu"), ("gcd", np.gcd, "iu"), ("lcm", np.lcm, "iu"),
]:  # fmt: skip
    _integer_record(_name, _ufunc, _kinds)


def _apply(name: str, *xs: Any) -> Any:
    xs = tuple(_operand(x) for x in xs)
    _check_kinds(name, _KINDS[name], [aval_of(x) for x in xs])
    return apply_elementwise(name, *xs)


def _booleans(*xs: Any) -> bool:
    return all(aval_of(x).dtype == np.bool_ for x in xs)


def _operand(x: Any) -> Any:
    return x if isinstance(x, Tracer) or isinstance(x, int | bool) else np.asarray(x)


def bitwise_and(x1: Any, x2: Any) -> Any:
    """Elementwise ``numpy.bitwise_and`` (also `x1 & x2`) of integers or booleans.

    >>> bitwise_and(np.array([12, 10]), 6)
    array([4, 2])
    """
    x1, x2 = _operand(x1), _operand(x2)
    return logical_and(x1, x2) if _booleans(x1, x2) else _apply("bitwise_and", x1, x2)


def bitwise_or(x1: Any, x2: Any) -> Any:
    """Elementwise ``numpy.bitwise_or`` (also `x1 | x2`) of integers or booleans.

    >>> bitwise_or(np.array([12, 10]), 6)
    array([14, 14])
    """
    x1, x2 = _operand(x1), _operand(x2)
    return logical_or(x1, x2) if _booleans(x1, x2) else _apply("bitwise_or", x1, x2)


def bitwise_xor(x1: Any, x2: Any) -> Any:
    """Elementwise ``numpy.bitwise_xor`` (also `x1 ^ x2`) of integers or booleans.

    >>> bitwise_xor(np.array([12, 10]), 6)
    array([10, 12])
    """
    x1, x2 = _operand(x1), _operand(x2)
    return logical_xor(x1, x2) if _booleans(x1, x2) else _apply("bitwise_xor", x1, x2)


def invert(x: Any) -> Any:
    """Elementwise ``numpy.invert`` (also `~x`): bitwise not of integers, logical not of
    booleans.

    >>> invert(np.array([0, 5])), invert(np.array([True, False]))
    (array([-1, -6]), array([False,  True]))
    """
    x = _operand(x)
    return logical_not(x) if _booleans(x) else _apply("invert", x)


bitwise_not = bitwise_invert = invert


def left_shift(x1: Any, x2: Any) -> Any:
    """Elementwise ``numpy.left_shift`` (also `x1 << x2`) of integers.

    >>> left_shift(np.array([1, 3]), 2)
    array([ 4, 12])
    """
    return _apply("left_shift", x1, x2)


def right_shift(x1: Any, x2: Any) -> Any:
    """Elementwise ``numpy.right_shift`` (also `x1 >> x2`) of integers.

    >>> right_shift(np.array([4, 13]), 2)
    array([1, 3])
    """
    return _apply("right_shift", x1, x2)


bitwise_left_shift, bitwise_right_shift = left_shift, right_shift


def bitwise_count(x: Any) -> Any:
    """The number of 1 bits in the absolute value of each integer (``numpy.bitwise_count``).

    >>> bitwise_count(np.array([0, 7, -8]))
    array([0, 3, 1], dtype=uint8)
    """
    return _apply("bitwise_count", x)


def gcd(x1: Any, x2: Any) -> Any:
    """The greatest common divisor of the absolute values of integers (``numpy.gcd``).

    >>> gcd(np.array([12, 20]), 8)
    array([4, 4])
    """
    return _apply("gcd", x1, x2)


def lcm(x1: Any, x2: Any) -> Any:
    """The least common multiple of the absolute values of integers (``numpy.lcm``).

    >>> lcm(np.array([4, 6]), 10)
    array([20, 30])
    """
    return _apply("lcm", x1, x2)
