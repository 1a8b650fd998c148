"""NumPy's own functions on traced values: `np.exp(x)`, `np.sum(x, axis=0)`,
`scipy.special.expit(x)` run the fastgrad.numpy function of the same name, through NumPy's
`__array_ufunc__` and `__array_function__` protocols. Where fastgrad has no such function,
or not with those arguments, the error says what to use instead, or that none exists yet.
fastgrad.ops installs `array_ufunc` and `array_function` as what a tracer calls.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fastgrad.core.tracing import TracerError
from fastgrad.ops.base import astype

# NumPy and SciPy names whose fastgrad.numpy function is named otherwise.
ALIASES = {"expit": "sigmoid", "log_expit": "log_sigmoid", "true_divide": "divide"}
# NumPy functions that only read the shape: answered from the tracer's type.
SHAPE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "shape": lambda a: a.shape,
    "ndim": lambda a: a.ndim,
    "size": lambda a, axis=None: a.size if axis is None else a.shape[axis],
}
# Reductions whose `dtype` is the type to compute in: the input is converted first.
_COMPUTE_DTYPE = frozenset({"sum", "prod", "mean", "var", "std"})
# The functions of other namespaces by the module NumPy or SciPy gives for them
# ("numpy.linalg", "scipy.special"): fastgrad.numpy.linalg and fastgrad.scipy.special
# register theirs when they are imported.
NAMESPACES: dict[str, dict[str, Any]] = {}


def register_namespace(module: str, functions: Mapping[str, Any]) -> None:
    """Make `module.name(tracer, ...)` call `functions[name]`."""
    NAMESPACES.setdefault(module, {}).update(functions)


def missing_name(name: str, names: Any, known: bool = False) -> str:
    """That fastgrad.numpy has no `name`, and the closest names it has. `known`: the name
    is a real function elsewhere (in NumPy or SciPy), so fastgrad has none *yet*."""
    close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.7)
    text = f"fastgrad.numpy has no {name}" + (" yet" if known or hasattr(np, name) else "")
    if close:
        text += "; the closest names it has: " + ", ".join(f"fnp.{c}" for c in close)
    return text


def _ufunc_home(ufunc: Any) -> str:
    """Where a ufunc is found: numpy, or scipy.special (ufuncs carry no module name)."""
    name = ufunc.__name__
    if getattr(np, name, None) is ufunc:
        return f"numpy.{name}"
    special = sys.modules.get("scipy.special")
    if special is not None and getattr(special, name, None) is ufunc:
        return f"scipy.special.{name}"
    return name


def _unsupported(qualified: str, reason: str) -> TracerError:
    return TracerError(f"{qualified} on a traced value: {reason}")


def _pop_out(qualified: str, kwargs: dict[str, Any]) -> None:
    out = kwargs.pop("out", None)
    if out is not None and not (isinstance(out, tuple) and all(o is None for o in out)):
        raise _unsupported(
            qualified,
            "out= cannot be used, traced arrays are never written into; use the returned "
            "value (and x.at[idx].set(v) for an update of part of an array)",
        )


def array_ufunc(
    functions: Mapping[str, Any], ufunc: Any, method: str, inputs: Any, kwargs: dict[str, Any]
) -> Any:
    """`ufunc(*inputs, **kwargs)` with a traced input: the fastgrad.numpy function."""
    qualified = _ufunc_home(ufunc)
    name = ALIASES.get(ufunc.__name__, ufunc.__name__)
    if method != "__call__":
        raise _unsupported(
            f"{qualified}.{method}",
            "only calls are supported; for reductions use fnp.sum, fnp.prod, fnp.max or fnp.min",
        )
    home = qualified.rsplit(".", 1)[0]
    fn = NAMESPACES.get(home, {}).get(ufunc.__name__) or functions.get(name)
    if fn is None:
        raise _unsupported(qualified, missing_name(name, functions, known=True))
    kwargs = dict(kwargs)
    _pop_out(qualified, kwargs)
    dtype = kwargs.pop("dtype", None)
    if kwargs:
        raise _unsupported(
            qualified,
            f"the keyword(s) {', '.join(sorted(kwargs))} are not supported; call "
            f"fnp.{name}{_signature(fn)}",
        )
    result = fn(*inputs)
    return result if dtype is None else astype(result, dtype)


def array_function(
    functions: Mapping[str, Any], func: Any, args: Any, kwargs: dict[str, Any]
) -> Any:
    """NumPy function `func(*args, **kwargs)` with a traced argument: the fastgrad.numpy
    function of the same name, if it takes these arguments."""
    name = func.__name__
    module = getattr(func, "__module__", None) or "numpy"
    qualified = f"{module}.{name}"
    if module == "numpy" and name in SHAPE_FUNCTIONS:
        return SHAPE_FUNCTIONS[name](*args, **kwargs)
    name = ALIASES.get(name, name)
    fn = functions.get(name) if module == "numpy" else NAMESPACES.get(module, {}).get(name)
    if fn is None:
        reason = missing_name(name, functions, known=True)
        if module != "numpy":
            reason = f"fastgrad has no {qualified} yet"
        raise _unsupported(qualified, reason)
    kwargs = dict(kwargs)
    _pop_out(qualified, kwargs)
    params = _parameters(fn)
    dtype = None
    if "dtype" not in params and name in _COMPUTE_DTYPE:
        dtype = kwargs.pop("dtype", None)
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        given = ", ".join(["..."] * len(args) + [f"{k}=..." for k in kwargs])
        raise _unsupported(
            f"{qualified}({given})",
            f"fastgrad.numpy's version takes fnp.{name}{_signature(fn)}",
        ) from None
    if dtype is not None:
        args = (astype(args[0], dtype), *args[1:])
    return fn(*args, **kwargs)


@functools.cache
def _parameters(fn: Any) -> frozenset[str]:
    return frozenset(inspect.signature(fn).parameters)


def _signature(fn: Any) -> str:
    """`fn`'s parameters as written in a call, without annotations: `(x, axis=None)`."""
    sig = inspect.signature(fn)
    bare = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=bare, return_annotation=sig.empty))
