"""Two optimizers driving fastgrad.dask: SciPy's L-BFGS and plain gradient descent.
================================================================================

The data (logistic-regression features and labels) is generated on the workers of a local
Dask cluster and stays there; each optimizer step calls
`fastgrad.dask.value_and_grad(loss)`, which evaluates the loss and its gradient on every
chunk where it lives and adds them up. The same optimizers run in one process on the same
data (computed locally for the comparison), and scikit-learn's LogisticRegression solves
the same regularized problem: all reach the same weights.

Run::

    python examples/dask_optimizers.py [--rows N] [--features D] [--workers W] ...
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _dask_logistic import PENALTY, flat, loss, make_data, scipy_objective, start_cluster, unflat

import fastgrad as fg
import fastgrad.dask


def lbfgs(objective, theta0, tol=1e-10):
    from scipy.optimize import minimize

    res = minimize(
        objective, theta0, jac=True, method="L-BFGS-B", options={"gtol": tol, "ftol": 1e-15}
    )
    return res.x, res.fun, res.nit


def gradient_descent(value_and_grad, params, data, steps, learning_rate, say):
    """params -= learning_rate * gradient, `steps` times; the loss every step."""
    losses = []
    for step in range(steps):
        value, grads = value_and_grad(params, *data)
        losses.append(float(value))
        params = {k: params[k] - learning_rate * grads[k] for k in params}
        if step % max(1, steps // 5) == 0 or step == steps - 1:
            say(f"  gradient descent step {step:4d}: loss {float(value):.10f}")
    return params, losses


def run(
    rows=200_000,
    features=20,
    chunk_rows=25_000,
    workers=2,
    gd_steps=60,
    learning_rate=2.0,
    seed=0,
    client=None,
    verbose=True,
):
    say = print if verbose else (lambda *a, **k: None)
    own = client is None
    if own:
        cluster, client = start_cluster(workers)
    try:
        x, y = client.persist(list(make_data(rows, features, chunk_rows, seed)))
        x_local, y_local = client.compute([x, y], sync=True)  # for the comparisons only
        say(f"data: {rows:,} x {features} float64 in {x.numblocks[0]} chunks on the workers")
        distributed = fastgrad.dask.value_and_grad(loss)
        distributed.warmup(unflat(np.zeros(features + 1)), x, y)
        local = fg.jit(fg.value_and_grad(loss))
        theta0 = np.zeros(features + 1)

        start = time.perf_counter()
        theta_d, loss_d, iters_d = lbfgs(scipy_objective(distributed, x, y), theta0)
        seconds_d = time.perf_counter() - start
        theta_l, loss_l, _ = lbfgs(scipy_objective(local, x_local, y_local), theta0)
        say(f"L-BFGS on Dask: loss {loss_d:.12f} after {iters_d} iterations ({seconds_d:.1f} s)")
        say(f"L-BFGS in one process: loss {loss_l:.12f}")

        from sklearn.linear_model import LogisticRegression

        # sklearn minimizes C * sum(log-loss) + |w|^2 / 2: the same problem for C = 1/(PENALTY n)
        ref = LogisticRegression(C=1 / (PENALTY * rows), tol=1e-12, max_iter=10_000)
        ref.fit(x_local, y_local)
        theta_sk = np.concatenate([ref.coef_[0], ref.intercept_])

        params, losses = gradient_descent(
            distributed, unflat(theta0), (x, y), gd_steps, learning_rate, say
        )
        result = {
            "lbfgs_loss": loss_d,
            "lbfgs_iterations": iters_d,
            "lbfgs_vs_one_process": float(np.max(np.abs(theta_d - theta_l))),
            "lbfgs_vs_sklearn": float(np.max(np.abs(theta_d - theta_sk))),
            "gd_losses": losses,
            "gd_gap": losses[-1] - loss_d,
            "gd_vs_lbfgs": float(np.max(np.abs(flat(params) - theta_d))),
        }
        say(
            f"largest weight difference, L-BFGS on Dask vs one process: "
            f"{result['lbfgs_vs_one_process']:.1e}, vs scikit-learn: "
            f"{result['lbfgs_vs_sklearn']:.1e}"
        )
        say(
            f"gradient descent after {gd_steps} steps: loss {losses[-1]:.10f}, "
            f"{result['gd_gap']:.1e} above L-BFGS's"
        )
        return result
    finally:
        if own:
            client.close()
            cluster.close()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--chunk-rows", type=int, default=25_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gd-steps", type=int, default=60)
    parser.add_argument("--learning-rate", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(
        rows=args.rows,
        features=args.features,
        chunk_rows=args.chunk_rows,
        workers=args.workers,
        gd_steps=args.gd_steps,
        learning_rate=args.learning_rate,
        seed=args.seed,
    )
    print(f"done in {time.perf_counter() - start:.1f} s")
    return result


if __name__ == "__main__":
    main()
