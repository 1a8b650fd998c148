"""A recurrent network that reads each 8x8 digit one row at a time, written with `fg.scan`.
========================================================================================

The hidden state h (one row of `hidden` units per image) is updated once per image row,

    h_t = tanh(x_t @ Wx + h_{t-1} @ Wh + b),    t = 1 .. 8,

and the digit is read off the last state with a softmax layer. The loop is one
`fg.scan`: traced once, its body compiled once, and differentiated exactly (the backward
pass is a backward scan over the stacked hidden states). The script checks that against
the same loop unrolled in Python (gradients agree to rounding), shows how much smaller
the traced graph is, trains the network by SGD with momentum (gradients clipped to norm
1), and reports test accuracy.
`--pixels` reads the image one pixel at a time instead (64 steps of 1 input): the scan's
graph stays the same size while the unrolled one grows eightfold.

Run::

    python examples/rnn_digits.py [--hidden N] [--epochs N] [--pixels]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _data import accuracy, digits, minibatches

import fastgrad as fg
import fastgrad.numpy as fnp

# ---------------------------------------------------------------- the model


def sequences(x: np.ndarray, pixels: bool) -> np.ndarray:
    """Images (n, 64) as sequences, time first: (8, n, 8) by rows or (64, n, 1) by pixels."""
    steps = 64 if pixels else 8
    return np.ascontiguousarray(x.reshape(len(x), steps, -1).transpose(1, 0, 2))


def logits_of(params, xs):
    """Run the RNN over the sequence `xs` (steps, batch, inputs); classify its last state."""

    def step(h, x):
        return fnp.tanh(x @ params["wx"] + h @ params["wh"] + params["b"]), None

    h0 = fnp.zeros((xs.shape[1], params["wh"].shape[0]), dtype=xs.dtype)
    h, _ = fg.scan(step, h0, xs)
    return h @ params["wo"] + params["bo"]


def logits_unrolled(params, xs):
    """The same network with the loop unrolled in Python: one copy of the step per row."""
    h = fnp.zeros((xs.shape[1], params["wh"].shape[0]), dtype=xs.dtype)
    for t in range(xs.shape[0]):
        h = fnp.tanh(xs[t] @ params["wx"] + h @ params["wh"] + params["b"])
    return h @ params["wo"] + params["bo"]


def cross_entropy(logits, labels):
    log_probs = fnp.log_softmax(logits, axis=1)
    return -fnp.mean(log_probs[np.arange(labels.shape[0]), labels])


def loss(params, xs, labels):
    return cross_entropy(logits_of(params, xs), labels)


def loss_unrolled(params, xs, labels):
    return cross_entropy(logits_unrolled(params, xs), labels)


@fg.jit
def train_step(params, velocity, xs, labels, learning_rate, momentum):
    value, grads = fg.value_and_grad(loss)(params, xs, labels)
    # Gradients scaled down to norm at most 1: recurrent gradients can explode.
    norm = fnp.sqrt(sum(fnp.sum(g * g) for g in grads.values()))
    scale = 1.0 / fnp.maximum(norm, 1.0)
    velocity = {k: momentum * velocity[k] - learning_rate * scale * grads[k] for k in params}
    return value, {k: params[k] + velocity[k] for k in params}, velocity


logits_jit = fg.jit(logits_of)


def init_params(n_in: int, hidden: int, rng: np.random.Generator) -> dict:
    def normal(shape, fan_in):
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    return {
        "wx": normal((n_in, hidden), n_in),
        "wh": normal((hidden, hidden), hidden),
        "b": np.zeros(hidden, np.float32),
        "wo": normal((hidden, 10), hidden),
        "bo": np.zeros(10, np.float32),
    }


# ---------------------------------------------------------------- the program


def _graph_size(fun, params, xs, labels) -> int:
    return len(fg.make_graph(fg.value_and_grad(fun))(params, xs, labels).nodes)


def run(
    hidden: int = 64,
    epochs: int = 20,
    pixels: bool = False,
    subset: int | None = None,
    batch_size: int = 50,
    learning_rate: float = 0.05,
    momentum: float = 0.9,
    seed: int = 0,
    verbose: bool = True,
) -> dict:
    """Check the scan against the unrolled loop, train, and return the figures printed."""
    say = print if verbose else (lambda *a, **k: None)
    rng = np.random.default_rng(seed)
    data = digits(subset, seed=seed)
    train_xs, test_xs = sequences(data.x_train, pixels), sequences(data.x_test, pixels)
    steps, _, n_in = train_xs.shape
    params = init_params(n_in, hidden, rng)
    say(
        f"RNN with {hidden} hidden units reading {len(data.y_train)} training digits "
        f"{'pixel' if pixels else 'row'} by {'pixel' if pixels else 'row'} ({steps} steps of "
        f"{n_in} input{'s' if n_in > 1 else ''}), {len(data.y_test)} test digits"
    )

    # The scan and the unrolled loop are the same function: same value, same gradient.
    xs, labels = train_xs[:, :batch_size], data.y_train[:batch_size]
    value, grads = fg.value_and_grad(loss)(params, xs, labels)
    value_u, grads_u = fg.value_and_grad(loss_unrolled)(params, xs, labels)
    grad_diff = max(
        float(np.max(np.abs(grads[k] - grads_u[k])) / np.max(np.abs(grads_u[k]))) for k in grads
    )
    sizes = _graph_size(loss, params, xs, labels), _graph_size(loss_unrolled, params, xs, labels)
    say(
        f"scan vs unrolled loop: loss {value:.6f} vs {value_u:.6f}, largest relative "
        f"gradient difference {grad_diff:.1e}"
    )
    say(f"value_and_grad graph: {sizes[0]} nodes with scan, {sizes[1]} unrolled")

    velocity = {k: np.zeros_like(v) for k, v in params.items()}
    lr, mom = np.float32(learning_rate), np.float32(momentum)
    losses = []
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        batch_losses = []
        for idx in minibatches(len(data.y_train), batch_size, rng):
            step_loss, params, velocity = train_step(
                params, velocity, train_xs[:, idx], data.y_train[idx], lr, mom
            )
            batch_losses.append(float(step_loss))
        losses.append(float(np.mean(batch_losses)))
        if epoch % max(1, epochs // 4) == 0 or epoch == epochs:
            say(f"  epoch {epoch:3d}  training loss {losses[-1]:.4f}")
    train_seconds = time.perf_counter() - start
    test_accuracy = accuracy(logits_jit(params, test_xs), data.y_test)
    say(f"test accuracy {test_accuracy:.3f} after {epochs} epochs ({train_seconds:.1f} s)")
    return {
        "losses": losses,
        "test_accuracy": test_accuracy,
        "gradient_difference": grad_diff,
        "loss_difference": abs(float(value) - float(value_u)),
        "graph_nodes": {"scan": sizes[0], "unrolled": sizes[1]},
        "params": params,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--pixels", action="store_true", help="read pixel by pixel (64 steps)")
    parser.add_argument("--subset", type=int, default=None, help="use only N digits")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(
        hidden=args.hidden,
        epochs=args.epochs,
        pixels=args.pixels,
        subset=args.subset,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        momentum=args.momentum,
        seed=args.seed,
    )
    print(f"done in {time.perf_counter() - start:.1f} s")
    return result


if __name__ == "__main__":
    main()
