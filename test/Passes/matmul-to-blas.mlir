// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-matmul-to-blas)' | ca-opt --split-input-file | FileCheck %s
// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-matmul-to-blas,ca-define-blas-wrappers)' | ca-opt | FileCheck %s --check-prefix=DEF

// The zero fill before the matmul becomes beta = 0, the matmul a call of the wrapper,
// which is only declared until ca-define-blas-wrappers.
// CHECK-LABEL: func.func @k
// CHECK-NOT: linalg.fill
// CHECK-NOT: linalg.matmul
// CHECK: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT: call @camlir_gemm_f32(%{{.*}}, %{{.*}}, %{{.*}}, %[[ONE]], %[[ZERO]])
// CHECK: func.func private @camlir_gemm_f32(memref<?x?xf32, strided<[?, ?], offset: ?>>, memref<?x?xf32, strided<[?, ?], offset: ?>>, memref<?x?xf32, strided<[?, ?], offset: ?>>, f32, f32)
// DEF-LABEL: func.func @k
// DEF: func.func private @camlir_gemm_f32(%{{.*}}: memref<?x?xf32, strided<[?, ?], offset: ?>>
// The BLAS call is timed and its flops counted for camlir.profile():
// DEF: %[[T0:.*]] = call @camlir_clock_ns() : () -> i64
// DEF-NEXT: call @sgemm_
// DEF-NEXT: call @camlir_blas_done(%[[T0]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (i64, index, index, index, index) -> ()
// DEF: func.func private @sgemm_(!llvm.ptr
// DEF: llvm.mlir.global external @camlir_blas_totals_data(dense<0> : tensor<3xi64>)
// DEF: func.func @camlir_blas_totals() -> i64
// DEF: func.func private @camlir_clock_ns() -> i64
// DEF: call @clock_gettime
// DEF: func.func private @camlir_blas_done(
func.func @k(%a: memref<4x3xf32>, %b: memref<3x5xf32>, %c: memref<4x5xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<4x5xf32>)
  linalg.matmul ins(%a, %b : memref<4x3xf32>, memref<3x5xf32>) outs(%c : memref<4x5xf32>)
  return
}

// -----

// A transposed operand map becomes a memref.transpose view; the output is accumulated into
// (no fill: beta = 1). Integer matmuls stay loops.
// CHECK-LABEL: func.func @t
// CHECK: memref.transpose
// CHECK: call @camlir_gemm_f32
// CHECK-LABEL: func.func @ints
// CHECK: linalg.matmul
#a = affine_map<(d0, d1, d2) -> (d2, d0)>
#b = affine_map<(d0, d1, d2) -> (d2, d1)>
#c = affine_map<(d0, d1, d2) -> (d0, d1)>
func.func @t(%a: memref<3x4xf32>, %b: memref<3x5xf32>, %c: memref<4x5xf32>) {
  linalg.matmul indexing_maps = [#a, #b, #c] ins(%a, %b : memref<3x4xf32>, memref<3x5xf32>) outs(%c : memref<4x5xf32>)
  return
}
func.func @ints(%a: memref<4x3xi32>, %b: memref<3x5xi32>, %c: memref<4x5xi32>) {
  linalg.matmul ins(%a, %b : memref<4x3xi32>, memref<3x5xi32>) outs(%c : memref<4x5xi32>)
  return
}

// -----

// A batch_matmul with an operand's last two dims swapped (ca-fuse-elementwise's fold) gets
// a 3-D transpose view; ca-define-blas-wrappers gives the batched wrapper one
// `sgemm_batch_` call for a batch BLAS can read as it is, and a per-matrix loop otherwise.
// Other maps (here A broadcast over the batch) stay loops.
// CHECK-LABEL: func.func @bt
// CHECK: memref.transpose %{{.*}} (d0, d1, d2) -> (d0, d2, d1)
// CHECK: call @camlir_bgemm_f32
// CHECK-LABEL: func.func @odd_maps
// CHECK: linalg.batch_matmul
// DEF-LABEL: func.func @bt
// DEF: func.func private @camlir_bgemm_f32(
// DEF: call @camlir_bgemm_batch_f32
// DEF: scf.for
// DEF: call @camlir_gemm_f32
// DEF: func.func private @camlir_bgemm_batch_f32(
// DEF: call @camlir_clock_ns()
// DEF-NEXT: call @sgemm_batch_
// DEF-NEXT: call @camlir_blas_done
// DEF: func.func private @sgemm_batch_(!llvm.ptr
#ta = affine_map<(d0, d1, d2, d3) -> (d0, d3, d1)>
#tb = affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>
#tc = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
#oa = affine_map<(d0, d1, d2, d3) -> (d1, d3)>
func.func @bt(%a: memref<2x3x4xf32>, %b: memref<2x3x5xf32>, %c: memref<2x4x5xf32>) {
  linalg.batch_matmul indexing_maps = [#ta, #tb, #tc] ins(%a, %b : memref<2x3x4xf32>, memref<2x3x5xf32>) outs(%c : memref<2x4x5xf32>)
  return
}
func.func @odd_maps(%a: memref<4x3xf32>, %b: memref<2x3x5xf32>, %c: memref<2x4x5xf32>) {
  linalg.batch_matmul indexing_maps = [#oa, #tb, #tc] ins(%a, %b : memref<4x3xf32>, memref<2x3x5xf32>) outs(%c : memref<2x4x5xf32>)
  return
}
