"""The source of a kernel adapter: a C function of one uniform signature through which the
plan interpreter (runtime.vm) calls kernels. It reads a kernel's address, sizes, scalars
and array operands from the step's row of int64s, builds C-contiguous arrays over the
addresses in the pointer table, and calls the kernel at that address
(runtime.kernel_entry). It depends on the kernel's signature only, so one adapter serves
every kernel of that signature.
"""

from __future__ import annotations

from collections.abc import Sequence

FLOATS = ("float16", "float32", "float64")
ADAPTED = ("float64", "float32", "int64", "int32", "bool")  # the dtypes adapters take


def adapter_source(nsizes: int, scalars: Sequence[str], operands: Sequence[tuple[int, str]]) -> str:
    """The module source defining `adapter` for kernels taking `nsizes` sizes, a chunk
    count, scalars of the dtypes named in `scalars`, then arrays of the (ndim, dtype)
    in `operands` (inputs, then outputs).

    Row layout: the kernel's address, the sizes, the chunk count, one entry per scalar
    (a float's index into the float table, an integer's or a bool's value), then per
    array its pointer slot and its dims. The namespace it runs in provides
    `call_kernel`, `np`, `carray` and `pointer_<dtype>`; runtime.vm compiles it as a C
    function.

    >>> print(adapter_source(1, ["float32"], [(2, "float64")]))  # doctest: +NORMALIZE_WHITESPACE
    def adapter(row, ptrs, floats):
        call_kernel(row[0], (row[1], row[2], np.float32(floats[row[3]]),
               carray(pointer_float64(ptrs[row[4]]), (row[5], row[6])),))
    """
    args = [f"row[{i}]" for i in range(1, nsizes + 2)]
    pos = nsizes + 2
    for dtype in scalars:
        if dtype in FLOATS:
            args.append(f"np.{dtype}(floats[row[{pos}]])")
        elif dtype == "bool":
            args.append(f"row[{pos}] != 0")
        else:
            args.append(f"np.{dtype}(row[{pos}])")
        pos += 1
    for ndim, dtype in operands:
        dims = [f"row[{pos + 1 + d}]" for d in range(ndim)]
        shape = f"({dims[0]},)" if ndim == 1 else f"({', '.join(dims)})"
        args.append(f"carray(pointer_{dtype}(ptrs[row[{pos}]]), {shape})")
        pos += 1 + ndim
    return f"def adapter(row, ptrs, floats):\n    call_kernel(row[0], ({', '.join(args)},))\n"
