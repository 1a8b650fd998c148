"""EM for a Gaussian mixture, with the M-step driven by fastgrad gradients.
========================================================================

Data: the iris flowers projected on their first two principal components (2-D, so the
2x2 determinant and inverse of each covariance can be written with elementwise
`fastgrad.numpy` operations).

EM maximizes the log-likelihood l(theta) = sum_i log sum_k pi_k N(x_i | mu_k, Sigma_k) by
alternating

  E-step: responsibilities r_ik = p(z_i = k | x_i, theta_old), held fixed;
  M-step: maximize Q(theta) = sum_ik r_ik [log pi_k + log N(x_i | mu_k, Sigma_k)].

In code, Q is written with `r = fg.stop_gradient(softmax(log_joint))`: the responsibilities
are computed from the current parameters but treated as constants, so the gradient of Q
is the M-step's gradient and does not backpropagate through the E-step. (At theta_old it
also equals the gradient of l itself, Fisher's identity; without the stop_gradient one
differentiates l - entropy(r) instead. The script checks both.)

The M-step is then taken as one gradient step per parameter block, with the step size set
by Q's known curvature, from gradients that fastgrad computes (nothing below hand-codes
dQ/dtheta). Writing N_k = sum_i r_ik and S_k = sum_i r_ik (x_i - mu_k)(x_i - mu_k)^T:

  * weights: Q has r_ik log pi_k, so pi_k * dQ/dpi_k = N_k, and the maximizer on the
    simplex (Lagrange condition) is pi_k = N_k / n;
  * means: Q is concave quadratic in mu_k with Hessian -N_k Sigma_k^-1, so one Newton
    step, mu_k + Sigma_k dQ/dmu_k / N_k, lands exactly on the maximizer;
  * covariances: dQ/dSigma_k = (Sigma_k^-1 S_k Sigma_k^-1 - N_k Sigma_k^-1) / 2, so the
    natural-gradient step Sigma_k + (2 / N_k) Sigma_k dQ/dSigma_k Sigma_k equals S_k / N_k,
    the scatter about the old mean; moving it to the new mean (subtracting
    delta delta^T, delta = mu_new - mu_old) gives the exact maximizer.

Each iteration is therefore an exact EM step, so the log-likelihood never decreases; the
script asserts it. EM starts from a k-means clustering; started from the same point,
scikit-learn's GaussianMixture runs the same algorithm with its closed-form M-step, and
the script compares the final log-likelihood and the matched means.

Run::

    python examples/em_gmm.py [--components K] [--max-iter N] [--tol T] [--seed S]
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings

import numpy as np
from _data import iris

import fastgrad as fg
import fastgrad.numpy as fnp

LOG_2PI = float(np.log(2 * np.pi))

# ---------------------------------------------------------------- the model


def log_joint(params, x):
    """log pi_k + log N(x_i | mu_k, Sigma_k) for every point i and component k: (n, K)."""
    d = x[:, None, :] - params["means"][None, :, :]  # (n, K, 2)
    d0, d1 = d[:, :, 0], d[:, :, 1]
    cov = params["covs"]  # (K, 2, 2), each [[a, b], [c, e]]
    a, b, c, e = cov[:, 0, 0], cov[:, 0, 1], cov[:, 1, 0], cov[:, 1, 1]
    det = a * e - b * c
    # d^T Sigma^-1 d with Sigma^-1 = [[e, -b], [-c, a]] / det. All four entries are used, so
    # the gradient with respect to the covariance array is the usual matrix gradient.
    mahalanobis = (e * d0 * d0 - (b + c) * d0 * d1 + a * d1 * d1) / det
    log_normal = -LOG_2PI - 0.5 * fnp.log(det) - 0.5 * mahalanobis
    return fnp.log(params["weights"]) + log_normal


def expected_complete_loglik(params, x):
    """Q(theta) with the responsibilities held fixed; the log-likelihood per sample as aux."""
    lj = log_joint(params, x)
    resp = fg.stop_gradient(fnp.softmax(lj, axis=1), name="responsibilities")
    loglik = fnp.mean(fnp.logsumexp(lj, axis=1))
    return fnp.sum(resp * lj), loglik


def mean_loglik(params, x):
    return fnp.mean(fnp.logsumexp(log_joint(params, x), axis=1))


def entropy_regularized_loglik(params, x):
    """Q without the stop_gradient: sum_ik r_ik log p(x_i, k) = l(theta) - entropy(r)."""
    lj = log_joint(params, x)
    return fnp.sum(fnp.softmax(lj, axis=1) * lj)


@fg.jit
def em_step(params, x):
    """One EM iteration: returns the log-likelihood per sample at `params` and the new ones."""
    (_, loglik), g = fg.value_and_grad(expected_complete_loglik, has_aux=True)(params, x)
    weights, means, covs = params["weights"], params["means"], params["covs"]
    counts = weights * g["weights"]  # N_k
    new_weights = counts / x.shape[0]
    # Newton step on the means: the Hessian of Q in mu_k is -N_k Sigma_k^-1.
    delta = (covs @ g["means"][:, :, None])[:, :, 0] / counts[:, None]
    new_means = means + delta
    # Natural-gradient step on the covariances (gives S_k / N_k about the old means), then
    # the shift of the scatter matrix to the new means.
    scatter = covs + 2.0 * (covs @ g["covs"] @ covs) / counts[:, None, None]
    new_covs = scatter - delta[:, :, None] * delta[:, None, :]
    new_covs = 0.5 * (new_covs + fnp.transpose(new_covs, (0, 2, 1)))  # rounding asymmetry
    return loglik, {"weights": new_weights, "means": new_means, "covs": new_covs}


# ---------------------------------------------------------------- data and reference


def iris_2d() -> tuple[np.ndarray, np.ndarray]:
    """Iris projected on its first two principal components (centered, in cm)."""
    x, species = iris()
    x = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return x @ vt[:2].T, species


def initial_params(x: np.ndarray, k: int, seed: int) -> dict:
    """Start from a k-means clustering (as scikit-learn does by default): each cluster's
    fraction of the points, mean and covariance."""
    from sklearn.cluster import KMeans

    labels = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(x)
    return {
        "weights": np.bincount(labels, minlength=k) / len(x),
        "means": np.stack([x[labels == j].mean(axis=0) for j in range(k)]),
        "covs": np.stack([np.cov(x[labels == j], rowvar=False, bias=True) for j in range(k)]),
    }


def sklearn_fit(x: np.ndarray, init: dict, max_iter: int, tol: float):
    """scikit-learn's EM from the same starting point, without covariance regularization."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    gm = GaussianMixture(
        n_components=len(init["weights"]),
        covariance_type="full",
        weights_init=init["weights"],
        means_init=init["means"],
        precisions_init=np.linalg.inv(init["covs"]),
        reg_covar=0.0,
        tol=tol,
        max_iter=max_iter,
    )
    # Whether it converged is reported (gm.converged_), not warned about.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm.fit(x)
    return gm


