"""Derivative checks: VJPs and JVPs against central finite differences, and each other.

`check_grads` compares J v (forward mode) or <u, J v> (reverse mode) computed two ways
along random directions u, v, in float64: a cheap test that any wrong entry of the Jacobian
fails with high probability. `directional_derivative` computes a derivative of any order
by any sequence of modes (forward over reverse over ...), to compare them with each other
and with an oracle. Hypothesis strategies for shapes, arrays and random programs live in
`fastgrad.testing.strategies`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.api import jvp, vjp
from fastgrad.core.pytree import flatten, unflatten
from fastgrad.core.tracing import Tracer
from fastgrad.ops.base import sum as _sum
from fastgrad.ops.elementwise import add, multiply
from fastgrad.ops.shape import ones_like

__all__ = ["check_grads", "check_jvp", "check_vjp", "directional_derivative"]


def __dir__() -> list[str]:
    return list(__all__)  # fastgrad.testing.strategies is imported on its own (hypothesis)


MODES = ("fwd", "rev")


def _is_float(x: Any) -> bool:
    return np.asarray(x).dtype.kind == "f"


def _split(
    args: Sequence[Any],
) -> tuple[list[np.ndarray], Callable[[Sequence[Any]], tuple[Any, ...]]]:
    """The float leaves of `args` in float64, and a function putting leaves back in place."""
    leaves, tree = flatten(tuple(args))
    where = [i for i, x in enumerate(leaves) if _is_float(x)]
    floats = [np.asarray(leaves[i], dtype=np.float64) for i in where]

    def rebuild(new: Sequence[Any]) -> tuple[Any, ...]:
        full = list(leaves)
        for i, x in zip(where, new, strict=True):
            full[i] = x
        return unflatten(tree, full)

    return floats, rebuild


def _inner(a: Sequence[Any], b: Sequence[Any]) -> float:
    return float(
        sum(
            np.sum(np.asarray(x, np.float64) * np.asarray(y, np.float64))
            for x, y in zip(a, b, strict=True)
        )
    )


def check_vjp(
    fun: Callable[..., Any],
    args: Sequence[Any],
    eps: float = 1e-6,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    rng: np.random.Generator | None = None,
) -> None:
    """Check `fun`'s VJP at `args` along one random pair of directions; raise on mismatch.

    >>> check_vjp(lambda x: fnp.sin(x) * x, (np.linspace(0.0, 1.0, 3),))  # passes: None
    >>> @fg.custom_vjp
    ... def bad_sin(x):
    ...     return fnp.sin(x)
    >>> bad_sin.defvjp(lambda x: (fnp.sin(x), x), lambda x, g: (g * fnp.sin(x),))  # not cos
    >>> check_vjp(bad_sin, (np.array([0.5, 1.0]),))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    AssertionError: VJP does not match finite differences along a random direction:
    ...
    """
    rng = rng or np.random.default_rng(0)
    xs, rebuild = _split(args)
    if not xs:
        raise ValueError("check_grads needs at least one float argument")

    def flat_fun(*floats: Any) -> Any:
        return fun(*rebuild(floats))

    out, vjp_fn = vjp(flat_fun, *xs)
    out_leaves, out_tree = flatten(out)
    u = [
        rng.standard_normal(np.shape(o)) if _is_float(o) else np.zeros(np.shape(o))
        for o in out_leaves
    ]
    v = [rng.standard_normal(x.shape) for x in xs]
    cts = unflatten(
        out_tree, [np.asarray(c, np.asarray(o).dtype) for c, o in zip(u, out_leaves, strict=True)]
    )
    grads = vjp_fn(cts)
    for x, g in zip(xs, grads, strict=True):
        if np.shape(g) != x.shape:
            raise AssertionError(f"a gradient has shape {np.shape(g)}, its argument {x.shape}")
    reverse = _inner(grads, v)

    def at(t: float) -> list[Any]:
        moved = [x + t * d for x, d in zip(xs, v, strict=True)]
        return flatten(flat_fun(*moved))[0]

    plus, minus = at(eps), at(-eps)
    diffs = [
        (np.asarray(p, np.float64) - np.asarray(m, np.float64)) / (2 * eps)
        for p, m in zip(plus, minus, strict=True)
    ]
    numeric = _inner(u, diffs)
    if not (np.isfinite(reverse) and np.isfinite(numeric)) or abs(
        reverse - numeric
    ) > atol + rtol * max(abs(reverse), abs(numeric)):
        raise AssertionError(
            "VJP does not match finite differences along a random direction:\n"
            f"  <vjp(u), v>       = {reverse!r}\n"
            f"  <u, (f(x+ev) - f(x-ev)) / 2e> = {numeric!r}\n"
            f"  difference {abs(reverse - numeric):.3g} > atol {atol:g} + rtol {rtol:g} * scale "
            f"(eps={eps:g})"
        )


def _directional_difference(
    flat_fun: Callable[..., Any], xs: list[np.ndarray], v: list[np.ndarray], eps: float
) -> list[np.ndarray]:
    """(f(x + eps v) - f(x - eps v)) / 2 eps, per output leaf, in float64."""

    def at(t: float) -> list[Any]:
        return flatten(flat_fun(*[x + t * d for x, d in zip(xs, v, strict=True)]))[0]

    return [
        (np.asarray(p, np.float64) - np.asarray(m, np.float64)) / (2 * eps)
        for p, m in zip(at(eps), at(-eps), strict=True)
    ]


def check_jvp(
    fun: Callable[..., Any],
    args: Sequence[Any],
    eps: float = 1e-6,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    rng: np.random.Generator | None = None,
) -> None:
    """Check `fun`'s JVP at `args` along one random direction, output by output and element
    by element; raise on mismatch.

    >>> check_jvp(lambda x: fnp.sin(x) * x, (np.linspace(0.0, 1.0, 3),))  # passes: None
    >>> @fg.custom_vjp
    ... def bad_sin(x):
    ...     return fnp.sin(x)
    >>> bad_sin.defvjp(lambda x: (fnp.sin(x), x), lambda x, g: (g * fnp.sin(x),))  # not cos
    >>> check_jvp(bad_sin, (np.array([0.5, 1.0]),))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    AssertionError: JVP does not match finite differences along a random direction v:
    ...
    """
    rng = rng or np.random.default_rng(0)
    xs, rebuild = _split(args)
    if not xs:
        raise ValueError("check_grads needs at least one float argument")

    def flat_fun(*floats: Any) -> Any:
        return fun(*rebuild(floats))

    v = [rng.standard_normal(x.shape) for x in xs]
    out, tangent = jvp(flat_fun, tuple(xs), tuple(v))
    out_leaves = flatten(out)[0]
    tangent_leaves = flatten(tangent)[0]
    numeric = _directional_difference(flat_fun, xs, v, eps)
    for k, (o, t, n) in enumerate(zip(out_leaves, tangent_leaves, numeric, strict=True)):
        if np.shape(t) != np.shape(o) or np.asarray(t).dtype != np.asarray(o).dtype:
            raise AssertionError(
                f"the tangent of output leaf {k} is {np.asarray(t).dtype}{list(np.shape(t))}, "
                f"the output {np.asarray(o).dtype}{list(np.shape(o))}"
            )
        if not _is_float(o):
            continue
        t = np.asarray(t, np.float64)
        bad = ~(np.abs(t - n) <= atol + rtol * np.maximum(np.abs(t), np.abs(n)))
        if np.any(bad):
            i = np.unravel_index(np.argmax(bad), np.shape(bad)) if np.ndim(bad) else ()
            raise AssertionError(
                "JVP does not match finite differences along a random direction v:\n"
                f"  output leaf {k}, element {tuple(int(j) for j in i)}:\n"
                f"  jvp(v)                    = {t[i]!r}\n"
                f"  (f(x+ev) - f(x-ev)) / 2e  = {n[i]!r}\n"
                f"  {int(np.sum(bad))} of {np.size(bad)} element(s) differ by more than atol "
                f"{atol:g} + rtol {rtol:g} * scale (eps={eps:g})"
            )


def check_jvp_vjp(
    fun: Callable[..., Any],
    args: Sequence[Any],
    atol: float = 1e-6,
    rtol: float = 1e-5,
    rng: np.random.Generator | None = None,
) -> None:
    """Check that forward and reverse mode agree: <u, jvp(v)> == <vjp(u), v>."""
    rng = rng or np.random.default_rng(0)
    xs, rebuild = _split(args)

    def flat_fun(*floats: Any) -> Any:
        return fun(*rebuild(floats))

    v = [rng.standard_normal(x.shape) for x in xs]
    out, vjp_fn = vjp(flat_fun, *xs)
    out_leaves, out_tree = flatten(out)
    u = [
        rng.standard_normal(np.shape(o)) if _is_float(o) else np.zeros(np.shape(o))
        for o in out_leaves
    ]
    cts = unflatten(
        out_tree, [np.asarray(c, np.asarray(o).dtype) for c, o in zip(u, out_leaves, strict=True)]
    )
    reverse = _inner(vjp_fn(cts), v)
    forward = _inner(u, flatten(jvp(flat_fun, tuple(xs), tuple(v))[1])[0])
    if not abs(reverse - forward) <= atol + rtol * max(abs(reverse), abs(forward)):
        raise AssertionError(
            "forward and reverse mode disagree along random directions u, v:\n"
            f"  <u, jvp(v)> = {forward!r}\n"
            f"  <vjp(u), v> = {reverse!r}"
        )


def check_grads(
    fun: Callable[..., Any],
    args: Sequence[Any],
    order: int = 1,
    modes: Sequence[str] = ("rev",),
    eps: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int = 0,
) -> None:
    """Check derivatives of `fun` at `args` up to `order` against finite differences.

    `modes` names what is checked: "rev" the VJP (<u, J v>), "fwd" the JVP (J v, element by
    element); with both, also that the two agree. Float arguments are checked in float64
    (converted); integer and boolean arguments are passed through unchanged. Order 2 checks
    the derivatives of the VJP (for "rev") and of the JVP (for "fwd") in every mode, and so
    on. Raises AssertionError showing both sides when they disagree.

    >>> import fastgrad.numpy as fnp
    >>> check_grads(lambda x: fnp.sum(fnp.sin(x) ** 2), (np.linspace(0, 1, 5),), order=2)
    >>> check_grads(lambda x: fnp.tanh(x) * x, (np.linspace(0, 1, 5),), modes=("fwd", "rev"))
    """
    modes = tuple(modes) if not isinstance(modes, str) else (modes,)
    for mode in modes:
        if mode not in MODES:
            raise ValueError(
                f"modes: {mode!r} is not a mode; use 'fwd' (forward mode, JVPs) and/or 'rev' "
                "(reverse mode, VJPs)"
            )
    if not modes:
        raise ValueError("modes must name at least one of 'fwd' and 'rev'")
    if order < 1:
        raise ValueError(f"order must be at least 1, got {order}")
    rng = np.random.default_rng(seed)
    eps = 1e-6 if eps is None else eps
    atol = 1e-6 if atol is None else atol
    rtol = 1e-5 if rtol is None else rtol
    if "rev" in modes:
        check_vjp(fun, args, eps, atol, rtol, rng)
    if "fwd" in modes:
        if "rev" in modes:  # first, so that a disagreement is reported as one
            check_jvp_vjp(fun, args, atol, rtol, rng)
        check_jvp(fun, args, eps, atol, rtol, rng)
    if order > 1 and "rev" in modes:
        xs, rebuild = _split(args)
        out = fun(*rebuild(xs))
        out_leaves, out_tree = flatten(out)
        u = unflatten(
            out_tree,
            [rng.standard_normal(np.shape(o)).astype(np.asarray(o).dtype) for o in out_leaves],
        )

        def vjp_at(*floats: Any) -> Any:
            return vjp(lambda *f: fun(*rebuild(f)), *floats)[1](u)

        check_grads(vjp_at, xs, order - 1, modes, eps, atol, rtol, seed + 1)
    if order > 1 and "fwd" in modes:
        xs, rebuild = _split(args)
        v = tuple(rng.standard_normal(x.shape) for x in xs)

        def jvp_at(*floats: Any) -> Any:
            return jvp(lambda *f: fun(*rebuild(f)), floats, v)[1]

        check_grads(jvp_at, xs, order - 1, modes, eps, atol, rtol, seed + 2)


def directional_derivative(
    fun: Callable[..., Any],
    args: Sequence[Any],
    directions: Sequence[Sequence[Any]],
    modes: Sequence[str],
    cotangent: Any = None,
) -> Any:
    """The k-th derivative of `fun` at `args` along `directions` (k of them, each with one
    array per argument), taken by the k transforms in `modes` ("fwd" or "rev"), innermost
    first: ("rev", "fwd") is forward over reverse.

    With `cotangent` None, `fun` must be elementwise (each output element depends on the
    same element of every argument, all of one shape): the result is the derivative of each
    element, an array (reverse mode pulls back ones). Otherwise the result is the scalar
    <cotangent, D^k fun(args)[directions]>. Every mode sequence gives the same number.

    >>> import fastgrad.numpy as fnp
    >>> x, one = np.array([0.5, 2.0]), np.ones(2)
    >>> directional_derivative(fnp.exp, (x,), [(one,), (one,)], ("rev", "fwd"))
    array([1.64872127, 7.3890561 ])
    """
    modes = tuple(modes)
    if len(directions) != len(modes) or any(m not in MODES for m in modes):
        raise ValueError(f"need one direction per mode, modes among {MODES}; got {modes}")
    elementwise = cotangent is None
    # `contracted[j]`: whether the function after j transforms returns the scalar
    # <cotangent, ...> (from the first reverse step on) instead of an array.
    contracted = [False]
    for m in modes:
        contracted.append(contracted[-1] or (m == "rev" and not elementwise))

    def level(j: int) -> Callable[..., Any]:
        if j == 0:
            return fun
        inner, d, mode = level(j - 1), tuple(directions[j - 1]), modes[j - 1]
        if mode == "fwd":
            return lambda *xs: jvp(inner, tuple(xs), d)[1]

        def pulled_back(*xs: Any) -> Any:
            out, pull = vjp(inner, *xs)
            ct = cotangent if (not elementwise and not contracted[j - 1]) else _ones(out)
            grads = pull(ct)
            terms = [multiply(g, v) for g, v in zip(grads, d, strict=True)]
            if not elementwise:
                terms = [_sum(t) for t in terms]
            total = terms[0]
            for t in terms[1:]:
                total = add(total, t)
            return total

        return pulled_back

    result = level(len(modes))(*args)
    if not elementwise and not contracted[-1]:
        result = _sum(multiply(result, cotangent))
    return result


def _ones(x: Any) -> Any:
    return ones_like(x) if isinstance(x, Tracer) else np.ones_like(np.asarray(x))
