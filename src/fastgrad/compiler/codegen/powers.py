"""Constant exponents, strength-reduced: `x ** 4` becomes multiplies, `x ** -1` a
reciprocal, `x ** 1.5` a multiply and a square root, where a scalar `pow` call would cost
~20x more and does not vectorize. The exponent is known when it is computed from the
graph's scalar constants inside the loop (`4.0`, or `4.0 - 1.0` in a derivative rule).
"""

from __future__ import annotations

import math

import numpy as np

from fastgrad.compiler.fusion import Loop

# Beyond this, repeated squaring loses more than a few units in the last place.
MAX_EXPONENT = 16


def known_values(loop: Loop, constants: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """id(var) -> value of each loop value that depends on scalar constants only: the
    constants, their broadcasts, and elementwise ops of those (evaluated here with the
    ops' NumPy references, which the fused expressions agree with)."""
    known = {id(v): constants[id(v)].reshape(()) for v in loop.inputs
             if id(v) in constants and constants[id(v)].size == 1}  # fmt: skip
    for n in loop.nodes:
        if not n.inputs or any(id(v) not in known for v in n.inputs):
            continue
        values = [known[id(v)] for v in n.inputs]
        if n.op.name in ("broadcast_to", "reshape"):
            known[id(n.out)] = values[0]
        elif n.op.kind == "elementwise" and not n.op.extra.get("positional"):
            with np.errstate(all="ignore"):
                value = n.op.impl(*values, **n.params)
            known[id(n.out)] = np.asarray(value, n.out.aval.dtype).reshape(())
    return known


def reducible(exponent: float) -> bool:
    """Whether `x ** exponent` has a strength-reduced form: integers and half-integers up
    to MAX_EXPONENT in magnitude."""
    return (
        math.isfinite(exponent)
        and float(2 * exponent).is_integer()
        and (abs(exponent) <= MAX_EXPONENT)
    )


def power_expression(base: str, exponent: float, t: str) -> str:
    """Source computing `base ** exponent` (reducible) in float type `t` ("f32", "f64"),
    with NumPy's values at zeros, infinities and nan: pow's (x**0 is 1, nan**0 too;
    (-0)**-1 is -inf; (-inf)**1.5 is inf, (-0)**1.5 is +0), except that x**0.5 is
    sqrt(x), as NumPy computes it for a scalar or broadcast exponent ((-inf)**0.5 is nan,
    (-0)**0.5 is -0)."""
    if exponent == 0:
        return f"{t}(1)"
    if exponent == 0.5:
        return f"np.sqrt({base})"
    if t == "f32" and roundings(exponent) > 2:
        # Each operation rounds: float32 x ** -7 was 8.6 units in the last place off, x ** 7
        # 3.9 (pow: < 1). In float64 the chain's error stays far below float32's last
        # place and one rounding back leaves pow's accuracy (and the intermediate powers
        # cannot overflow or go subnormal), but at half the vector width: sum(x**4 + x**7)
        # and its gradient in float64 took 2.4x the time. x**3, x**4, x**-2, x**1.5 (two
        # roundings, within ~1.5 units) stay in float32.
        return f"f32({power_expression(f'f64({base})', exponent, 'f64')})"
    whole = math.floor(abs(exponent))
    if abs(exponent) == whole:
        # Take the reciprocal first: 1 / x**n would overflow where the result is still
        # a (subnormal) number.
        return _chain(base if exponent > 0 else f"({t}(1) / {base})", whole)
    # A half-integer: pow gives +inf at -inf (any non-integer exponent) and +0 at -0,
    # where the square root gives nan and -0.
    safe = f"({t}(np.inf) if {base} == {t}(-np.inf) else {base} + {t}(0))"
    if exponent > 0:
        root = f"np.sqrt({safe})"
        return root if whole == 0 else f"({_chain(safe, whole)} * {root})"
    # Root first for the reciprocal: 1 / x overflows for a subnormal x, 1 / sqrt(x) does not.
    root = f"({t}(1) / np.sqrt({safe}))"
    return root if whole == 0 else f"({_chain(f'({t}(1) / {safe})', whole)} * {root})"


def roundings(exponent: float) -> int:
    """How many rounded operations the reduced form of `x ** exponent` takes."""
    whole = math.floor(abs(exponent))
    squarings = max(whole.bit_length() - 1, 0)
    multiplies = squarings + max(bin(whole).count("1") - 1, 0)
    if abs(exponent) != whole:  # a square root, times the whole part's power
        multiplies += 1 + (whole > 0)
    return multiplies + (exponent < 0)


def _chain(x: str, n: int) -> str:
    """`x ** n` for an integer n >= 1 by repeated squaring (the compiler computes each
    repeated subexpression once)."""
    if n == 1:
        return x
    half = _chain(x, n // 2)
    square = f"({half} * {half})"
    return f"({square} * {x})" if n % 2 else square
