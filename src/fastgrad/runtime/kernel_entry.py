"""Kernels called by their native address: what lets one adapter (compiler.codegen.adapter)
serve every kernel of a signature instead of one adapter compiled around each kernel.

Numba gives every function it compiles a C wrapper (its "cfunc wrapper": the arguments as
LLVM values, arrays as their structs) besides the Python one. `call_kernel` calls such a
wrapper at an address known only at run time, with the argument types it is compiled
for; `entry_address` finds a kernel's wrapper for those types. Compiling an adapter with
the kernel inside it cost 0.2-0.9x the kernel's own compile, for each kernel; a generic
adapter compiles once per signature (sizes, scalar dtypes, arrays' ranks and dtypes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from fastgrad.compiler import machine_code

_SCALARS = {
    "float64": types.float64,
    "float32": types.float32,
    "int64": types.int64,
    "int32": types.int32,
    "bool": types.boolean,
}


def _call_kernel_typing(typingctx: Any, address: Any, arguments: Any) -> Any:
    """Call the C wrapper at integer `address` of a function taking the members of the
    tuple `arguments`, as LLVM values of their Numba types (what the wrapper takes)."""
    members = list(arguments.types) if isinstance(arguments, types.BaseTuple) else [arguments]
    signature = types.void(address, arguments)

    def codegen(context: Any, builder: Any, sig: Any, values: Any) -> Any:
        kinds = [context.get_value_type(t) for t in members]
        fnty = ir.FunctionType(context.get_value_type(types.none), kinds)
        items = [builder.extract_value(values[1], i) for i in range(len(members))]
        builder.call(builder.inttoptr(values[0], fnty.as_pointer()), items)
        return context.get_dummy_value()

    return signature, codegen


call_kernel: Any = intrinsic(_call_kernel_typing)


def kernel_signature(
    nsizes: int, scalars: Sequence[str], operands: Sequence[tuple[int, str]]
) -> tuple[Any, ...] | None:
    """The argument types an adapter hands a kernel (compiler.codegen.adapter's layout):
    int64 sizes and chunk count, the scalars, C-contiguous arrays; None for a dtype the
    adapters do not take."""
    if any(d not in _SCALARS for d in [*scalars, *(d for _, d in operands)]):
        return None
    arrays = [types.Array(_SCALARS[d], ndim, "C") for ndim, d in operands]
    return (*[types.int64] * (nsizes + 1), *(_SCALARS[d] for d in scalars), *arrays)


def entry_address(kernel: Any, signature: tuple[Any, ...]) -> int | None:
    """The address of `kernel`'s C wrapper for `signature`, or None if Numba has not
    compiled it for that signature (`kernel.compile(signature)` does)."""
    compiled = kernel.overloads.get(signature)
    if compiled is None:
        return None
    name = compiled.fndesc.llvm_cfunc_wrapper_name
    return int(compiled.library.get_pointer_to_function(name)) or None


def source_tag() -> str:
    """What adapters' cached machine code is keyed by besides their source: this module's
    source (`call_kernel`'s code is compiled into them)."""
    return machine_code.source_tag("kernel entry", __file__)
