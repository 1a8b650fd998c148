"""float32 reductions' relative error against float64, fastgrad beside NumPy and JAX.

    FASTGRAD_COMPILE=sync PYTHONPATH=src python tools/reduction_accuracy.py [filter ...]

(run with the peers' interpreter to get the JAX column). Each reduction of float32 input
`x` is compared with the same reduction computed in float64 on `x` converted exactly
(NumPy, float64); the error is the largest over the outputs of |got - want|, relative to
the largest |want| (so a sum of normal values near zero does not blow up one entry).
Values uniform in [0, 1) (every partial sum grows: the bad case for a sum kept in one
accumulator) and standard normal. The kernels are compiled before the first call
(FASTGRAD_COMPILE=sync), so no row measures the NumPy tier.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import numpy as np

os.environ.setdefault("FASTGRAD_COMPILE", "sync")

import fastgrad as fg  # noqa: E402
import fastgrad.numpy as fnp  # noqa: E402

SHAPES = ((1_000_000,), (1000, 1000), (4096, 1024), (1_000_000, 8, 2))
AXES = {"-1": -1, "0": 0, "all": None}


def _ops(xp) -> dict[str, Callable]:  # type: ignore[no-untyped-def]
    """The reductions, written once over an array namespace (NumPy, fastgrad or JAX)."""

    def lse(x, a):  # type: ignore[no-untyped-def]
        m = xp.max(x, axis=a, keepdims=True)
        return xp.log(xp.sum(xp.exp(x - m), axis=a)) + xp.squeeze(m, axis=a)

    def softmax_denominator(x, a):  # type: ignore[no-untyped-def]
        return xp.sum(xp.exp(x - xp.max(x, axis=a, keepdims=True)), axis=a)

    return {
        "sum": lambda x, a: xp.sum(x, axis=a),
        "mean": lambda x, a: xp.mean(x, axis=a),
        "logsumexp": lse,
        "softmax-den": softmax_denominator,
        "var": lambda x, a: xp.var(x, axis=a),
        "sum(x*x)": lambda x, a: xp.sum(x * x, axis=a),
    }


def _error(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("filter", nargs="*", help="only rows containing all these words")
    args = parser.parse_args()
    try:
        import jax

        jax.config.update("jax_platforms", "cpu")
        import jax.numpy as jnp

        jax_ops = _ops(jnp)
    except ImportError:
        jax_ops = None
    np_ops, fg_ops = _ops(np), _ops(fnp)
    print(f"{'op':12s} {'axis':>4s} {'shape':18s} {'values':7s} "
          f"{'fastgrad':>9s} {'numpy':>9s} {'jax':>9s}  fastgrad/numpy")  # fmt: skip
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        data = {
            "uniform": rng.random(shape, dtype=np.float32),
            "normal": rng.standard_normal(shape, dtype=np.float32),
        }
        for op in np_ops:
            for axis in AXES if len(shape) > 1 else {"all": None}:
                for kind, x in data.items():
                    label = f"{op} {axis} {shape} {kind}"
                    if not all(word in label for word in args.filter):
                        continue
                    a = AXES[axis]
                    want = np_ops[op](x.astype(np.float64), a)
                    ours = _error(fg.jit(lambda x, op=op, a=a: fg_ops[op](x, a))(x), want)
                    theirs = _error(np_ops[op](x, a), want)
                    if jax_ops is not None:
                        f = jax.jit(lambda x, op=op, a=a: jax_ops[op](x, a))
                        peer = f"{_error(np.asarray(f(x)), want):9.1e}"
                    else:
                        peer = f"{'-':>9s}"
                    print(
                        f"{op:12s} {axis:>4s} {str(shape):18s} {kind:7s} {ours:9.1e} "
                        f"{theirs:9.1e} {peer}  {ours / max(theirs, 1e-12):8.1f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
