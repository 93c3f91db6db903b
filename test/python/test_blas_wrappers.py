"""The BLAS wrappers of ca-define-blas-wrappers, run on their own (JIT, MKL from torch):
layouts no captured graph is known to produce yet, checked against numpy."""

import ctypes

import numpy as np
from torch_mlir import ir
from torch_mlir.passmanager import PassManager
from torch_mlir.runtime import get_ranked_memref_descriptor

from camlir.backends.cpu import jit
from camlir.context import make_context
from camlir.passes.pipeline import run_pipeline

_TO_LLVM = ("builtin.module(func.func(convert-linalg-to-loops),expand-strided-metadata,lower-affine,"
            "convert-scf-to-cf,convert-to-llvm,reconcile-unrealized-casts)")

# The output is a transposed view: its columns are contiguous. sgemm has no transpose flag
# for C; the wrapper handed such a C to MKL as row-major (MKL: "Condition -13", the
# leading dimension, and a wrong result). Now it computes into a row-major copy.
_COLUMN_MAJOR_OUTPUT = """
func.func @k(%a: memref<4x3xf32>, %b: memref<3x5xf32>, %c: memref<5x4xf32>) attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  %ct = memref.transpose %c (i, j) -> (j, i) : memref<5x4xf32> to memref<4x5xf32, strided<[1, 4]>>
  linalg.fill ins(%zero : f32) outs(%ct : memref<4x5xf32, strided<[1, 4]>>)
  linalg.matmul ins(%a, %b : memref<4x3xf32>, memref<3x5xf32>) outs(%ct : memref<4x5xf32, strided<[1, 4]>>)
  return
}
"""


def test_a_column_major_output_is_written_in_its_own_layout():
    with make_context():
        module = ir.Module.parse(_COLUMN_MAJOR_OUTPUT)
        run_pipeline(module, "ca-matmul-to-blas,ca-define-blas-wrappers")
        assert "call @camlir_gemm_f32" in str(module), "the matmul goes to BLAS"
        PassManager.parse(_TO_LLVM).run(module.operation)
        engine = jit.jit(module)
        rng = np.random.default_rng(0)
        a = rng.standard_normal((4, 3)).astype(np.float32)
        b = rng.standard_normal((3, 5)).astype(np.float32)
        c = np.full((5, 4), 7.0, dtype=np.float32)
        engine.invoke("k", *[ctypes.pointer(ctypes.pointer(get_ranked_memref_descriptor(x))) for x in (a, b, c)])
        np.testing.assert_allclose(c, (a @ b).T, rtol=1e-5, atol=1e-6)
