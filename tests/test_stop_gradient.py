"""stop_gradient: identity forward, no cotangent back, and nothing built that only it needed.

The seed use-cases are checked against gradients worked out by hand: a numerically stable
softmax, an EM M-step, a contrastive-divergence step, and an FGSM adversarial step.
"""

import numpy as np

import fastgrad as fg
import fastgrad.numpy as fnp

rng = np.random.default_rng(2)


def op_names(graph):
    return [n.op.name for n in graph.nodes]


def stable_log_softmax_loss(x):
    z = x - fg.stop_gradient(fnp.max(x, axis=1, keepdims=True), name="row max")
    return fnp.sum(z[:, 0] - fnp.log(fnp.sum(fnp.exp(z), axis=1)))


def naive_log_softmax_loss(x):
    return fnp.sum(fnp.log(fnp.exp(x[:, 0]) / fnp.sum(fnp.exp(x), axis=1)))


def test_stable_softmax_matches_naive_where_finite():
    x = rng.standard_normal((4, 5))
    np.testing.assert_allclose(
        fg.grad(stable_log_softmax_loss)(x), fg.grad(naive_log_softmax_loss)(x), rtol=1e-12
    )
    big = (x * 300).astype(np.float32)
    with np.errstate(all="ignore"):
        assert not np.all(np.isfinite(fg.grad(naive_log_softmax_loss)(big)))
    g = fg.jit(fg.grad(stable_log_softmax_loss))(big)
    assert g.dtype == np.float32 and np.all(np.isfinite(g))


def test_backward_graph_has_nothing_for_the_stopped_max():
    x = rng.standard_normal((4, 5))
    graph = fg.make_graph(fg.grad(stable_log_softmax_loss))(x)
    names = op_names(graph)
    # The max's VJP would compare x with the max ("equal") and count ties; the max itself
    # stays, since the forward values the backward pass needs depend on it.
    assert "equal" not in names
    assert names.count("max") == 1
    text = str(fg.make_graph(stable_log_softmax_loss)(x))
    assert "stop_gradient(a, name='row max')" in text


def test_straight_through_is_not_simplified_away():
    x = np.array([0.2, 1.7, -0.6])
    st = lambda x: x + fg.stop_gradient(fnp.rint(x) - x)  # noqa: E731
    np.testing.assert_array_equal(fg.jit(st)(x), np.rint(x))
    np.testing.assert_array_equal(fg.grad(lambda x: fnp.sum(st(x) * 3.0))(x), [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(fg.jit(lambda x: x - fg.stop_gradient(x))(x), [0, 0, 0])
    np.testing.assert_array_equal(fg.grad(lambda x: fnp.sum(x - fg.stop_gradient(x)))(x), [1, 1, 1])
    assert "stop_gradient" in op_names(fg.make_graph(lambda x: x - fg.stop_gradient(x))(x))


def test_pytrees_ints_and_plain_arrays():
    x = rng.standard_normal(3)
    assert fg.stop_gradient(x) is x
    labels = np.arange(3)

    def f(x, labels):
        tree = fg.stop_gradient({"x": x * x, "labels": labels, "pair": (x, 2.0)})
        assert tree["labels"] is labels or tree["labels"].dtype == np.int64
        return fnp.sum(tree["x"] * x + tree["pair"][0] * tree["pair"][1]) + fnp.sum(x)

    np.testing.assert_allclose(fg.grad(f)(x, labels), x * x + 1)
    np.testing.assert_allclose(fg.jit(fg.grad(f))(x, labels), x * x + 1)


def test_em_m_step_does_not_backprop_through_responsibilities():
    # Gaussian mixture with unit variances and equal weights; Q(mu) = sum_ik r_ik log N(x_i|mu_k)
    # with r fixed: dQ/dmu_k = sum_i r_ik (x_i - mu_k).
    x = rng.standard_normal(20)
    mu = np.array([-1.0, 0.5, 2.0])

    def q(mu):
        log_joint = -0.5 * (x[:, None] - mu[None, :]) ** 2
        r = fg.stop_gradient(fnp.softmax(log_joint, axis=1))
        return fnp.sum(r * log_joint)

    logj = -0.5 * (x[:, None] - mu) ** 2
    r = np.exp(logj) / np.exp(logj).sum(1, keepdims=True)
    expected = (r * (x[:, None] - mu)).sum(0)
    np.testing.assert_allclose(fg.grad(q)(mu), expected, rtol=1e-12)
    np.testing.assert_allclose(fg.jit(fg.grad(q))(mu), expected, rtol=1e-12)


def test_contrastive_divergence_does_not_backprop_through_the_sampler():
    # RBM free energy F(v) = -v.b - sum_j softplus(c_j + (v W)_j); dF/dW = -v^T sigmoid(c + vW).
    v_data = (rng.random((5, 4)) > 0.5).astype(np.float64)
    w, b, c = rng.standard_normal((4, 3)) * 0.5, np.zeros(4), np.zeros(3)

    def free_energy(v, w):
        return -(v @ b) - fnp.sum(fnp.softplus(c + v @ w), axis=1)

    def cd_loss(w):
        h = fnp.sigmoid(c + v_data @ w)
        v_model = fg.stop_gradient(fnp.sigmoid(b + h @ w.T))  # a mean-field "sample"
        return fnp.mean(free_energy(v_data, w)) - fnp.mean(free_energy(v_model, w))

    h = 1 / (1 + np.exp(-(c + v_data @ w)))
    v_model = 1 / (1 + np.exp(-(b + h @ w.T)))
    sig = lambda v: 1 / (1 + np.exp(-(c + v @ w)))  # noqa: E731
    expected = -(v_data.T @ sig(v_data)) / 5 + (v_model.T @ sig(v_model)) / 5
    np.testing.assert_allclose(fg.grad(cd_loss)(w), expected, rtol=1e-10)
    graph = fg.make_graph(fg.grad(cd_loss))(w)
    assert "sigmoid" in op_names(graph)  # the forward sampler stays; its VJP is not built


def test_fgsm_perturbation_is_a_constant_for_training():
    # Logistic loss l(w, x) = softplus(-y w.x); with x_adv = x + eps * stop_gradient(d),
    # dl/dw = -y sigmoid(-y w.x_adv) x_adv.
    x, y, eps = rng.standard_normal(4), 1.0, 0.1
    w = rng.standard_normal(4)

    def loss(w, x):
        return fnp.softplus(-y * fnp.sum(w * x))

    def adversarial_loss(w, stop=True):
        direction = fnp.tanh(fg.grad(loss, argnums=1)(w, x) * 10)
        if stop:
            direction = fg.stop_gradient(direction)
        return loss(w, x + eps * direction)

    gx = -y * w / (1 + np.exp(y * w @ x))
    x_adv = x + eps * np.tanh(gx * 10)
    expected = -y * x_adv / (1 + np.exp(y * w @ x_adv))
    np.testing.assert_allclose(fg.grad(adversarial_loss)(w), expected, rtol=1e-10)
    np.testing.assert_allclose(fg.jit(fg.grad(adversarial_loss))(w), expected, rtol=1e-10)
    through_attack = fg.grad(lambda w: adversarial_loss(w, stop=False))(w)
    assert not np.allclose(through_attack, expected)
