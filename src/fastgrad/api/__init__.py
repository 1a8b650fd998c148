"""The public entry points: jit and the user-facing transformations.

Each traces the user's function into a graph (fastgrad.core.tracing), transforms it
(fastgrad.transforms) where asked, and runs the result: on concrete arrays through the
compiled plan (fastgrad.compiler, fastgrad.runtime), on tracers by inlining it into the
enclosing trace, which is what lets them compose in any order. Only this layer knows the
order of the pipeline.
"""

from fastgrad.api.callback import ShapeDtypeStruct, primitive, pure_callback
from fastgrad.api.control_flow import checkpoint, cond, fori_loop, remat, scan, switch, while_loop
from fastgrad.api.custom_vjp import custom_vjp
from fastgrad.api.forward import jvp
from fastgrad.api.grad import grad, stop_gradient, value_and_grad, vjp
from fastgrad.api.jacobian import hessian, jacfwd, jacobian, jacrev, linearize
from fastgrad.api.jit import jit, make_graph, release_buffers, warmup
from fastgrad.api.vmap import vmap

__all__ = [
    "ShapeDtypeStruct",
    "checkpoint",
    "cond",
    "custom_vjp",
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
    "primitive",
    "pure_callback",
    "release_buffers",
    "remat",
    "scan",
    "stop_gradient",
    "switch",
    "value_and_grad",
    "vjp",
    "vmap",
    "warmup",
    "while_loop",
]
