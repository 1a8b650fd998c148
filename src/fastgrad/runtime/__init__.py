"""The runtime: an `Executable` runs a partitioned graph (fused kernels and library calls
over a flat list of buffers); `explain` describes one in words."""
