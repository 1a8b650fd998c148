"""Random numbers with explicit keys, as in JAX: `key(seed)`, `split`, `fold_in`, and samplers
that take a key. Inside `fg.jit` they are computed by the compiled function, in its fused
loops; a key gives the same numbers on every path (jitted or not, any thread count). The
functions live with their primitives in fastgrad.ops.sampling.
"""

from fastgrad.ops.distributions import (
    categorical,
    gumbel,
    multivariate_normal,
    truncated_normal,
)
from fastgrad.ops.sampling import (
    bernoulli,
    bits,
    fold_in,
    key,
    normal,
    randint,
    split,
    uniform,
)

PRNGKey = key

__all__ = [
    "PRNGKey", "bernoulli", "bits", "categorical", "fold_in", "gumbel", "key",
    "multivariate_normal", "normal", "randint", "split", "truncated_normal", "uniform",
]  # fmt: skip
