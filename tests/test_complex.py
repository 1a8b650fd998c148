"""Complex numbers: real, imag, conj and angle on plain complex arrays and on traced (real)
values; traced complex values are refused with a clear error; and gradients with respect
to complex numbers through their parts reproduce JAX's convention."""

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp

Z = np.array([1 + 2j, -3 + 0.5j, -1 - 1j, 2 + 0j])
R = np.array([-2.0, -0.0, 0.0, 1.5])


@pytest.mark.parametrize("name", ["real", "imag", "conj", "conjugate", "angle"])
def test_plain_complex_and_real_arrays_match_numpy(name):
    for x in (Z, Z.astype(np.complex64), R, R.astype(np.float32), np.arange(3)):
        got, expected = getattr(fnp, name)(x), getattr(np, name)(x)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    for x in (R, R.astype(np.float32), np.arange(3)):
        traced = fg.jit(getattr(fnp, name))(x)
        assert traced.dtype == getattr(np, name)(x).dtype
        np.testing.assert_array_equal(traced, getattr(np, name)(x))
    np.testing.assert_allclose(fnp.angle(Z, deg=True), np.angle(Z, deg=True))
    np.testing.assert_allclose(fg.jit(lambda x: fnp.angle(x, deg=True))(R), np.angle(R, deg=True))


def test_derivatives_on_real_values():
    x = np.array([-2.0, 0.5, 3.0])
    grads = {
        name: fg.grad(lambda x, n=name: fnp.sum(getattr(fnp, n)(x) * x))(x)
        for name in ("real", "imag", "conj", "angle")
    }
    np.testing.assert_allclose(grads["real"], 2 * x)
    np.testing.assert_allclose(grads["conj"], 2 * x)
    np.testing.assert_allclose(grads["imag"], np.zeros(3))
    np.testing.assert_allclose(grads["angle"], np.angle(x))  # angle itself is constant


def test_traced_complex_values_are_refused_clearly():
    with pytest.raises(TypeError, match="unsupported dtype complex128"):
        fg.jit(fnp.real)(Z)
    with pytest.raises(TypeError, match="unsupported dtype complex128"):
        fg.grad(lambda z: fnp.sum(fnp.abs(z)))(Z)


def test_gradients_for_complex_parameters_through_their_parts():
    # f(z) = sum |z|^2 + Re(z) Im(z); JAX's grad of a real function of complex z is
    # df/dx - i df/dy: here 2x + y - i (2y + x).
    def f(re, im):
        return fnp.sum(re * re + im * im + re * im)

    g_re, g_im = fg.grad(f, argnums=(0, 1))(Z.real, Z.imag)
    jax_convention = g_re - 1j * g_im
    np.testing.assert_allclose(jax_convention, 2 * Z.real + Z.imag - 1j * (2 * Z.imag + Z.real))
    # Gradient descent on z steps along conj(grad).
    z = Z.copy()
    for _ in range(50):
        g_re, g_im = fg.grad(f, argnums=(0, 1))(z.real, z.imag)
        z = z - 0.3 * np.conj(g_re - 1j * g_im)
    np.testing.assert_allclose(z, 0, atol=1e-6)
