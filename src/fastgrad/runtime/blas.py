"""Matrix products that add into their output, `c += a @ b`, through BLAS's gemm with
beta = 1: a gradient summed over many matmuls (the weights' gradient of an unrolled
loop) is accumulated in place rather than by an elementwise add per term.

The gemm is NumPy's own OpenBLAS (its `cblas_?gemm`, 64-bit integers), called with
ctypes: for the small float32 products of a recurrent step it ran ~1.6x faster than
SciPy's build of the same library on the development machine. Operands are passed
with transpose flags, never copied. Where that library is not found, `c += a @ b`
goes through NumPy (a product into scratch memory, then an add).
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable
from functools import cache, partial
from typing import Any

import numpy as np

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
_PREFIXES = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}
_INT, _I64, _PTR = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p


@cache
def _library() -> Any:
    """NumPy's OpenBLAS, or None where NumPy links another BLAS (or a differently named
    build); then `accumulate` uses NumPy."""
    root = os.path.dirname(os.path.dirname(np.__file__))
    for path in sorted(glob.glob(os.path.join(root, "numpy.libs", "libscipy_openblas64_*"))):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def library_identity() -> str:
    """NumPy's OpenBLAS as it describes itself: its file, its version and build, and the
    core whose kernels it runs (a DYNAMIC_ARCH build picks them per CPU); "none" where
    it is not found."""
    lib = _library()
    if lib is None:
        return "none"
    parts = [lib._name]
    for name in ("scipy_openblas_get_config64_", "scipy_openblas_get_corename64_"):
        function = getattr(lib, name, None)
        if function is not None:
            function.argtypes, function.restype = [], ctypes.c_char_p
            parts.append((function() or b"").decode(errors="replace"))
    return "\n".join(parts)


def _symbol(name: str, dtype: np.dtype) -> Any:
    """NumPy's OpenBLAS routine `cblas_?<name>` for `dtype`, or None."""
    lib = _library()
    prefix = _PREFIXES.get(np.dtype(dtype))
    return getattr(lib, f"scipy_cblas_{prefix}{name}64_", None) if lib and prefix else None


@cache
def _routine(name: str, dtype: np.dtype) -> Any:
    """`cblas_?gemm` or `cblas_?syrk` (`name`) for `dtype`, argument types set, or None."""
    function = _symbol(name, dtype)
    if function is None:
        return None
    real = ctypes.c_float if np.dtype(dtype) == np.float32 else ctypes.c_double
    if name == "gemm":  # order, trans a, trans b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc
        kinds = [_INT] * 3 + [_I64] * 3 + [real, _PTR, _I64, _PTR, _I64, real, _PTR, _I64]
    else:  # syrk: order, upper/lower, trans, n, k, alpha, a, lda, beta, c, ldc
        kinds = [_INT] * 3 + [_I64] * 2 + [real, _PTR, _I64, real, _PTR, _I64]
    function.argtypes, function.restype = kinds, None
    return function


def blas_address(name: str, dtype: np.dtype) -> int | None:
    """The address of `cblas_?<name>` for `dtype` (gemm and syrk; gemv and dot, which
    `np.matmul` calls for products with a dimension of 1, runtime.vm_vectors): the plan
    interpreter calls them from compiled code. None where NumPy's OpenBLAS is not found."""
    function = _symbol(name, dtype)
    return None if function is None else ctypes.cast(function, ctypes.c_void_p).value


def _operand(x: np.ndarray) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a 2-D row-major operand as BLAS takes it
    without a copy, or None when neither of its axes has unit stride."""
    rows, cols = x.shape
    item = x.itemsize
    if x.strides[1] == item or cols == 1:
        ld = x.strides[0] // item if rows > 1 else cols
        if ld >= max(1, cols) and x.strides[0] % item == 0:
            return NO_TRANS, ld
    if x.strides[0] == item or rows == 1:
        ld = x.strides[1] // item if cols > 1 else rows
        if ld >= max(1, rows) and x.strides[1] % item == 0:
            return TRANS, ld
    return None


def accumulate(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """`c += a @ b` for 2-D float arrays of one dtype, `c` C-contiguous.

    >>> a, b = np.ones((2, 3)), np.arange(6.0).reshape(3, 2)
    >>> c = np.ones((2, 2))
    >>> accumulate(a.T.T, b, c); c
    array([[ 7., 10.],
           [ 7., 10.]])
    """
    call = bind(a, b, c)
    call()


def bind(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None]:
    """`accumulate(a, b, c)` as a call with every argument prepared once: the arrays'
    memory must stay where it is (a plan's preallocated buffers and constants)."""
    gemm = _routine("gemm", c.dtype)
    m, n = c.shape
    k = a.shape[1]
    fits = (
        gemm is not None
        and a.dtype == b.dtype == c.dtype
        and c.flags.c_contiguous
        and a.shape == (m, k)
        and b.shape == (k, n)
    )
    left, right = (_operand(a), _operand(b)) if fits else (None, None)
    if left is None or right is None or m == 0 or n == 0:
        return partial(_accumulate_with_numpy, a, b, c)
    (ta, lda), (tb, ldb) = left, right
    args: tuple[Any, ...] = (ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda)
    args += (b.ctypes.data, ldb, 1.0, c.ctypes.data, max(1, n))
    return _Bound(gemm, args, (a, b, c))


def _accumulate_with_numpy(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    np.add(c, np.matmul(a, b), out=c)


class _Bound:
    """A gemm with its arguments bound, holding the arrays whose addresses it passes."""

    __slots__ = ("arrays", "args", "gemm")

    def __init__(self, gemm: Any, args: tuple[Any, ...], arrays: tuple[np.ndarray, ...]):
        self.gemm, self.args, self.arrays = gemm, args, arrays

    def __call__(self) -> None:
        self.gemm(*self.args)


@cache
def _set_threads_local() -> Any:
    """OpenBLAS's `openblas_set_num_threads_local` (BLAS's thread count; returns the
    previous one), or None where NumPy's BLAS has none. Despite its name, in NumPy's
    OpenBLAS 0.3.31 it sets the count of the whole process (docs/guarantees.md)."""
    function = getattr(_library(), "openblas_set_num_threads_local", None)
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
    return function


def threads_local_address() -> int:
    """The address of `openblas_set_num_threads_local` (the plan interpreter calls it
    from compiled code), or 0 where NumPy's BLAS has none."""
    function = _set_threads_local()
    return 0 if function is None else ctypes.cast(function, ctypes.c_void_p).value or 0


def has_local_threads() -> bool:
    """Whether NumPy's BLAS can set the thread count of one thread (`OneThread`)."""
    return _set_threads_local() is not None


class OneThread:
    """A context in which BLAS calls run on one thread, restored on exit: two calls into
    the library (~1 us), where threadpoolctl's limit sets every library's count. The
    count is the whole process's in NumPy's OpenBLAS 0.3.31 (docs/guarantees.md,
    "Threads"). Does nothing where the library lacks the call.

    >>> with OneThread():
    ...     pass
    """

    __slots__ = ("before",)

    def __enter__(self) -> None:
        set_local = _set_threads_local()
        self.before = set_local(1) if set_local is not None else None

    def __exit__(self, *exc: object) -> None:
        if self.before is not None:
            _set_threads_local()(self.before)
