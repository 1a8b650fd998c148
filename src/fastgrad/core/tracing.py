"""Tracing: record calls on `Tracer` values as nodes of a graph.

`bind(op, *args)` is the single entry point for applying a primitive. Inside a `Trace`,
when any argument is a tracer, it appends a node and returns a new tracer; otherwise it
runs the op's NumPy reference at once. Traces nest (grad inside jit inside grad): a
tracer of an enclosing trace that reaches an inner one is captured as an extra input.
A tracer's operators and methods (core.array_methods) call the array functions that
fastgrad.ops installs with `install_array_functions` (ops builds on core: not imported).
Each thread has its own stack of open traces: threads trace at the same time unmixed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastgrad.core.array_methods import ArrayMethods, _fn
from fastgrad.core.ir import SUPPORTED_DTYPES, Aval, Graph, Node, Var, live_nodes
from fastgrad.core.primitive import Primitive, register


class _TraceStacks(threading.local):
    """The traces open in the running thread, innermost last: a trace opened in one thread
    never sees the tracers another thread is recording."""

    def __init__(self) -> None:
        self.stack: list[Trace] = []


_open = _TraceStacks()


class TracerError(TypeError):
    """A traced value was used where a concrete one is needed.

    >>> def sign(x):
    ...     return 1.0 if x > 0 else -1.0
    >>> fg.jit(sign)(2.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    fastgrad.core.tracing.TracerError: bool() (an `if`, ...) needs a concrete value, ...
    >>> fg.jit(sign, static_argnums=0)(2.0)  # x static: one compile per value of x
    array(1.)
    """


def describe(tracer: Tracer) -> str:
    """How errors name a traced value: its name where it has one, and its type."""
    hint = f"`{tracer.hint}` " if tracer.hint else ""
    return f"the traced value {hint}({tracer.aval})"


def static_error(what: str, tracer: Tracer, expected: str) -> TracerError:
    """The error for a traced value where a value known while tracing is needed (an axis,
    a shape): say that it must be static, and how."""
    return TracerError(
        f"{what} must be static ({expected}), but it is {describe(tracer)}. Values that "
        "decide shapes must be known when the function is traced: pass it as a static "
        "argument, fg.jit(f, static_argnums=...) or static_argnames=..."
    )


class Tracer(ArrayMethods):
    """A stand-in for an array while a function is traced; operations on it build the graph."""

    # The graph variable is `_var`: `var` is NumPy's variance method, as on arrays.
    __slots__ = ("trace", "_var")
    __array_priority__ = 1000

    def __init__(self, trace: Trace, var: Var):
        self.trace = trace
        self._var = var

    # ---- array attributes
    @property
    def hint(self) -> str | None:
        """The name of the traced value (an argument's path), if it has one."""
        return self._var.hint

    @property
    def aval(self) -> Aval:
        return self._var.aval

    @property
    def shape(self) -> tuple[int, ...]:
        return self._var.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return self._var.aval.dtype

    @property
    def ndim(self) -> int:
        return self._var.aval.ndim

    @property
    def size(self) -> int:
        return self._var.aval.size

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d traced array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Tracer<{self.aval}>"

    # ---- conversions that need a concrete value
    def _concrete_error(self, what: str) -> TracerError:
        return TracerError(
            f"{what} needs a concrete value, but {describe(self)} is traced. Python control "
            "flow cannot depend on traced values: mark the argument static with "
            "fg.jit(..., static_argnums=...) / static_argnames=..., or compute both branches "
            "and choose with fnp.where(cond, a, b)."
        )

    def __bool__(self) -> bool:
        raise self._concrete_error("bool() (an `if`, `while`, `and`/`or` or `not`)")

    def __float__(self) -> float:
        raise self._concrete_error("float()")

    def __int__(self) -> int:
        raise self._concrete_error("int()")

    def __index__(self) -> int:
        raise self._concrete_error("using it as a Python index")

    def __complex__(self) -> complex:
        raise self._concrete_error("complex()")

    def item(self) -> Any:
        raise self._concrete_error(".item()")

    def tolist(self) -> Any:
        raise self._concrete_error(".tolist()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TracerError(
            f"NumPy cannot convert {describe(self)} to an array. Inside a traced function "
            "use fastgrad.numpy (import fastgrad.numpy as fnp) instead of numpy functions."
        )

    def __iter__(self) -> Any:
        if not self.shape:
            raise TypeError("iteration over a 0-d traced array")
        return (self[i] for i in range(self.shape[0]))

    def __hash__(self) -> int:
        return id(self)

    # ---- NumPy interop: NumPy's functions called on tracers run fastgrad.numpy's
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _fn.array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _fn.array_function(func, args, kwargs)

    # ---- updates: traced arrays are immutable, `x.at[idx].set(v)` gives an updated copy
    def __setitem__(self, index: Any, value: Any) -> None:
        raise TracerError(
            f"{describe(self)} cannot be assigned to: traced arrays are immutable. Use "
            "x = x.at[idx].set(v) for x[idx] = v (and .add(v) for x[idx] += v; also "
            ".multiply, .min, .max), which gives the updated array."
        )

    @property
    def at(self) -> Any:
        """Functional index updates, as in JAX: `x.at[idx].set(v)`, `.add(v)`, ..."""
        return _fn.at(self)

    # ---- operators
    def __add__(self, other: Any) -> Any:
        return _fn.add(self, other)

    def __radd__(self, other: Any) -> Any:
        return _fn.add(other, self)

    def __sub__(self, other: Any) -> Any:
        return _fn.subtract(self, other)

    def __rsub__(self, other: Any) -> Any:
        return _fn.subtract(other, self)

    def __mul__(self, other: Any) -> Any:
        return _fn.multiply(self, other)

    def __rmul__(self, other: Any) -> Any:
        return _fn.multiply(other, self)

    def __truediv__(self, other: Any) -> Any:
        return _fn.divide(self, other)

    def __rtruediv__(self, other: Any) -> Any:
        return _fn.divide(other, self)

    def __mod__(self, other: Any) -> Any:
        return _fn.remainder(self, other)

    def __rmod__(self, other: Any) -> Any:
        return _fn.remainder(other, self)

    def __floordiv__(self, other: Any) -> Any:
        return _fn.floor_divide(self, other)

    def __rfloordiv__(self, other: Any) -> Any:
        return _fn.floor_divide(other, self)

    def __divmod__(self, other: Any) -> Any:
        return _fn.floor_divide(self, other), _fn.remainder(self, other)

    def __rdivmod__(self, other: Any) -> Any:
        return _fn.floor_divide(other, self), _fn.remainder(other, self)

    def __pow__(self, other: Any) -> Any:
        return _fn.power(self, other)

    def __rpow__(self, other: Any) -> Any:
        return _fn.power(other, self)

    def __matmul__(self, other: Any) -> Any:
        return _fn.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return _fn.matmul(other, self)

    def __neg__(self) -> Any:
        return _fn.negative(self)

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        return _fn.abs(self)

    def __lt__(self, other: Any) -> Any:
        return _fn.less(self, other)

    def __le__(self, other: Any) -> Any:
        return _fn.less_equal(self, other)

    def __gt__(self, other: Any) -> Any:
        return _fn.greater(self, other)

    def __ge__(self, other: Any) -> Any:
        return _fn.greater_equal(self, other)

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return _fn.equal(self, other)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return _fn.not_equal(self, other)

    # Bitwise on integers, logical on booleans (as NumPy); floats raise a TypeError.
    def __and__(self, other: Any) -> Any:
        return _fn.bitwise_and(self, other)

    def __rand__(self, other: Any) -> Any:
        return _fn.bitwise_and(other, self)

    def __or__(self, other: Any) -> Any:
        return _fn.bitwise_or(self, other)

    def __ror__(self, other: Any) -> Any:
        return _fn.bitwise_or(other, self)

    def __xor__(self, other: Any) -> Any:
        return _fn.bitwise_xor(self, other)

    def __rxor__(self, other: Any) -> Any:
        return _fn.bitwise_xor(other, self)

    def __lshift__(self, other: Any) -> Any:
        return _fn.left_shift(self, other)

    def __rlshift__(self, other: Any) -> Any:
        return _fn.left_shift(other, self)

    def __rshift__(self, other: Any) -> Any:
        return _fn.right_shift(self, other)

    def __rrshift__(self, other: Any) -> Any:
        return _fn.right_shift(other, self)

    def __invert__(self) -> Any:
        return _fn.invert(self)

    def __getitem__(self, index: Any) -> Any:
        return _fn.getitem(self, index)

    def sort(self, axis: int = -1) -> Any:
        # NumPy sorts in place and returns None; a traced array cannot change, so this
        # raises rather than silently leaving the array unsorted.
        raise TracerError("x.sort() sorts in place, which a traced array cannot: use fnp.sort(x)")


class Trace:
    """Records nodes while a function runs on tracers. Use as a context manager."""

    def __init__(self) -> None:
        self.inputs: list[Var] = []
        self.nodes: list[Node] = []
        self.captured: list[Tracer] = []  # tracers of enclosing traces, in input order
        self._captured_vars: dict[int, Var] = {}
        self._consts: dict[int, tuple[Any, Var]] = {}
        self._const_values: dict[int, np.ndarray] = {}
        self._effect_token: Var | None = None  # the output of the last effect, if any
        self.alive = True
        # (key, args, node count after, outputs) of a graph stored under `key` inlined as
        # the first thing this trace recorded (api.trace.note_inlined): its graph may then
        # be named by that key rather than digested again.
        self.inlined: tuple[str, list[Any], int, list[Any]] | None = None
        # A graph's inlining held back (core.interpreter.defer_inline): run by `settle`
        # before anything else is recorded or a tracer's var is read, else never if the
        # trace ends on its outputs (a warm jit(value_and_grad(f)) whose plan is on disk).
        self.deferred: Any = None

    def __enter__(self) -> Trace:
        _open.stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        popped = _open.stack.pop()
        assert popped is self, "traces must close in the order they opened"
        self.alive = False

    def new_input(self, aval: Aval, hint: str | None = None) -> Tracer:
        var = Var(aval, hint)
        self.inputs.append(var)
        return Tracer(self, var)

    def settle(self) -> None:
        """Run the inlining held back (`deferred`), if any: its nodes go in now."""
        deferred, self.deferred = self.deferred, None
        if deferred is not None:
            deferred.run()

    def to_var(self, x: Any) -> Var:
        """The var of `x` in this trace: its own tracer, a captured outer one, or a constant."""
        if self.deferred is not None:
            self.settle()
        if isinstance(x, Tracer):
            if x.trace is self:
                return x._var
            if not x.trace.alive:
                raise TracerError(
                    f"{describe(x)} escaped from a finished trace (was it stored in a global "
                    "or a closure and used in a later call?)"
                )
            var = self._captured_vars.get(id(x))
            if var is None:
                var = Var(x.aval, x._var.hint)
                self._captured_vars[id(x)] = var
                self.captured.append(x)
            return var
        return self.const(x, is_python_scalar(x))

    def const(self, x: Any, weak: bool = False) -> Var:
        """A constant node for the concrete value `x` (one per distinct object).

        An array is copied: a traced function sees the values its constants had when it
        was traced, whatever later happens to the arrays it closed over, as in JAX
        (tests/test_jit.py::test_captured_arrays_are_baked_in_at_trace_time).
        """
        if self.deferred is not None:
            self.settle()
        hit = self._consts.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        value = as_array(x)
        if value is x:
            value = np.array(x, copy=True)
        var = Var(Aval(value.shape, value.dtype, weak))
        self.nodes.append(Node(CONST, (), {"value": value, "weak": weak}, var))
        self._consts[id(x)] = (x, var)  # keeps x alive so its id stays unique
        self._const_values[id(var)] = value
        return var

    def emit(
        self, op: Primitive, args: Sequence[Any], params: dict[str, Any], aval: Aval | None = None
    ) -> Tracer:
        """Record `op` on `args`; `aval`, when given, is its result's (known from a graph
        traced on inputs of these avals), which the op's type rule is not asked again."""
        if self.deferred is not None:  # (before any tracer's var is read)
            self.settle()
        if op.effect:
            token = self.effect_token()
            in_vars = [token, *(self.to_var(a) for a in args[1:])]
        else:  # this trace's own tracers without a call each
            in_vars = [
                a._var if type(a) is Tracer and a.trace is self else self.to_var(a) for a in args
            ]
        return Tracer(self, self.add_node(op, in_vars, params, aval))

    def effect_token(self) -> Var:
        """An effect's first input: the token of the effect before it in this trace,
        whatever it was where the node came from, so effects run in program order."""
        if self.deferred is not None:
            self.settle()
        return self._effect_token or self.const(np.True_)

    def add_node(
        self, op: Primitive, in_vars: list[Var], params: dict[str, Any], aval: Aval | None = None
    ) -> Var:
        """`emit` on vars of this trace (an effect's first one its `effect_token`): the
        output's var. Inlining a graph calls this, without a tracer per value."""
        if self.deferred is not None:
            self.settle()
        if aval is None:
            aval = op.abstract_eval(*[v.aval for v in in_vars], **params)
        if op.effect:
            out = Var(aval)
            self.nodes.append(Node(op, in_vars, params, out))
            self._effect_token = out
            return out
        consts = self._const_values
        for v in in_vars:  # (a loop: most nodes stop at their first input, no generator)
            if id(v) not in consts:
                break
        else:  # Fold scalar arithmetic on constants (like `1 / n` in a mean's gradient).
            if aval.size <= 1:
                with np.errstate(all="ignore"):
                    value = op.impl(*[consts[id(v)] for v in in_vars], **params)
                return self.const(np.asarray(value, aval.dtype), aval.weak)
        out = Var(aval)
        self.nodes.append(Node(op, in_vars, params, out))
        return out

    def to_graph(self, outputs: Sequence[Any]) -> Graph:
        """The graph from this trace's inputs (explicit, then captured) to `outputs`, pruned;
        a graph inlined and held back whose outputs these are stays so (its nodes made
        when first asked for, core.interpreter.DeferredGraph)."""
        if self.deferred is not None:
            lazy = self.deferred.graph(outputs)
            if lazy is not None:
                return lazy  # type: ignore[no-any-return]
            self.settle()
        out_vars = [self.to_var(o) for o in outputs]
        inputs = self.inputs + [self._captured_vars[id(t)] for t in self.captured]
        return Graph(inputs, live_nodes(self.nodes, out_vars), out_vars)


def current_trace() -> Trace | None:
    """The innermost trace open in this thread, or None."""
    stack = _open.stack
    return stack[-1] if stack else None


def is_python_scalar(x: Any) -> bool:
    return isinstance(x, bool | int | float) and not isinstance(x, np.generic)


def as_array(x: Any, what: str = "value") -> np.ndarray:
    """A concrete leaf as a NumPy array, or a clear error for anything that is not one."""
    if isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, np.generic | bool | int | float):
        arr = np.asarray(x)
    else:
        raise TypeError(
            f"{what} is a {type(x).__name__}; expected a NumPy array or a Python/NumPy scalar "
            "(pytrees may nest tuples, lists and dicts of those)"
        )
    if arr.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{what} has unsupported dtype {arr.dtype}; fastgrad works with float32/float64 "
            "(differentiable) and bool/integer arrays"
        )
    return arr


def aval_of(x: Any) -> Aval:
    if isinstance(x, Tracer):
        return x.aval
    arr = as_array(x)
    return Aval(arr.shape, arr.dtype, weak=is_python_scalar(x))


def bind(op: Primitive, *args: Any, **params: Any) -> Any:
    """Apply `op`: record it if tracing a tracer argument, else compute it with NumPy."""
    stack = _open.stack
    if stack:
        for a in args:  # (a loop, not any(): a generator per op costs ~0.5 us)
            if type(a) is Tracer:
                return stack[-1].emit(op, args, params)
    for a in args:
        if isinstance(a, Tracer):
            raise TracerError(f"{describe(a)} was used outside of its trace")
    with np.errstate(all="ignore"):
        return np.asarray(op.impl(*args, **params))


def _format_const(args: list[str], params: dict[str, Any]) -> str:
    v = params["value"]
    return f"const({np.array2string(v, threshold=6)})" if v.size <= 6 else f"const(<{v.shape}>)"


def _const_abstract_eval(*, value: np.ndarray, weak: bool) -> Aval:
    return Aval(value.shape, value.dtype, weak)


CONST = register(
    Primitive(
        "const", _const_abstract_eval, lambda *, value, weak: value, vjp=None, format=_format_const
    )
)
