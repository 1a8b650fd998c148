"""Every bad input named in the design gets a clear error that names what was wrong."""

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp

X = np.ones((3, 4))


def test_grad_of_non_scalar_output():
    with pytest.raises(TypeError, match=r"float scalar.*shape \(3, 4\).*fnp.sum"):
        fg.grad(lambda x: x * 2)(X)
    with pytest.raises(TypeError, match="has_aux=True"):
        fg.grad(lambda x: (fnp.sum(x), x))(X)


def test_grad_of_integer_argument():
    with pytest.raises(TypeError, match=r"argument labels.*dtype int64"):
        fg.grad(lambda x, labels: fnp.sum(x), argnums=1)(X, np.arange(3))
    with pytest.raises(TypeError, match=r"argument params\['n'\].*dtype bool"):
        fg.grad(lambda params: fnp.sum(params["w"]))({"w": X, "n": np.array(True)})


def test_broadcasting_mismatch_shows_both_shapes():
    with pytest.raises(ValueError, match=r"add: shapes \(3, 4\) and \(3,\) cannot be broadcast"):
        fg.jit(lambda x, y: x + y)(X, np.ones(3))
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5,\)"):
        fnp.multiply(X, np.ones(5))


def test_matmul_shape_mismatch():
    with pytest.raises(ValueError, match=r"matmul: shapes \(3, 4\) and \(3, 4\) do not align"):
        fg.jit(lambda a, b: a @ b)(X, X)
    with pytest.raises(ValueError, match="at least 1-D"):
        fnp.matmul(np.float64(2.0), X)


def test_bad_reshape():
    with pytest.raises(
        ValueError, match=r"cannot reshape an array of shape \(3, 4\) into shape \(5, -1\)"
    ):
        fg.jit(lambda x: x.reshape(5, -1))(X)
    with pytest.raises(ValueError, match="at most one -1"):
        fnp.reshape(X, (-1, -1))


def test_argnums_out_of_range():
    with pytest.raises(ValueError, match=r"argnums 2 is out of range.*2 positional"):
        fg.grad(lambda x, y: fnp.sum(x * y), argnums=2)(X, X)
    with pytest.raises(ValueError, match="repeats"):
        fg.grad(lambda x, y: fnp.sum(x * y), argnums=(0, 0))(X, X)


def test_non_array_in_pytree():
    with pytest.raises(TypeError, match=r"params\['act'\] is a str; expected a NumPy array"):
        fg.jit(lambda params: params["w"])({"w": X, "act": "relu"})
    with pytest.raises(TypeError, match="output leaf 0 of f is a str"):

        def f(x):
            return "nope"

        fg.jit(f)(X)


def test_unsupported_dtypes():
    with pytest.raises(TypeError, match="unsupported dtype complex128"):
        fg.jit(lambda x: x)(np.ones(2, complex))
    with pytest.raises(TypeError, match="unsupported dtype float16"):
        fg.grad(lambda x: fnp.sum(x))(np.ones(2, np.float16))


def test_control_flow_on_traced_value():
    def f(x):
        if fnp.sum(x) > 0:
            return x
        return -x

    with pytest.raises(fg.TracerError, match=r"traced value.*static_argnums.*fnp.where"):
        fg.jit(f)(X)
    with pytest.raises(fg.TracerError, match=r"float\(\)"):
        fg.grad(lambda x: float(fnp.sum(x)))(X)
    with pytest.raises(fg.TracerError, match="the traced value `x`"):
        fg.jit(lambda x: int(x))(1.0)
    with pytest.raises(fg.TracerError, match="use fastgrad.numpy"):
        fg.jit(lambda x: np.asarray(x))(X)


def test_leaked_tracer():
    leaked = []
    fg.jit(lambda x: leaked.append(x) or x)(X)
    with pytest.raises(fg.TracerError, match="escaped"):
        fg.jit(lambda y: y + leaked[0])(X)


def test_axis_and_index_errors():
    with pytest.raises(ValueError, match="axis 2 is out of bounds"):
        fg.jit(lambda x: fnp.sum(x, axis=2))(X)
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 3"):
        fg.jit(lambda x: x[5])(X)
    with pytest.raises(IndexError, match="too many indices"):
        fg.jit(lambda x: x[0, 0, 0])(X)
    with pytest.raises(IndexError, match="traced boolean mask"):
        fg.jit(lambda x: x[x > 0])(X)


def test_bad_static_arguments():
    with pytest.raises(TypeError, match="hashable"):
        fg.jit(lambda x, opts: x, static_argnums=1)(X, {"a": 1})
    with pytest.raises(ValueError, match="no parameter 'nope'"):
        fg.jit(lambda x: x, static_argnames="nope")


def test_vjp_cotangent_mismatch():
    _, vjp_fn = fg.vjp(lambda x: x * 2, X)
    with pytest.raises(
        ValueError, match=r"cotangent leaf 0 has shape \(4,\), the output has \(3, 4\)"
    ):
        vjp_fn(np.ones(4))
