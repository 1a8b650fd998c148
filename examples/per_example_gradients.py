"""Per-example gradient norms of an MLP on the 8x8 digits, with `fg.vmap(fg.grad(...))`.
=====================================================================================

The gradient of one example's loss, for every example of a data set, is what
differentially private training clips, what data-valuation and outlier scores read, and
what a Python loop over the examples computes slowly. Here

    norms = fg.jit(fg.vmap(grad_norm, in_axes=(None, 0, 0)))(params, x, labels)

traces the gradient of one example's loss once, batches that graph over the examples
(the weights shared, a product with them one matrix multiplication for the whole batch,
the per-example weight gradients one fused loop), and compiles it. The script trains the
MLP briefly, then computes the norms both ways: vmapped, and a loop calling the jitted
per-example gradient once per image. They agree, their mean gradient equals the gradient
of the mean loss, and misclassified images have the largest gradients.

Run::

    python examples/per_example_gradients.py [--hidden N] [--epochs N] [--repeat R]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _data import accuracy, digits, minibatches

import fastgrad as fg
import fastgrad.numpy as fnp


def logits_of(params, x):
    hidden = fnp.tanh(x @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def example_loss(params, x, label):
    """Cross-entropy of one image `x` (64 pixels) with its `label`."""
    return -fnp.log_softmax(logits_of(params, x))[label]


def batch_loss(params, x, labels):
    log_probs = fnp.log_softmax(logits_of(params, x), axis=1)
    return -fnp.mean(log_probs[np.arange(labels.shape[0]), labels])


def grad_norm(params, x, label):
    """The norm of one example's gradient over all the parameters."""
    grads = fg.grad(example_loss)(params, x, label)
    return fnp.sqrt(sum(fnp.sum(g * g) for g in grads.values()))


# The batched forms, and the per-example function a Python loop would call.
per_example_norms = fg.jit(fg.vmap(grad_norm, in_axes=(None, 0, 0)))
per_example_grads = fg.jit(fg.vmap(fg.grad(example_loss), in_axes=(None, 0, 0)))
one_norm = fg.jit(grad_norm)
mean_grad = fg.jit(fg.grad(batch_loss))
logits_jit = fg.jit(logits_of)


@fg.jit
def train_step(params, x, labels, learning_rate):
    value, grads = fg.value_and_grad(batch_loss)(params, x, labels)
    return value, {k: params[k] - learning_rate * grads[k] for k in params}


def _median_time(fun, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fun()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def run(
    hidden: int = 64,
    epochs: int = 5,
    subset: int | None = None,
    repeat: int = 5,
    seed: int = 0,
    verbose: bool = True,
) -> dict:
    """Train briefly, compute per-example gradient norms vmapped and in a loop; return the
    figures printed."""
    say = print if verbose else (lambda *a, **k: None)
    rng = np.random.default_rng(seed)
    data = digits(subset, seed=seed)
    x, labels = data.x_train, data.y_train
    n_in = x.shape[1]
    params = {
        "w1": (rng.normal(size=(n_in, hidden)) / np.sqrt(n_in)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.normal(size=(hidden, 10)) / np.sqrt(hidden)).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }
    # Every function is compiled before it runs (fg.warmup), so that no kernel compiles
    # in the background while the timed runs below share the cores.
    batch = min(50, len(labels))
    fg.warmup(train_step, params, x[:batch], labels[:batch], np.float32(0.5))
    fg.warmup(logits_jit, params, x)
    for _ in range(epochs):
        for idx in minibatches(len(labels), batch, rng):
            _, params = train_step(params, x[idx], labels[idx], np.float32(0.5))
    say(
        f"MLP {n_in}-{hidden}-10 after {epochs} epochs: train accuracy "
        f"{accuracy(logits_jit(params, x), labels):.3f} on {len(labels)} images"
    )

    fg.warmup(per_example_norms, params, x, labels)
    fg.warmup(one_norm, params, x[0], labels[0])
    t_vmap = _median_time(lambda: per_example_norms(params, x, labels), repeat)
    t_loop = _median_time(
        lambda: [one_norm(params, xi, yi) for xi, yi in zip(x, labels, strict=True)],
        max(1, repeat // 2),
    )
    vmapped = per_example_norms(params, x, labels)
    looped = np.array([one_norm(params, xi, yi) for xi, yi in zip(x, labels, strict=True)])
    difference = float(np.max(np.abs(vmapped - looped) / np.maximum(looped, 1e-6)))
    grads = fg.warmup(per_example_grads, params, x, labels)(params, x, labels)
    mean_difference = max(
        float(np.max(np.abs(grads[k].mean(axis=0) - g)))
        for k, g in fg.warmup(mean_grad, params, x, labels)(params, x, labels).items()
    )
    wrong = np.argmax(logits_jit(params, x), axis=1) != labels
    say(
        f"per-example gradient norms of {len(labels)} images: vmap {t_vmap * 1e3:.1f} ms, "
        f"Python loop {t_loop * 1e3:.1f} ms ({t_loop / t_vmap:.0f}x faster vmapped)"
    )
    say(
        f"largest relative difference, vmap vs loop: {difference:.1e}; mean of the "
        f"per-example gradients vs the batch gradient: {mean_difference:.1e}"
    )
    if wrong.any():
        say(
            f"median gradient norm: misclassified images {np.median(vmapped[wrong]):.3f}, "
            f"the others {np.median(vmapped[~wrong]):.3f}"
        )
    return {
        "norms": vmapped,
        "loop_norms": looped,
        "relative_difference": difference,
        "mean_difference": mean_difference,
        "seconds_vmap": t_vmap,
        "seconds_loop": t_loop,
        "misclassified": wrong,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5, help="training epochs first")
    parser.add_argument("--subset", type=int, default=None, help="use only N digits")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (median)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(args.hidden, args.epochs, args.subset, args.repeat, args.seed)
    print(f"done in {time.perf_counter() - start:.1f} s")
    return result


if __name__ == "__main__":
    main()
