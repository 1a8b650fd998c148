"""L2-regularized logistic regression on a Dask cluster, shared by the dask_* examples:
the loss, a local cluster, a data set generated chunk by chunk on the workers (nothing
passes through the client), and the bridge to SciPy's flat parameter vectors.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np

import fastgrad.numpy as fnp

# Workers elsewhere cannot import this file: send its functions (the loss) by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

PENALTY = 1e-3  # the L2 weight: 0.5 * PENALTY * |w|^2 added to the mean loss


def loss(params, x, y):
    """Mean logistic loss of labels y in {0, 1} plus the L2 penalty (per chunk: a mean of
    chunk means weighted by rows is the mean, and the penalty is the same in every chunk)."""
    z = x @ params["w"] + params["b"]
    return fnp.mean(fnp.softplus(z) - y * z) + 0.5 * PENALTY * fnp.sum(params["w"] ** 2)


def start_cluster(workers: int, memory_limit: str | None = None):
    """A LocalCluster of `workers` single-threaded processes on the loopback interface."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        memory_limit=memory_limit or "auto",
    )
    return cluster, Client(cluster)


def true_weights(features: int) -> np.ndarray:
    """The weights that generate the labels: the same for every seed, so that a data set
    made with another seed is held-out data of the same problem."""
    return np.random.default_rng(1234).standard_normal(features) / np.sqrt(features) * 3


def make_data(rows: int, features: int, chunk_rows: int, seed: int):
    """Features and labels as dask arrays, built on the workers chunk by chunk: x is
    standard normal, y is 1 with probability sigmoid(x @ w_true + 0.5). Lazy: persist
    them to keep them in the workers' memory."""
    import dask.array as da

    rng = da.random.default_rng(seed)
    x = rng.standard_normal((rows, features), chunks=(chunk_rows, features))
    z = x @ true_weights(features) + 0.5
    y = (rng.random(rows, chunks=chunk_rows) < 1 / (1 + da.exp(-z))).astype(np.float64)
    return x, y


def unflat(theta: np.ndarray) -> dict:
    return {"w": theta[:-1], "b": np.asarray(theta[-1])}


def flat(params: dict) -> np.ndarray:
    return np.concatenate([params["w"], [params["b"]]])


def scipy_objective(value_and_grad, *data):
    """f(theta) -> (loss, gradient) over flat vectors, for scipy.optimize.minimize(jac=True)."""

    def objective(theta):
        value, grads = value_and_grad(unflat(theta), *data)
        return float(value), flat(grads)

    return objective
