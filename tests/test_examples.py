"""The programs in examples/ run, small, and learn.

Each example is imported from its file (examples/ is not a package) and its `run` called
with small sizes; the assertions are the claims the example prints: the stable softmax is
finite where the naive one is nan and equal where both are finite, EM never decreases the
log-likelihood and agrees with scikit-learn, contrastive divergence lowers the
reconstruction error, adversarial training raises the accuracy under attack. The Dask
examples run on the two-worker LocalCluster of conftest.py: L-BFGS on the cluster agrees
with one process and with scikit-learn, gradient descent descends, and the large logistic
regression learns and plots its loss curve.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp

pytest.importorskip("sklearn")  # the data sets; matplotlib only for the RBM's PNG

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@functools.cache
def load(name: str):
    """Import examples/<name>.py (with examples/ on sys.path for its `_data` helper)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


# ---------------------------------------------------------------- stable softmax


def test_stable_softmax_trains_and_stays_finite():
    ex = load("stable_softmax")
    r = ex.run(epochs=3, subset=400, verbose=False)
    assert r["losses"][-1] < 0.75 * r["losses"][0]
    assert r["test_accuracy"] > 0.6  # chance is 0.1
    # Where both are finite the gradients agree, to rounding in each precision.
    assert r["gradient_agreement"]["float64"] < 1e-12
    assert r["gradient_agreement"]["float32"] < 1e-5
    probes = {p["scale"]: p for p in r["large_logits"]}
    assert probes[1.0]["naive_finite"] and probes[1.0]["grad_rel_diff"] < 1e-5
    for s in (100.0, 1000.0):
        assert probes[s]["max_logit"] > 89  # exp overflows float32 beyond ~88.7
        assert not probes[s]["naive_finite"] and np.isnan(probes[s]["naive_loss"])
        assert probes[s]["stable_finite"] and probes[s]["stable_dtype"] == "float32"
        assert probes[s]["stable_rel_err"] < 1e-5


def test_stable_and_naive_cross_entropy_directly():
    ex = load("stable_softmax")
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((6, 10)), rng.integers(0, 10, 6)
    grad_stable = fg.grad(ex.stable_cross_entropy)(logits, labels)
    grad_naive = fg.grad(ex.naive_cross_entropy)(logits, labels)
    np.testing.assert_allclose(grad_stable, grad_naive, rtol=1e-12, atol=1e-15)
    # The gradient of the mean cross-entropy is (softmax - onehot) / n.
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(6), labels] -= 1
    np.testing.assert_allclose(grad_stable, p / 6, rtol=1e-12, atol=1e-15)

    big = (logits * 300).astype(np.float32)
    with np.errstate(all="ignore"):
        assert np.isnan(fg.grad(ex.naive_cross_entropy)(big, labels)).any()
    g = fg.jit(fg.grad(ex.stable_cross_entropy))(big, labels)
    assert g.dtype == np.float32 and np.isfinite(g).all()


# ---------------------------------------------------------------- EM


def test_em_is_monotone_and_matches_sklearn():
    ex = load("em_gmm")
    r = ex.run(verbose=False)
    steps = np.diff(r["loglik_history"])
    assert steps.min() >= -1e-10
    assert r["loglik_history"][-1] > r["loglik_history"][0] + 0.05  # it did climb
    assert r["sklearn_converged"]
    assert abs(r["final_loglik"] - r["sklearn_loglik"]) < 1e-6
    assert r["means_gap"] < 1e-5 and r["covariances_gap"] < 1e-5 and r["weights_gap"] < 1e-6
    # Fisher's identity holds only with the responsibilities stop_gradient'ed.
    assert r["fisher_gap"] < 1e-8 and r["no_stop_gradient_gap"] > 1.0
    assert r["adjusted_rand_index"] > 0.7  # the clusters are close to the species


