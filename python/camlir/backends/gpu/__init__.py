"""The gpu backend: linalg kernels through NVVM to PTX (llvmlite's NVPTX), launched with the
CUDA driver on torch's stream; matmuls through torch (cuBLAS). See docs/gpu-backend.md.

Importing this package needs no GPU and no CUDA library: `runner.Driver` loads libcuda when
a program first runs."""
