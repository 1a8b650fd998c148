"""The plan interpreter: one compiled loop over an int64 step table, shared by every plan
(compiled once per kind of argument tuple, not per plan). It never sees a kernel's
types: each kernel is called through its adapter, a C function of one uniform signature
`(int64* row, int64* ptrs, float64* scalars)` that rebuilds the kernel's arrays from the
pointer table (compiler.codegen.adapter).

Step table: `code` is flat, step i starts at `starts[i]`.
  KERNEL: [KERNEL, adapter index, <the adapter's row: sizes, chunks, scalars, operands>]
`ptrs[j]` is the address of operand slot j, filled before each segment runs.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np
from llvmlite import ir
from numba import carray, literal_unroll, types
from numba.core.ccallback import CFunc
from numba.extending import intrinsic

from fastgrad.compiler.machine_code import MachineCodeCache, cached_njit

KERNEL = 1

#: The adapters' C signature: the step's row, the pointer table, the float scalars.
ADAPTER_SIGNATURE = types.void(
    types.CPointer(types.int64), types.CPointer(types.int64), types.CPointer(types.float64)
)


def _call_adapter_typing(typingctx: Any, address: Any, row: Any, ptrs: Any, scalars: Any) -> Any:
    """Call the C function at integer `address` with (int64*, int64*, float64*)."""
    signature = types.void(address, row, ptrs, scalars)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i64p = ir.IntType(64).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i64p, i64p, ir.DoubleType().as_pointer()])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), args[1:])
        return context.get_dummy_value()

    return signature, codegen


def _element_pointer_typing(typingctx: Any, array: Any, index: Any) -> Any:
    """The address of `array[index]` of a 1-D array, as a typed pointer."""
    signature = types.CPointer(array.dtype)(array, index)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.gep(data, [args[1]])

    return signature, codegen


# Typed as Any: the intrinsics' first argument (the typing context) is Numba's, not the caller's.
_call_adapter: Any = intrinsic(_call_adapter_typing)
_element_pointer: Any = intrinsic(_element_pointer_typing)


def _typed_pointer(dtype: Any) -> Any:
    @intrinsic
    def pointer(typingctx: Any, address: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

        return types.CPointer(dtype)(address), codegen

    return pointer


#: address -> typed pointer, by NumPy dtype name: the adapters' globals.
POINTERS = {
    name: _typed_pointer(numba_type)
    for name, numba_type in [
        ("float64", types.float64),
        ("float32", types.float32),
        ("int64", types.int64),
        ("int32", types.int32),
        ("bool", types.boolean),
    ]
}


@cached_njit("plan interpreter", nogil=True)
def run_steps(
    code: np.ndarray,
    starts: np.ndarray,
    first: int,
    count: int,
    ptrs: np.ndarray,
    scalars: np.ndarray,
    adapters: np.ndarray,
    indices: np.ndarray,
    arrays: tuple[np.ndarray, ...],
) -> None:  # pragma: no cover - compiled
    """Run steps `first` .. `first + count - 1` of a step table, after setting
    `ptrs[indices[k]]` to the address of `arrays[k]` (the call's arguments and fresh
    outputs): taking addresses here costs a fraction of NumPy's `.ctypes.data` (~5 us
    each). Compiled once per kind of `arrays` tuple (its arrays' dtypes and ranks)."""
    k = 0
    for array in literal_unroll(arrays):
        ptrs[indices[k]] = array.ctypes.data
        k += 1
    for i in range(first, first + count):
        p = starts[i]
        if code[p] == KERNEL:
            _call_adapter(
                adapters[code[p + 1]],
                _element_pointer(code, p + 2),
                _element_pointer(ptrs, 0),
                _element_pointer(scalars, 0),
            )


def compile_adapter(source: str, kernel: Any, tag: str = "") -> Any:
    """The C function that `source` (compiler.codegen.adapter) defines around `kernel`,
    its machine code kept in fastgrad's cache under `tag` (which must name the kernel
    and the source; "": not kept). Compiling one costs about as much as its kernel.

    >>> from fastgrad.compiler.codegen.adapter import adapter_source
    >>> from numba import njit
    >>> @njit
    ... def double(n, chunks, x, y):
    ...     for i in range(n):
    ...         y[i] = 2 * x[i]
    >>> c = compile_adapter(adapter_source(1, [], [(1, "float64"), (1, "float64")]), double)
    >>> x, y = np.arange(3.0), np.zeros(3)
    >>> row = np.array([3, 1, 0, 3, 1, 3])  # size 3, 1 chunk, x in slot 0, y in slot 1
    >>> run_steps(np.array([KERNEL, 0, *row]), np.array([0]), 0, 1, np.zeros(2, np.int64),
    ...     np.zeros(1), np.array([c.address]), np.array([0, 1]), (x, y))
    >>> y
    array([0., 2., 4.])
    """
    # A module of its own, found by name when machine code is loaded from the cache.
    module = ModuleType(f"fastgrad_adapter_{tag or id(source)}")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    namespace.update(
        np=np, carray=carray, kernel=kernel, **{f"pointer_{n}": p for n, p in POINTERS.items()}
    )
    exec(compile(source, "<fastgrad adapter>", "exec"), namespace)
    signature = (ADAPTER_SIGNATURE.args, ADAPTER_SIGNATURE.return_type)
    adapter: Any = CFunc(namespace["adapter"], signature, locals={}, options={"nogil": True})
    if tag:  # Numba consults `_cache` before it compiles (as for kernels: kernel_cache)
        adapter._cache = MachineCodeCache(namespace["adapter"], tag, folder="adapters")
    adapter.compile()
    return adapter
