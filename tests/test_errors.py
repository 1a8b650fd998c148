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


# ---------------------------------------------------------------- NumPy's own functions


def test_numpy_functions_on_traced_values_run_fastgrads():
    # np.sum/np.mean used to fail on the out=/dtype= keywords NumPy passes to methods.
    f = fg.jit(lambda x: np.sum(x) + np.mean(x, axis=0) + np.exp(x[0]) + np.max(x, 1)[1])
    np.testing.assert_allclose(f(X), X.sum() + X.mean(0) + np.exp(X[0]) + X.max(1)[1])
    g = fg.grad(lambda x: np.sum(np.tanh(x), dtype=np.float64))(X.astype(np.float32))
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, 1 - np.tanh(X) ** 2, rtol=1e-6)
    scipy_special = pytest.importorskip("scipy.special")
    np.testing.assert_allclose(fg.jit(scipy_special.expit)(X), scipy_special.expit(X))


def test_a_missing_function_says_so_and_names_what_to_use():
    scipy_special = pytest.importorskip("scipy.special")
    with pytest.raises(fg.TracerError, match=r"scipy.special.struve .*has no struve yet"):
        fg.jit(lambda x: scipy_special.struve(1.0, x))(X)
    with pytest.raises(fg.TracerError, match=r"numpy.linalg.eig .*no numpy.linalg.eig yet"):
        fg.jit(lambda x: np.linalg.eig(x))(X)
    with pytest.raises(fg.TracerError, match=r"where=.*fnp.sum\(x, axis=None, keepdims=False\)"):
        fg.jit(lambda x: np.sum(x, where=x > 0))(X)
    with pytest.raises(fg.TracerError, match=r"out= cannot be used.*x.at\[idx\]"):
        fg.jit(lambda x: np.exp(x, out=np.empty_like(X)))(X)
    with pytest.raises(AttributeError, match=r"has no sofmax; the closest .*fnp.softmax"):
        fnp.sofmax  # noqa: B018
    with pytest.raises(AttributeError, match=r"fastgrad.numpy has no erf$"):
        fnp.erf  # noqa: B018


def test_asarray_of_a_list_of_traced_values_builds_the_array():
    f = fg.jit(lambda x: fnp.asarray([[x[0, 0], 1.0], [x[1, 1] * 2, x[2, 3]]]))
    np.testing.assert_array_equal(f(X), [[1.0, 1.0], [2.0, 1.0]])
    g = fg.grad(lambda x: fnp.sum(fnp.array([x[0, 0], x[0, 0] * 3]) ** 2))(X)
    assert g[0, 0] == 20.0 and g.sum() == 20.0
    assert fg.jit(lambda x: fnp.asarray([x[0, 0], 2.0]))(X.astype(np.float32)).dtype == np.float32


def test_a_traced_axis_or_shape_says_it_must_be_static():
    with pytest.raises(fg.TracerError, match=r"axis must be static.*`axis`.*static_argnums"):
        fg.jit(lambda x, axis: fnp.sum(x, axis=axis))(X, 1)
    with pytest.raises(fg.TracerError, match=r"shape must be static.*`n`"):
        fg.jit(lambda x, n: fnp.reshape(x, (n, -1)))(X, 2)
    fixed = fg.jit(lambda x, axis: fnp.sum(x, axis=axis), static_argnames="axis")
    np.testing.assert_array_equal(fixed(X, axis=1), X.sum(1))


def test_public_namespaces_show_their_public_names_only():
    for module in (fg, fnp, fg.testing, fg.debug):
        shown = {name for name in dir(module) if not name.startswith("__")}
        assert shown <= set(module.__all__), module.__name__
        assert all(not name.startswith("_") for name in module.__all__)
    internals = {"np", "math", "builtins", "operator", "REGISTRY", "Tracer", "bind", "core"}
    assert not internals & set(fnp.__all__) | internals & set(dir(fnp)) | internals & set(dir(fg))
    for name in fnp.__all__:
        assert not isinstance(getattr(fnp, name), type(np)), name  # no modules
