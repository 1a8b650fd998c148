"""fastgrad: JIT-compiled CPU autodiff (reverse and forward mode) for NumPy-style Python.

>>> import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
>>> @fg.jit
... def loss(w, x):
...     return fnp.sum(fnp.tanh(x @ w) ** 2)
>>> fg.grad(loss)(np.zeros(3), np.ones((2, 3)))
array([0., 0., 0.])
"""

from fastgrad import debug, numpy, random, scipy, testing
from fastgrad.api import (
    ShapeDtypeStruct,
    checkpoint,
    cond,
    custom_vjp,
    fori_loop,
    grad,
    hessian,
    jacfwd,
    jacobian,
    jacrev,
    jit,
    jvp,
    linearize,
    make_graph,
    primitive,
    pure_callback,
    release_buffers,
    remat,
    scan,
    stop_gradient,
    switch,
    value_and_grad,
    vjp,
    vmap,
    warmup,
    while_loop,
)
from fastgrad.core import pytree
from fastgrad.core.config import config
from fastgrad.core.ir import Graph
from fastgrad.core.tracing import TracerError

__version__ = "0.1.0"

__all__ = [
    "CacheWarning",
    "Graph",
    "ShapeDtypeStruct",
    "TracerError",
    "checkpoint",
    "cond",
    "config",
    "custom_vjp",
    "debug",
    "fori_loop",
    "grad",
    "hessian",
    "jacfwd",
    "jacobian",
    "jacrev",
    "jit",
    "jvp",
    "linearize",
    "make_graph",
    "numpy",
    "primitive",
    "pure_callback",
    "pytree",
    "random",
    "release_buffers",
    "scipy",
    "remat",
    "scan",
    "stop_gradient",
    "switch",
    "testing",
    "value_and_grad",
    "vjp",
    "vmap",
    "warmup",
    "while_loop",
]


def __getattr__(name: str) -> object:
    # CacheWarning lives with the machine-code cache, which `import fastgrad` leaves to
    # the first call (it brings tempfile, hashlib and pickle: ~8 ms).
    if name == "CacheWarning":
        from fastgrad.compiler.machine_code import CacheWarning

        return CacheWarning
    raise AttributeError(f"module 'fastgrad' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public names only: the layers (fastgrad.core, .ops, ...) are implementation.
    return [*__all__, "__version__"]