def test_em_step_is_the_closed_form_m_step():
    ex = load("em_gmm")
    x, _ = ex.iris_2d()
    params = ex.initial_params(x, 3, seed=0)
    loglik, new = ex.em_step(params, x)

    # The textbook E- and M-steps, written out in NumPy.
    w, mu, cov = params["weights"], params["means"], params["covs"]
    log_p = np.stack(
        [
            np.log(w[k])
            - np.log(2 * np.pi)
            - 0.5 * np.log(np.linalg.det(cov[k]))
            - 0.5 * np.einsum("ni,ij,nj->n", x - mu[k], np.linalg.inv(cov[k]), x - mu[k])
            for k in range(3)
        ],
        axis=1,
    )
    top = log_p.max(1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(log_p - top).sum(1))
    r = np.exp(log_p - log_norm[:, None])
    counts = r.sum(0)
    means = (r.T @ x) / counts[:, None]
    covs = np.stack([((x - means[k]).T * r[:, k]) @ (x - means[k]) / counts[k] for k in range(3)])
    np.testing.assert_allclose(loglik, log_norm.mean(), rtol=1e-12)
    np.testing.assert_allclose(new["weights"], counts / len(x), rtol=1e-10)
    np.testing.assert_allclose(new["means"], means, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(new["covs"], covs, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- contrastive divergence


def test_rbm_reconstruction_error_falls(tmp_path):
    pytest.importorskip("matplotlib")
    ex = load("rbm_cd")
    out = tmp_path / "filters.png"
    r = ex.run(output=str(out), hidden=32, epochs=6, subset=800, batch_size=10, verbose=False)
    train, test = r["train_reconstruction_error"], r["test_reconstruction_error"]
    assert train[-1] < 0.6 * train[0]
    assert test[-1] < 0.6 * test[0]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cd_gradient_treats_the_samples_as_constants():
    ex = load("rbm_cd")
    rng = np.random.default_rng(0)
    n, n_vis, n_hid = 5, 6, 4
    params = {
        "w": rng.standard_normal((n_vis, n_hid)),
        "b": rng.standard_normal(n_vis),
        "c": rng.standard_normal(n_hid),
    }
    v = (rng.random((n, n_vis)) < 0.5).astype(np.float64)
    noise = ((rng.random((n, n_hid)), rng.random((n, n_vis))),)
    grads = fg.grad(ex.cd_loss)(params, v, noise)

    # dF/dW = -v^T p(h|v): the CD gradient is the data term minus the model term, with the
    # chain's output (fnp works on plain arrays too) as a constant.
    v_model = ex.gibbs_chain(params, v, noise)
    expected_w = (
        -v.T @ ex.hidden_probs(params, v) + v_model.T @ ex.hidden_probs(params, v_model)
    ) / n
    np.testing.assert_allclose(grads["w"], expected_w, rtol=1e-10)

    def loss_through_sampler(params):
        v_model = ex.gibbs_chain(params, v, noise)
        return fnp.mean(ex.free_energy(params, v)) - fnp.mean(ex.free_energy(params, v_model))

    assert not np.allclose(fg.grad(loss_through_sampler)(params)["w"], expected_w)


# ---------------------------------------------------------------- adversarial training


def test_adversarial_training_raises_fgsm_accuracy():
    ex = load("adversarial")
    r = ex.run(hidden=32, epochs=8, adv_epochs=8, subset=600, verbose=False)
    assert r["losses"][-1] < 0.5 * r["losses"][0]
    assert r["clean_accuracy_before"] > 0.8
    assert r["fgsm_accuracy_before"] < r["clean_accuracy_before"] - 0.2
    assert r["fgsm_accuracy_after"] > r["fgsm_accuracy_before"] + 0.05
    assert r["clean_accuracy_after"] > 0.8

    # The FGSM images raise the loss, stay in [0, 1] and within eps of the originals.
    x, labels = ex.digits(600).x_test, ex.digits(600).y_test
    x_adv = ex.fgsm_jit(r["params"], x, labels, np.float32(0.1))
    assert ex.loss(r["params"], x_adv, labels) > ex.loss(r["params"], x, labels)
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    assert np.abs(x_adv - x).max() <= np.float32(0.1) + 1e-6


# ---------------------------------------------------------------- Dask


def test_dask_optimizers_agree_with_one_process_and_sklearn(dask_client):
    ex = load("dask_optimizers")
    r = ex.run(
        rows=3000, features=4, chunk_rows=700, gd_steps=40, client=dask_client, verbose=False
    )
    assert r["lbfgs_vs_one_process"] < 1e-8
    assert r["lbfgs_vs_sklearn"] < 1e-4
    losses = r["gd_losses"]
    assert all(b <= a for a, b in zip(losses, losses[1:], strict=False))  # descent
    assert 0 <= r["gd_gap"] < 1e-3


def test_dask_logistic_learns_and_plots(dask_client, tmp_path):
    pytest.importorskip("matplotlib")
    ex = load("dask_logistic")
    out = tmp_path / "loss.png"
    r = ex.run(
        output=str(out),
        rows=20_000,
        features=5,
        chunk_rows=3000,
        iterations=15,
        client=dask_client,
        verbose=False,
    )
    assert r["losses"][-1] < 0.8 * r["losses"][0]
    assert all(b <= a + 1e-12 for a, b in zip(r["losses"], r["losses"][1:], strict=False))
    assert r["true_weights_accuracy"] > 0.7  # the labels follow the generating weights
    assert r["test_accuracy"] > r["true_weights_accuracy"] - 0.02
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- the command lines


@pytest.mark.parametrize(
    "name, argv, expected",
    [
        ("stable_softmax", ["--epochs", "1", "--subset", "200"], "naive vs stable"),
        ("em_gmm", ["--max-iter", "3"], "never decreased"),
        ("rbm_cd", ["--epochs", "1", "--subset", "100", "--hidden", "4"], "filters written"),
        ("adversarial", ["--epochs", "1", "--adv-epochs", "1", "--subset", "200"], "FGSM"),
    ],
)
def test_command_lines(name, argv, expected, tmp_path, capsys):
    if name == "rbm_cd":
        pytest.importorskip("matplotlib")
        argv = [str(tmp_path / "f.png"), *argv]
    result = load(name).main(argv)
    assert isinstance(result, dict)
    out = capsys.readouterr().out
    assert expected in out and "done in" in out
