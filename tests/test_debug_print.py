"""`fg.debug.print`: runtime values at every call, in order, compiled or interpreted, under
jit, grad and jvp; kept by dead-code elimination and deduplication, and out of fusion's way."""

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp

X = np.array([1.0, 2.0, 3.0])


def model(x):
    fg.debug.print("x {}", x)
    y = fnp.sin(x) * 2.0
    fg.debug.print("unused {:.3f}", fnp.sum(fnp.exp(x)))  # feeds no output: still printed
    fg.debug.print("y {} and again {}", y, y)
    fg.debug.print("y {} and again {}", y, y)  # an identical print is not merged away
    return fnp.sum(y * y)


def expected(x):
    y = np.sin(x) * 2.0
    return [f"x {x}", f"unused {np.sum(np.exp(x)):.3f}", *[f"y {y} and again {y}"] * 2]


@pytest.mark.parametrize("fuse", [True, False])
def test_prints_at_every_call_in_order(capsys, fuse):
    f = fg.jit(model, fuse=fuse)
    for x in (X, X + 1, X):
        f(x)
        assert capsys.readouterr().out.splitlines() == expected(x)


@pytest.mark.parametrize("fuse", [True, False])
def test_prints_under_grad_and_jvp(capsys, fuse):
    g = fg.jit(fg.grad(model), fuse=fuse)(X)
    np.testing.assert_allclose(g, 8 * np.sin(X) * np.cos(X))
    assert capsys.readouterr().out.splitlines() == expected(X)  # the primal values, once
    fg.jvp(model, (X,), (np.ones(3),))
    assert capsys.readouterr().out.splitlines() == expected(X)
    fg.grad(model)(X + 1)  # not jitted: the same
    assert capsys.readouterr().out.splitlines() == expected(X + 1)


def test_eager_and_keyword_and_pytree_values(capsys):
    fg.debug.print("{a} {b[0]:.1f}", a=np.int64(3), b=(np.float32(2.5),))
    assert capsys.readouterr().out == "3 2.5\n"
    fg.jit(lambda p: fg.debug.print("w {w} n {n}", **p) or p["w"])({"w": X, "n": 2})
    assert capsys.readouterr().out == f"w {X} n 2\n"


def test_does_not_block_fusion():
    # The printed value is stored (it leaves the loop); everything still fuses into one loop.
    def f(x):
        y = fnp.tanh(x) * x
        fg.debug.print("{}", fnp.sum(y))
        return fnp.sum(fnp.exp(y))

    plain = fg.jit(lambda x: fnp.sum(fnp.exp(fnp.tanh(x) * x))).lower(X).explain()
    printed = fg.jit(f).lower(X).explain()
    assert plain.splitlines()[0] == "1 steps: 1 fused loop(s), 0 library call(s)"
    assert printed.splitlines()[0] == "2 steps: 1 fused loop(s), 1 library call(s)"


def test_bad_arguments():
    with pytest.raises(TypeError, match="value 0 is a str"):
        fg.jit(lambda x: fg.debug.print("{} {}", "loss", x) or x)(X)
    with pytest.raises(IndexError):
        fg.jit(lambda x: fg.debug.print("{} {}", x) or x)(X)  # fails while tracing


SPECIAL = np.array([0.5, np.inf, -np.inf, np.nan, -0.0])


@pytest.mark.parametrize("x", [SPECIAL, np.zeros((0, 2))], ids=["nonfinite", "size-0"])
def test_prints_special_values_and_changes_no_derivative(capsys, x):
    """Eager, traced and jitted (fused or not), at inf, nan, -0.0 and size 0: each call
    prints x once, and the values and derivatives of orders 1-2 are those without the
    print (test_special_points checks orders 1-3 in every mode against mpmath)."""

    def plain(x):
        return fnp.sum(fnp.sin(x) * x)

    def printed(x):
        fg.debug.print("x {}", x)
        return plain(x)

    hvp = lambda f: lambda x: fg.jvp(fg.grad(f), (x,), (np.ones_like(x),))[1]  # noqa: E731
    for wrap in (lambda f: f, fg.jit, lambda f: fg.jit(f, fuse=False)):
        for order in (lambda f: f, fg.grad, hvp):
            got, want = wrap(order(printed))(x), order(plain)(x)
            assert capsys.readouterr().out == f"x {x}\n"
            np.testing.assert_array_equal(got, want)
