"""Random numbers with explicit keys, as in JAX: `key(seed)`, `split`, `fold_in`, and samplers
that take a key. Inside `fg.jit` they are computed by the compiled function, in its fused
loops; a key gives the same numbers on every path (jitted or not, any thread count). The
functions live with their primitives in fastgrad.ops (sampling, distributions, gamma,
shuffling).
"""

from fastgrad.ops.distributions import (
    categorical,
    gumbel,
    multivariate_normal,
    truncated_normal,
)
from fastgrad.ops.gamma import beta, dirichlet, gamma
from fastgrad.ops.sampling import (
    bernoulli,
    bits,
    exponential,
    fold_in,
    key,
    normal,
    randint,
    split,
    uniform,
)
from fastgrad.ops.shuffling import choice, permutation

PRNGKey = key

__all__ = [
    "PRNGKey", "bernoulli", "beta", "bits", "categorical", "choice", "dirichlet", "exponential",
    "fold_in", "gamma", "gumbel", "key", "multivariate_normal", "normal", "permutation",
    "randint", "split", "truncated_normal", "uniform",
]  # fmt: skip
