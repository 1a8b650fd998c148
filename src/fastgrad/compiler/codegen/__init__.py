"""Code generation: fused loops as Numba source, and the math they call."""
