"""A numerically stable softmax: softmax regression on the 8x8 digits.
===================================================================

The cross-entropy needs log(softmax(z)). Written naively, exp(z) overflows as soon as a
logit passes ~88.7 in float32 (~709 in float64) and the loss and every gradient become
nan. Subtracting the row maximum first fixes that, and does not change the result; so no
gradient has to flow through the maximum, and `fg.stop_gradient` says so (the backward
pass then contains nothing for the max).

The script

  1. trains a softmax regression (64 pixels -> 10 classes, float32) with the stable loss,
     one jitted `value_and_grad` step per minibatch, and reports loss and accuracy;
  2. compares the stable and the naive gradients at the trained weights, in float64 and
     float32, where both are finite: they agree to rounding;
  3. multiplies the trained weights by growing factors (logits grow the same way, as they
     do when a classifier becomes very confident) and evaluates both losses in float32:
     while the naive one stays finite the gradients agree, then it turns into nan; the
     stable one stays finite and agrees with a float64 evaluation.

Run::

    python examples/stable_softmax.py [--epochs N] [--subset N] [--batch-size N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _data import accuracy, digits, minibatches

import fastgrad as fg
import fastgrad.numpy as fnp

# ---------------------------------------------------------------- the two cross-entropies


def stable_cross_entropy(logits, labels):
    """Mean cross-entropy, shifted by the row maximum so exp() cannot overflow."""
    shift = fg.stop_gradient(fnp.max(logits, axis=1, keepdims=True), name="row max")
    z = logits - shift
    log_probs = z - fnp.log(fnp.sum(fnp.exp(z), axis=1, keepdims=True))
    return -fnp.mean(log_probs[np.arange(labels.shape[0]), labels])


def naive_cross_entropy(logits, labels):
    """The textbook formula -log(exp(z_y) / sum_j exp(z_j)): overflows for large logits."""
    e = fnp.exp(logits)
    probs = e / fnp.sum(e, axis=1, keepdims=True)
    return -fnp.mean(fnp.log(probs[np.arange(labels.shape[0]), labels]))


def logits_of(params, x):
    return x @ params["w"] + params["b"]


def stable_loss(params, x, labels):
    return stable_cross_entropy(logits_of(params, x), labels)


def naive_loss(params, x, labels):
    return naive_cross_entropy(logits_of(params, x), labels)


# Traced once per input signature (shapes and dtypes), then reused.
stable_value_and_grad = fg.jit(fg.value_and_grad(stable_loss))
naive_value_and_grad = fg.jit(fg.value_and_grad(naive_loss))


@fg.jit
def train_step(params, x, labels, learning_rate):
    loss, grads = fg.value_and_grad(stable_loss)(params, x, labels)
    return loss, {k: params[k] - learning_rate * grads[k] for k in params}


# ---------------------------------------------------------------- helpers


def _max_rel_diff(a: dict, b: dict) -> float:
    """Largest |a - b| over all gradient entries, relative to the largest |a|."""
    scale = max(float(np.max(np.abs(a[k]))) for k in a)
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a) / scale


def _all_finite(value, grads: dict) -> bool:
    return bool(np.isfinite(value)) and all(bool(np.all(np.isfinite(g))) for g in grads.values())


def _cast(params: dict, dtype) -> dict:
    return {k: v.astype(dtype) for k, v in params.items()}


# ---------------------------------------------------------------- the program


def run(
    epochs: int = 30,
    subset: int | None = None,
    batch_size: int = 100,
    learning_rate: float = 0.5,
    scales: tuple[float, ...] = (1.0, 5.0, 10.0, 100.0, 1000.0),
    seed: int = 0,
    verbose: bool = True,
) -> dict:
    """Train, compare gradients, and probe large logits; return the figures printed."""
    say = print if verbose else (lambda *a, **k: None)
    rng = np.random.default_rng(seed)
    data = digits(subset, seed=seed)
    n_train = len(data.y_train)
    batch_size = min(batch_size, n_train)
    params = {
        "w": (0.01 * rng.standard_normal((64, 10))).astype(np.float32),
        "b": np.zeros(10, np.float32),
    }

    # 1. Training.
    say(f"softmax regression on {n_train} training / {len(data.y_test)} test digits")
    losses = [float(stable_value_and_grad(params, data.x_train, data.y_train)[0])]
    say(f"  epoch {0:3d}  train loss {losses[0]:.4f}")
    for epoch in range(1, epochs + 1):
        for idx in minibatches(n_train, batch_size, rng):
            _, params = train_step(params, data.x_train[idx], data.y_train[idx], learning_rate)
        losses.append(float(stable_value_and_grad(params, data.x_train, data.y_train)[0]))
        if epoch % max(1, epochs // 5) == 0 or epoch == epochs:
            say(f"  epoch {epoch:3d}  train loss {losses[-1]:.4f}")
    train_acc = accuracy(logits_of(params, data.x_train), data.y_train)
    test_acc = accuracy(logits_of(params, data.x_test), data.y_test)
    say(f"  accuracy: train {train_acc:.3f}, test {test_acc:.3f} (chance 0.1)")

    # 2. Where the naive formula is finite, both give the same gradients.
    agreement = {}
    for dtype in (np.float64, np.float32):
        p, x = _cast(params, dtype), data.x_train.astype(dtype)
        _, g_stable = stable_value_and_grad(p, x, data.y_train)
        _, g_naive = naive_value_and_grad(p, x, data.y_train)
        agreement[np.dtype(dtype).name] = _max_rel_diff(g_stable, g_naive)
    say(
        "gradients at the trained weights, stable vs naive, max relative difference: "
        + ", ".join(f"{k} {v:.1e}" for k, v in agreement.items())
    )

    # 3. Large logits in float32.
    say("weights scaled by s (float32): naive vs stable cross-entropy")
    say(
        f"  {'s':>6}  {'max logit':>10}  {'naive loss':>12}  {'grads finite':>12}  "
        f"{'stable loss':>12}  {'grads finite':>12}  {'vs float64':>10}  {'grad diff':>9}"
    )
    probes = []
    for s in scales:
        p32 = {"w": params["w"] * np.float32(s), "b": params["b"] * np.float32(s)}
        x32 = data.x_train
        max_logit = float(np.max(np.abs(logits_of(p32, x32))))
        # exp overflows in the naive formula; silence NumPy's warnings about it, since
        # showing the resulting nan is the point.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            naive_value, naive_grads = naive_value_and_grad(p32, x32, data.y_train)
        stable_value, stable_grads = stable_value_and_grad(p32, x32, data.y_train)
        reference, _ = stable_value_and_grad(
            _cast(p32, np.float64), x32.astype(np.float64), data.y_train
        )
        probe = {
            "scale": s,
            "max_logit": max_logit,
            "naive_loss": float(naive_value),
            "naive_finite": _all_finite(naive_value, naive_grads),
            "stable_loss": float(stable_value),
            "stable_finite": _all_finite(stable_value, stable_grads),
            "stable_dtype": str(stable_grads["w"].dtype),
            "stable_rel_err": abs(float(stable_value) - float(reference)) / abs(float(reference)),
            # Where both are finite, how far apart the two gradients are.
            "grad_rel_diff": (
                _max_rel_diff(stable_grads, naive_grads)
                if _all_finite(naive_value, naive_grads)
                else None
            ),
        }
        probes.append(probe)
        diff = probe["grad_rel_diff"]
        say(
            f"  {s:6g}  {max_logit:10.1f}  {probe['naive_loss']:12.5g}  "
            f"{str(probe['naive_finite']):>12}  {probe['stable_loss']:12.5g}  "
            f"{str(probe['stable_finite']):>12}  {probe['stable_rel_err']:10.1e}  "
            f"{'-' if diff is None else f'{diff:.1e}':>9}"
        )
    return {
        "losses": losses,
        "train_accuracy": train_acc,
        "test_accuracy": test_acc,
        "gradient_agreement": agreement,
        "large_logits": probes,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--subset", type=int, default=None, help="use only N digits")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(
        epochs=args.epochs,
        subset=args.subset,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
    )
    print(f"done in {time.perf_counter() - start:.1f} s")
    return result


if __name__ == "__main__":
    main()
