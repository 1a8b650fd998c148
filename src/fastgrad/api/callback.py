"""The escape hatch: `primitive` makes a fastgrad op of a NumPy/SciPy function with the
derivative rules its user writes, and `pure_callback` calls a host function from traced
code, with no derivative. Inside jit both are a call back into Python (a library call of
the plan, with fusion or without); see fastgrad.transforms.python_call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastgrad.api.trace import name_of
from fastgrad.core.ir import SUPPORTED_DTYPES, Aval
from fastgrad.core.pytree import flatten, unflatten
from fastgrad.core.tracing import Tracer, aval_of, bind
from fastgrad.transforms.python_call import PYTHON_CALL, PYTHON_CALL_MULTI, PythonCall


@dataclass(frozen=True)
class ShapeDtypeStruct:
    """The shape and dtype of an array, as a result type for `pure_callback` and
    `primitive` (any object with `.shape` and `.dtype`, such as an array, also works).

    >>> ShapeDtypeStruct((2, 3), np.float32)
    ShapeDtypeStruct(shape=(2, 3), dtype=dtype('float32'))
    """

    shape: tuple[int, ...]
    dtype: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))


def _result_avals(spec: Any, name: str) -> tuple[Any, tuple[Aval, ...]]:
    leaves, tree = flatten(spec)
    avals = []
    for k, leaf in enumerate(leaves):
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise TypeError(
                f"{name}: result leaf {k} is a {type(leaf).__name__}; result types are objects "
                "with .shape and .dtype (fg.ShapeDtypeStruct(shape, dtype) or an array)"
            )
        dtype = np.dtype(leaf.dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name}: result leaf {k} has unsupported dtype {dtype}")
        avals.append(Aval(tuple(leaf.shape), dtype))
    return tree, tuple(avals)


def _call(
    fun: Callable[..., Any],
    name: str,
    spec: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    vjp: Callable[..., Any] | None,
    jvp: Callable[..., Any] | None,
) -> Any:
    """Bind one python_call node per result leaf of fun(*args, **kwargs)."""
    leaves, in_tree = flatten(args)
    leaves = [x if isinstance(x, Tracer) else np.asarray(x) for x in leaves]
    in_avals = tuple(aval_of(x) for x in leaves)
    out_tree, out_avals = spec(in_tree, in_avals) if callable(spec) else spec
    call = PythonCall(name, fun, kwargs, in_tree, in_avals, out_tree, out_avals, vjp, jvp)
    op = PYTHON_CALL if len(out_avals) == 1 else PYTHON_CALL_MULTI
    outs = [bind(op, *leaves, call=call, index=k) for k in range(len(out_avals))]
    return unflatten(out_tree, outs)


class primitive:  # noqa: N801  a decorator, named like fg.custom_vjp
    """Make a fastgrad op of a function on NumPy arrays (SciPy, a C extension, anything).

    `f = fg.primitive(fun)`, then `f.defvjp(vjp)` and optionally `f.defjvp(jvp)`:

    - `vjp(g, out, *args, **kwargs)` gets the cotangent `g` and result `out` (pytrees like
      fun's result) and fun's arguments, and returns a tuple with one cotangent per
      positional argument (None for none). Write it with `fastgrad.numpy` (or other
      primitives): it is differentiated again for grad of grad, and transposed for forward
      mode when there is no JVP rule.
    - `jvp(tangents, out, *args, **kwargs)` (optional) gets a tuple with one tangent per
      positional argument (zeros where there is none) and returns the result's tangent.

    On plain arrays `f` simply calls `fun`. On traced values (under jit, grad, jvp) `fun`
    runs as a call back into Python with NumPy arrays, so it must be pure and must not
    modify its arguments. Keyword arguments are passed through as static values. The
    result's shapes and dtypes come from `result_shape_dtypes` (a pytree of
    `fg.ShapeDtypeStruct`, or a function of the arguments' ShapeDtypeStructs returning
    one); by default from calling `fun` once on zeros of the arguments' types.

    >>> import fastgrad as fg, fastgrad.numpy as fnp, scipy.special
    >>> erf = fg.primitive(scipy.special.erf)
    >>> erf.defvjp(lambda g, out, x: (g * 2 / np.sqrt(np.pi) * fnp.exp(-x * x),))
    >>> round(float(fg.grad(erf)(0.0)), 6)
    1.128379
    """

    def __init__(
        self,
        fun: Callable[..., Any],
        result_shape_dtypes: Any = None,
        name: str | None = None,
    ):
        if not callable(fun):
            raise TypeError(f"primitive expects a function, got {type(fun).__name__}")
        functools.update_wrapper(self, fun, updated=())
        self.fun = fun
        self.name = name or name_of(fun)
        self.result_shape_dtypes = result_shape_dtypes
        self.vjp: Callable[..., Any] | None = None
        self.jvp: Callable[..., Any] | None = None
        self._calls: dict[Any, Any] = {}

    def defvjp(self, vjp: Callable[..., Any]) -> None:
        """Set the reverse-mode rule `vjp(g, out, *args, **kwargs) -> cotangents`."""
        if not callable(vjp):
            raise TypeError(f"defvjp expects a function, got {type(vjp).__name__}")
        self.vjp = vjp

    def defjvp(self, jvp: Callable[..., Any]) -> None:
        """Set the forward-mode rule `jvp(tangents, out, *args, **kwargs) -> tangent`."""
        if not callable(jvp):
            raise TypeError(f"defjvp expects a function, got {type(jvp).__name__}")
        self.jvp = jvp

    def __repr__(self) -> str:
        return f"primitive({self.name})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not any(isinstance(x, Tracer) for x in flatten(args)[0]):
            return self.fun(*args, **kwargs)
        return _call(self.fun, self.name, self._types(kwargs), args, kwargs, self.vjp, self.jvp)

    def _types(self, kwargs: dict[str, Any]) -> Callable[..., Any]:
        def types(in_tree: Any, in_avals: tuple[Aval, ...]) -> tuple[Any, tuple[Aval, ...]]:
            structs = [ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals]
            spec = self.result_shape_dtypes
            if spec is None:
                spec = self._inferred(in_tree, in_avals, kwargs)
            elif callable(spec):
                spec = spec(*unflatten(in_tree, structs), **kwargs)
            return _result_avals(spec, self.name)

        return types

    def _inferred(self, in_tree: Any, in_avals: tuple[Aval, ...], kwargs: dict[str, Any]) -> Any:
        # The result types from one call on zeros, remembered per argument signature.
        try:
            key: Any = (in_tree, in_avals, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self._calls:
            return self._calls[key]
        zeros = [np.zeros(a.shape, a.dtype) for a in in_avals]
        try:
            with np.errstate(all="ignore"):
                result = self.fun(*unflatten(in_tree, zeros), **kwargs)
        except Exception as e:
            raise TypeError(
                f"primitive {self.name}: could not find its result types by calling it on "
                f"zeros ({type(e).__name__}: {e}); pass result_shape_dtypes"
            ) from e
        leaves, tree = flatten(result)
        spec = unflatten(tree, [ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype) for x in leaves])
        if key is not None:
            self._calls[key] = spec
        return spec


def pure_callback(
    callback: Callable[..., Any], result_shape_dtypes: Any, *args: Any, **kwargs: Any
) -> Any:
    """Call `callback(*args, **kwargs)` on NumPy arrays, from traced code too (JAX's
    signature). It must be pure (the same result for the same arguments: calls may be
    merged or dropped) and return results of the types in `result_shape_dtypes` (a pytree
    of `fg.ShapeDtypeStruct` or arrays). It has no derivative: differentiating through it
    raises; use `fg.primitive` to give it one.

    >>> import fastgrad as fg
    >>> f = fg.jit(lambda x: fg.pure_callback(np.sort, fg.ShapeDtypeStruct((3,), x.dtype), x))
    >>> f(np.array([3.0, 1.0, 2.0]))
    array([1., 2., 3.])
    """
    name = f"pure_callback({name_of(callback)})"
    spec = _result_avals(result_shape_dtypes, name)
    if not any(isinstance(x, Tracer) for x in flatten(args)[0]):
        leaves, in_tree = flatten(args)
        arrays = [np.asarray(x) for x in leaves]
        call = PythonCall(name, callback, kwargs, in_tree, tuple(aval_of(x) for x in arrays), *spec)
        return unflatten(spec[0], call.run(arrays))
    return _call(callback, name, spec, args, kwargs, None, None)