def match_means(ours: np.ndarray, theirs: np.ndarray) -> tuple[tuple[int, ...], float]:
    """The permutation of `theirs` closest to `ours`, and the largest distance it leaves."""
    best = min(
        itertools.permutations(range(len(ours))),
        key=lambda p: np.abs(ours - theirs[list(p)]).max(),
    )
    return best, float(np.abs(ours - theirs[list(best)]).max())


# ---------------------------------------------------------------- the program


def run(
    components: int = 3,
    max_iter: int = 300,
    tol: float = 1e-9,
    seed: int = 1,
    verbose: bool = True,
) -> dict:
    """Fit by EM, check monotonicity, compare with scikit-learn; return the figures printed."""
    say = print if verbose else (lambda *a, **k: None)
    x, species = iris_2d()
    params = initial_params(x, components, seed)
    init = {k: v.copy() for k, v in params.items()}

    # Fisher's identity: with the stop_gradient, grad Q = grad l at the current parameters.
    grad_q = fg.grad(lambda p: expected_complete_loglik(p, x)[0])(params)
    grad_l = fg.grad(lambda p: mean_loglik(p, x) * len(x))(params)
    grad_no_stop = fg.grad(entropy_regularized_loglik)(params, x)
    fisher_gap = max(float(np.abs(grad_q[k] - grad_l[k]).max()) for k in grad_l)
    no_stop_gap = max(float(np.abs(grad_no_stop[k] - grad_l[k]).max()) for k in grad_l)
    say(f"{components}-component Gaussian mixture on iris (2 principal components, n={len(x)})")
    say(
        f"at the start, max |grad Q - grad loglik|: {fisher_gap:.1e} with stop_gradient, "
        f"{no_stop_gap:.1e} without"
    )

    history = []
    say("  iter  loglik/sample      increase")
    for it in range(max_iter):
        loglik, params = em_step(params, x)
        if not np.isfinite(loglik):
            # The likelihood of a mixture is unbounded: a component can shrink onto a few
            # points. EM from a k-means start does not do that on these data.
            raise FloatingPointError(f"a component collapsed at iteration {it}; try --seed")
        history.append(float(loglik))
        if it == 0:
            say(f"  {it:4d}  {history[-1]:13.9f}")
            continue
        increase = history[-1] - history[-2]
        say(f"  {it:4d}  {history[-1]:13.9f}  {increase:12.3e}")
        if increase < tol:
            break
    history.append(float(mean_loglik(params, x)))
    say(f"  {len(history) - 1:4d}  {history[-1]:13.9f}  {history[-1] - history[-2]:12.3e}")
    steps = np.diff(history)
    # Exact EM steps never decrease the likelihood; allow only rounding.
    assert steps.min() >= -1e-10, f"log-likelihood decreased by {-steps.min():.3e}"
    say(f"log-likelihood never decreased (smallest step {steps.min():+.1e})")

    # The same iteration budget: if ours stops early, so may scikit-learn's (it says so in
    # `converged`), and the two are still compared after the same number of EM steps.
    gm = sklearn_fit(x, init, max_iter=max_iter, tol=tol)
    sk_loglik = float(gm.score(x))
    perm, means_gap = match_means(params["means"], gm.means_)
    cov_gap = float(np.abs(params["covs"] - gm.covariances_[list(perm)]).max())
    weights_gap = float(np.abs(params["weights"] - gm.weights_[list(perm)]).max())
    say(
        f"scikit-learn GaussianMixture from the same start: loglik/sample {sk_loglik:.9f} "
        f"({gm.n_iter_} iterations, converged={gm.converged_})"
    )
    say(f"  fastgrad EM:                                   loglik/sample {history[-1]:.9f}")
    say(
        f"  matched components: max |means diff| {means_gap:.1e}, |covariances diff| "
        f"{cov_gap:.1e}, |weights diff| {weights_gap:.1e}"
    )
    for k in range(components):
        say(
            f"  component {k}: weight {params['weights'][k]:.3f}, mean "
            f"{np.array2string(params['means'][k], precision=3)}"
        )

    # How the clusters line up with the species (not used in fitting).
    from sklearn.metrics import adjusted_rand_score

    clusters = np.argmax(log_joint(params, x), axis=1)
    ari = float(adjusted_rand_score(species, clusters))
    say(f"agreement of the clusters with the species: adjusted Rand index {ari:.3f}")
    return {
        "loglik_history": history,
        "iterations": len(history) - 1,
        "final_loglik": history[-1],
        "sklearn_loglik": sk_loglik,
        "sklearn_converged": bool(gm.converged_),
        "means_gap": means_gap,
        "covariances_gap": cov_gap,
        "weights_gap": weights_gap,
        "fisher_gap": fisher_gap,
        "no_stop_gradient_gap": no_stop_gap,
        "adjusted_rand_index": ari,
        "params": params,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--components", type=int, default=3)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--tol", type=float, default=1e-9, help="stop when the gain is below")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(components=args.components, max_iter=args.max_iter, tol=args.tol, seed=args.seed)
    print(f"done in {time.perf_counter() - start:.1f} s")
    return result


if __name__ == "__main__":
    main()
