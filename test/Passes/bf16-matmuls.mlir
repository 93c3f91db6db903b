// RUN: ca-opt %s --ca-bf16-matmuls | FileCheck %s
// RUN: ca-opt %s --ca-bf16-matmuls | ca-opt | FileCheck %s
// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-bf16-matmuls,one-shot-bufferize{bufferize-function-boundaries},ca-matmul-to-blas,ca-define-blas-wrappers)' | FileCheck %s --check-prefix=BLAS

#id = affine_map<(d0, d1) -> (d0, d1)>
// Both operands bf16 widened to f32: the matmul reads the bf16 tensors, the widenings go.
// CHECK-LABEL: func.func private @widened
// CHECK-NOT: arith.extf %{{.*}} : bf16 to f32
// CHECK: linalg.matmul ins(%arg0, %arg1 : tensor<4x3xbf16>, tensor<3x5xbf16>) outs(%{{.*}} : tensor<4x5xf32>)
// CHECK: return
// BLAS-LABEL: func.func private @widened
// BLAS: call @camlir_gemm_bf16(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (memref<?x?xbf16, strided<[?, ?], offset: ?>>, memref<?x?xbf16, strided<[?, ?], offset: ?>>, memref<?x?xf32, strided<[?, ?], offset: ?>>, f32, f32) -> ()
func.func private @widened(%a: tensor<4x3xbf16>, %b: tensor<3x5xbf16>) -> tensor<4x5xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %ea = tensor.empty() : tensor<4x3xf32>
  %wa = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%a : tensor<4x3xbf16>) outs(%ea : tensor<4x3xf32>) {
  ^bb0(%in: bf16, %out: f32):
    %0 = arith.extf %in : bf16 to f32
    linalg.yield %0 : f32
  } -> tensor<4x3xf32>
  %eb = tensor.empty() : tensor<3x5xf32>
  %wb = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%b : tensor<3x5xbf16>) outs(%eb : tensor<3x5xf32>) {
  ^bb0(%in: bf16, %out: f32):
    %0 = arith.extf %in : bf16 to f32
    linalg.yield %0 : f32
  } -> tensor<3x5xf32>
  %ec = tensor.empty() : tensor<4x5xf32>
  %z = linalg.fill ins(%zero : f32) outs(%ec : tensor<4x5xf32>) -> tensor<4x5xf32>
  %c = linalg.matmul ins(%wa, %wb : tensor<4x3xf32>, tensor<3x5xf32>) outs(%z : tensor<4x5xf32>) -> tensor<4x5xf32>
  return %c : tensor<4x5xf32>
}

// One operand f32 from the start: MKL has no mixed GEMM, the matmul stays f32.
// CHECK-LABEL: func.func private @one_side
// CHECK: arith.extf
// CHECK: linalg.matmul ins(%{{.*}}, %arg1 : tensor<4x3xf32>, tensor<3x5xf32>)
func.func private @one_side(%a: tensor<4x3xbf16>, %b: tensor<3x5xf32>) -> tensor<4x5xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %ea = tensor.empty() : tensor<4x3xf32>
  %wa = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%a : tensor<4x3xbf16>) outs(%ea : tensor<4x3xf32>) {
  ^bb0(%in: bf16, %out: f32):
    %0 = arith.extf %in : bf16 to f32
    linalg.yield %0 : f32
  } -> tensor<4x3xf32>
  %ec = tensor.empty() : tensor<4x5xf32>
  %z = linalg.fill ins(%zero : f32) outs(%ec : tensor<4x5xf32>) -> tensor<4x5xf32>
  %c = linalg.matmul ins(%wa, %b : tensor<4x3xf32>, tensor<3x5xf32>) outs(%z : tensor<4x5xf32>) -> tensor<4x5xf32>
  return %c : tensor<4x5xf32>
}

// A bf16 transpose behind the widening (a weight gradient's `t`): a transposed map, no copy.
// CHECK-LABEL: func.func private @transposed
// CHECK-NOT: linalg.transpose
// CHECK: linalg.matmul indexing_maps = [#{{.*}}, #{{.*}}, #{{.*}}] ins(%arg0, %arg1 : tensor<3x4xbf16>, tensor<3x5xbf16>) outs(%{{.*}} : tensor<4x5xf32>)
// BLAS-LABEL: func.func private @transposed
// BLAS: memref.transpose
// BLAS: call @camlir_gemm_bf16(
// BLAS: func.func private @camlir_gemm_bf16(
// BLAS: call @gemm_bf16bf16f32_(
// BLAS: func.func private @gemm_bf16bf16f32_(
func.func private @transposed(%a: tensor<3x4xbf16>, %b: tensor<3x5xbf16>) -> tensor<4x5xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %et = tensor.empty() : tensor<4x3xbf16>
  %t = linalg.transpose ins(%a : tensor<3x4xbf16>) outs(%et : tensor<4x3xbf16>) permutation = [1, 0]
  %ea = tensor.empty() : tensor<4x3xf32>
  %wa = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%t : tensor<4x3xbf16>) outs(%ea : tensor<4x3xf32>) {
  ^bb0(%in: bf16, %out: f32):
    %0 = arith.extf %in : bf16 to f32
    linalg.yield %0 : f32
  } -> tensor<4x3xf32>
  %eb = tensor.empty() : tensor<3x5xf32>
  %wb = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%b : tensor<3x5xbf16>) outs(%eb : tensor<3x5xf32>) {
  ^bb0(%in: bf16, %out: f32):
    %0 = arith.extf %in : bf16 to f32
    linalg.yield %0 : f32
  } -> tensor<3x5xf32>
  %ec = tensor.empty() : tensor<4x5xf32>
  %z = linalg.fill ins(%zero : f32) outs(%ec : tensor<4x5xf32>) -> tensor<4x5xf32>
  %c = linalg.matmul ins(%wa, %wb : tensor<4x3xf32>, tensor<3x5xf32>) outs(%z : tensor<4x5xf32>) -> tensor<4x5xf32>
  return %c : tensor<4x5xf32>
}
