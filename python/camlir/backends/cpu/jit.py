"""The cpu backend's JIT: MLIR's ExecutionEngine over the LLVM-dialect kernel module, with
the BLAS entry points the kernels call registered by address.

The BLAS is the MKL linked into `libtorch_cpu.so`, which exports the Fortran entry points
`sgemm_`/`dgemm_`; handing their addresses to the engine lets a kernel call them with no
Python in between, and they follow `torch.set_num_threads`.
"""

import ctypes
import os

import torch
from torch_mlir import ir
from torch_mlir.execution_engine import ExecutionEngine

_BLAS_SYMBOLS = ("sgemm_", "dgemm_")


def blas_symbols() -> dict:
    """Native addresses of the BLAS entry points, by symbol name."""
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _BLAS_SYMBOLS}


def jit(module: ir.Module, opt_level: int = 2) -> ExecutionEngine:
    """JIT-compiles an LLVM-dialect module (-O2: -O3 measured no faster to run or to compile,
    W3: 1.5 s of LLVM codegen either way) and links the BLAS symbols into it."""
    engine = ExecutionEngine(module, opt_level=opt_level)
    for name, address in blas_symbols().items():
        engine.raw_register_runtime(name, ctypes.c_void_p(address))
    engine.initialize()
    return engine
