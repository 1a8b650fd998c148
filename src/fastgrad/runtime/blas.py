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
import sys
import threading
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


@cache  # lowering asks it twice a product (ctypes' cast ~3 us: ~6 ms of a 999-product plan)
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
    OpenBLAS 0.3.31 it sets the count of the whole process (every thread reads it), so
    fastgrad sets it only through the process's one-thread region (`OneThread`)."""
    function = getattr(_library(), "openblas_set_num_threads_local", None)
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
    return function


def threads_local_address() -> int:
    """The address of `openblas_set_num_threads_local`, or 0 where NumPy's BLAS has none."""
    function = _set_threads_local()
    return 0 if function is None else ctypes.cast(function, ctypes.c_void_p).value or 0


def has_local_threads() -> bool:
    """Whether NumPy's BLAS can set its thread count (`OneThread`)."""
    return _set_threads_local() is not None


SEMAPHORE_CALLS = ("sem_wait", "sem_trywait", "sem_post")


def semaphore_calls() -> dict[str, Any] | None:
    """The C library's unnamed-semaphore calls (addresses, and sem_init as a ctypes
    function), or None where products are not cut (runtime.gemm_split: not Linux, or
    NumPy's OpenBLAS not found)."""
    if not sys.platform.startswith("linux") or blas_address("gemm", np.dtype(np.float32)) is None:
        return None
    try:
        libc = ctypes.CDLL(None)
        found = {n: ctypes.cast(getattr(libc, n), ctypes.c_void_p).value for n in SEMAPHORE_CALLS}
        init = libc.sem_init
    except (OSError, AttributeError):
        return None
    init.argtypes, init.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint], ctypes.c_int
    return {**found, "sem_init": init}


# The process's one-BLAS-thread region. BLAS's thread count is the whole process's, so a
# thread that set one on entry and put back what it read on exit could put two back
# while another thread's product ran (which then ran on BLAS's threads: other bits), and
# one that never left (the cut's worker) kept NumPy on one thread for good. Instead the
# first thread in sets one and saves the count it replaced, the last one out puts it
# back. The region is an int64 array: a POSIX semaphore of value 1 guarding it (its 32
# bytes; unguarded where the C library has none: not Linux), then these entries. The
# plan interpreter enters and leaves it from compiled code (runtime.vm: the table's
# header holds `region_address()`), `OneThread` from Python.
REGION_COUNT, REGION_SAVED, REGION_SETTER, REGION_WAIT, REGION_POST = 4, 5, 6, 7, 8
REGION_SIZE = 9
_REGION: list[Any] = []  # [(array, wait, post, setter, its address)] or [None]
_REGION_LOCK = threading.Lock()


def _region() -> Any:
    """The region (array, wait, post, setter, address) once made, or None where BLAS
    has no setter (the address kept: NumPy's `.ctypes.data` costs microseconds)."""
    if _REGION:
        return _REGION[0]
    with _REGION_LOCK:
        if not _REGION:
            setter = _set_threads_local()
            made = None
            if setter is not None:
                region = np.zeros(REGION_SIZE, np.int64)
                region[REGION_SETTER] = threads_local_address()
                calls = semaphore_calls()
                wait = post = None
                if calls is not None:
                    calls["sem_init"](region.ctypes.data, 0, 1)
                    region[REGION_WAIT], region[REGION_POST] = calls["sem_wait"], calls["sem_post"]
                    call = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
                    wait, post = call(calls["sem_wait"]), call(calls["sem_post"])
                made = (region, wait, post, setter, int(region.ctypes.data))
            _REGION.append(made)
    return _REGION[0]


def region_address() -> int:
    """The region's address (the plan interpreter's tables hold it), or 0 where NumPy's
    BLAS cannot set its thread count."""
    made = _region()
    return 0 if made is None else made[4]


def _after_fork_in_child() -> None:
    """A forked child has only the forking thread: no one is in the region. Put back
    the count a region held at the fork, and make the semaphore anew (another thread
    may have held it)."""
    made = _REGION[0] if _REGION else None
    if made is None:
        return
    region, wait, _, setter, address = made
    if region[REGION_COUNT] > 0:
        setter(int(region[REGION_SAVED]))
    region[REGION_COUNT] = 0
    if wait is not None:
        semaphore_calls()["sem_init"](address, 0, 1)  # type: ignore[index]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _step(delta: int) -> None:
    """Enter (`delta` 1) or leave (-1) the region from Python, as runtime.vm's `_region`
    does from compiled code: the first in sets one thread and saves the count it
    replaced, the last out puts it back; under the semaphore if there is one."""
    made = _region()
    if made is None:
        return
    region, wait, post, setter, address = made
    if wait is not None:
        while wait(address) != 0:  # EINTR: a signal woke it
            pass
    if delta > 0 and region[REGION_COUNT] == 0:
        region[REGION_SAVED] = setter(1)
    region[REGION_COUNT] += delta
    if delta < 0 and region[REGION_COUNT] == 0:
        setter(int(region[REGION_SAVED]))
    if post is not None:
        post(address)


class OneThread:
    """A context in which BLAS calls run on one thread: the process's region (above),
    entered and left with a few calls into the C library (~1-2 us). Does nothing where
    the library cannot set its count.

    >>> with OneThread():
    ...     pass
    """

    __slots__ = ()

    def __enter__(self) -> None:
        _step(1)

    def __exit__(self, *exc: object) -> None:
        _step(-1)
