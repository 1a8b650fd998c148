"""Logistic regression on a data set larger than one Dask worker's memory limit.
=============================================================================

Two worker processes, each limited to 2 GiB, generate the features and labels chunk by
chunk (1.8 million rows of 100 float64 features: 1.44 GB, two thirds of one worker's
limit, past the 60% from which Dask spills a worker's data to disk) and keep them;
nothing passes through the client. SciPy's L-BFGS then
fits an L2-regularized logistic regression, each step one call of
`fastgrad.dask.value_and_grad(loss)`: the parameters go out to the workers, each chunk's
loss and gradient are computed where the chunk lives, and one gradient comes back. The
loss per iteration goes to a PNG; held-out rows, also generated on the workers, give the
accuracy, next to that of the weights that generated the labels.

Run::

    python examples/dask_logistic.py [OUTPUT.png] [--rows N] [--iterations K] ...
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
from _dask_logistic import loss, make_data, scipy_objective, start_cluster, true_weights, unflat

import fastgrad.dask


def accuracy(x, y, theta) -> float:
    """Share of rows whose label the linear score predicts, computed on the workers."""
    return float((((x @ theta[:-1] + theta[-1]) > 0) == (y > 0.5)).mean().compute())


def plot(losses, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(len(losses)), losses, marker="o", ms=3)
    ax.set_yscale("log")
    ax.set_xlabel("L-BFGS iteration")
    ax.set_ylabel("loss (mean logistic + L2)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(
    output=None,
    rows=1_800_000,
    features=100,
    chunk_rows=100_000,
    workers=2,
    memory_limit="2GiB",
    iterations=25,
    seed=0,
    client=None,
    verbose=True,
):
    from distributed import wait
    from scipy.optimize import minimize

    say = print if verbose else (lambda *a, **k: None)
    output = output or os.path.join(tempfile.gettempdir(), "dask_logistic_loss.png")
    own = client is None
    if own:
        cluster, client = start_cluster(workers, memory_limit)
    try:
        start = time.perf_counter()
        x, y = client.persist(list(make_data(rows, features, chunk_rows, seed)))
        x_test, y_test = client.persist(
            list(make_data(max(rows // 50, 1), features, chunk_rows, seed + 1))
        )
        wait([x, y, x_test, y_test])
        limits = set(
            client.run(lambda dask_worker: dask_worker.memory_manager.memory_limit).values()
        )
        say(
            f"data: {rows:,} x {features} float64 = {x.nbytes / 1e9:.2f} GB in "
            f"{x.numblocks[0]} chunks, generated on {len(client.nthreads())} workers with "
            f"a memory limit of {', '.join(f'{m / 2**30:.2f} GiB' for m in limits)} each "
            f"({time.perf_counter() - start:.1f} s)"
        )

        value_and_grad = fastgrad.dask.value_and_grad(loss)
        theta0 = np.zeros(features + 1)
        compile_s = value_and_grad.warmup(unflat(theta0), x, y)
        say(
            "warmup (trace + compile or load kernels) per worker: "
            + ", ".join(f"{s:.1f} s" for s in compile_s.values())
        )

        objective = scipy_objective(value_and_grad, x, y)
        losses = [objective(theta0)[0]]

        def record(intermediate_result):  # SciPy passes the iterate's result by this name
            losses.append(float(intermediate_result.fun))

        start = time.perf_counter()
        res = minimize(
            objective,
            theta0,
            jac=True,
            method="L-BFGS-B",
            callback=record,
            options={"maxiter": iterations, "gtol": 1e-9, "ftol": 1e-14},
        )
        seconds = time.perf_counter() - start
        for i, value in enumerate(losses):
            if i % 5 == 0 or i == len(losses) - 1:
                say(f"  iteration {i:3d}: loss {value:.8f}")
        say(
            f"L-BFGS: {res.nit} iterations, {res.nfev} gradient calls in {seconds:.1f} s "
            f"({seconds / res.nfev:.2f} s per call over {x.nbytes / 1e9:.2f} GB)"
        )
        truth = np.concatenate([true_weights(features), [0.5]])
        result = {
            "losses": losses,
            "iterations": int(res.nit),
            "gradient_calls": int(res.nfev),
            "seconds_per_call": seconds / res.nfev,
            "test_accuracy": accuracy(x_test, y_test, res.x),
            "true_weights_accuracy": accuracy(x_test, y_test, truth),
            "weight_error": float(np.linalg.norm(res.x - truth) / np.linalg.norm(truth)),
            "data_gb": x.nbytes / 1e9,
            "output": output,
        }
        say(
            f"held-out accuracy {result['test_accuracy']:.4f} (the generating weights: "
            f"{result['true_weights_accuracy']:.4f}); relative weight error "
            f"{result['weight_error']:.3f}"
        )
        plot(losses, output, f"logistic regression, {rows:,} x {features} on Dask")
        say(f"loss curve written to {output}")
        return result
    finally:
        if own:
            client.close()
            cluster.close()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("output", nargs="?", default=None, help="PNG file for the loss curve")
    parser.add_argument("--rows", type=int, default=1_800_000)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="2GiB", help="per worker")
    parser.add_argument("--iterations", type=int, default=25, help="L-BFGS iterations")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(
        output=args.output,
        rows=args.rows,
        features=args.features,
        chunk_rows=args.chunk_rows,
        workers=args.workers,
        memory_limit=args.memory_limit,
        iterations=args.iterations,
        seed=args.seed,
    )
    print(f"done in {time.perf_counter() - start:.1f} s")
    return result


if __name__ == "__main__":
    main()
