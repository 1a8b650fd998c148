"""The compiler: graph passes before fusion (passes), the partition into fused loops and
library calls (fusion), Numba source for each loop (codegen) and the kernel cache that
compiles and stores it (kernel_cache)."""
