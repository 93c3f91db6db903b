// RUN: ca-opt %s --split-input-file --ca-fuse-elementwise | FileCheck %s
// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-fuse-elementwise{epilogues=false})' | FileCheck %s --check-prefix=NOEPI
// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-fuse-elementwise{recompute=false})' | FileCheck %s --check-prefix=KEEP
// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-fuse-elementwise{siblings=false})' | FileCheck %s --check-prefix=APART

#id = affine_map<(d0, d1) -> (d0, d1)>
#scalar = affine_map<(d0, d1) -> ()>
// A broadcast (expand of the loss gradient) and the multiply using it: one loop.
// CHECK-LABEL: func.func private @broadcast_then_mul
// CHECK: linalg.generic
// CHECK-SAME: ins(%{{.*}}, %{{.*}} : tensor<f32>, tensor<8x4xf32>)
// CHECK: arith.mulf
// CHECK-NOT: linalg.generic
// CHECK: return
func.func private @broadcast_then_mul(%s: tensor<f32>, %x: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {ca.kernel} {
  %e = tensor.empty() : tensor<8x4xf32>
  %b = linalg.generic {indexing_maps = [#scalar, #id], iterator_types = ["parallel", "parallel"]} ins(%s : tensor<f32>) outs(%e : tensor<8x4xf32>) {
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  } -> tensor<8x4xf32>
  %m = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]} ins(%b, %x : tensor<8x4xf32>, tensor<8x4xf32>) outs(%e : tensor<8x4xf32>) {
  ^bb0(%in: f32, %in_1: f32, %out: f32):
    %0 = arith.mulf %in, %in_1 : f32
    linalg.yield %0 : f32
  } -> tensor<8x4xf32>
  return %m : tensor<8x4xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
// A hook's `g * 0.5` on a matmul result becomes the matmul's BLAS alpha; without
// epilogue folding it stays a loop.
// CHECK-LABEL: func.func private @matmul_then_scale
// CHECK: linalg.fill
// CHECK: linalg.matmul {ca.alpha = 5.000000e-01 : f32}
// CHECK-NOT: linalg.generic
// NOEPI-LABEL: func.func private @matmul_then_scale
// NOEPI: linalg.matmul ins
// NOEPI: linalg.generic
func.func private @matmul_then_scale(%a: tensor<8x16xf32>, %b: tensor<16x4xf32>) -> tensor<8x4xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %half = arith.constant 0.5 : f32
  %e = tensor.empty() : tensor<8x4xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
  %mm = linalg.matmul ins(%a, %b : tensor<8x16xf32>, tensor<16x4xf32>) outs(%f : tensor<8x4xf32>) -> tensor<8x4xf32>
  %s = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%mm : tensor<8x4xf32>) outs(%e : tensor<8x4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.mulf %in, %half : f32
    linalg.yield %0 : f32
  } -> tensor<8x4xf32>
  return %s : tensor<8x4xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
// Negative: the expensive producer (exp) has two users, so it is not fused into either
// (that would compute exp twice); the matmul accumulates into a bias (not zero), so the
// scale cannot become alpha.
// CHECK-LABEL: func.func private @shared_producer
// CHECK: math.exp
// CHECK-NOT: math.exp
// CHECK: linalg.matmul ins
// CHECK: arith.mulf
// CHECK: return
func.func private @shared_producer(%x: tensor<8x8xf32>, %bias: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>) attributes {ca.kernel} {
  %half = arith.constant 0.5 : f32
  %e = tensor.empty() : tensor<8x8xf32>
  %ex = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<8x8xf32>) outs(%e : tensor<8x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = math.exp %in : f32
    linalg.yield %0 : f32
  } -> tensor<8x8xf32>
  %mm = linalg.matmul ins(%ex, %ex : tensor<8x8xf32>, tensor<8x8xf32>) outs(%bias : tensor<8x8xf32>) -> tensor<8x8xf32>
  %s = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%mm : tensor<8x8xf32>) outs(%e : tensor<8x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.mulf %in, %half : f32
    linalg.yield %0 : f32
  } -> tensor<8x8xf32>
  return %s, %ex : tensor<8x8xf32>, tensor<8x8xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
// Two matmuls starting from one CSE'd zero fill each get their own (no copy later).
// CHECK-LABEL: func.func private @two_matmuls
// CHECK-COUNT-2: linalg.fill
// CHECK: linalg.matmul ins({{.*}}) outs(%[[F1:[0-9]+]] :
// CHECK-NOT: outs(%[[F1]] :
// CHECK: linalg.matmul
func.func private @two_matmuls(%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x4xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x4xf32>) -> tensor<4x4xf32>
  %m1 = linalg.matmul ins(%a, %b : tensor<4x4xf32>, tensor<4x4xf32>) outs(%f : tensor<4x4xf32>) -> tensor<4x4xf32>
  %m2 = linalg.matmul ins(%b, %a : tensor<4x4xf32>, tensor<4x4xf32>) outs(%f : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %m1, %m2 : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// A transposed operand (a saved `W.t()` lowered by torch-mlir) becomes a transposed
// indexing map: no transpose loop is left.
// CHECK-LABEL: func.func private @transposed_operand
// CHECK-NOT: linalg.transpose
// CHECK: linalg.matmul indexing_maps = [#{{.*}}, #{{.*}}, #{{.*}}] ins(%arg0, %arg1 : tensor<3x2xf32>, tensor<8x2xf32>)
func.func private @transposed_operand(%g: tensor<3x2xf32>, %w: tensor<8x2xf32>) -> tensor<3x8xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x8xf32>
  %t = linalg.transpose ins(%w : tensor<8x2xf32>) outs(%e : tensor<2x8xf32>) permutation = [1, 0]
  %e2 = tensor.empty() : tensor<3x8xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e2 : tensor<3x8xf32>) -> tensor<3x8xf32>
  %mm = linalg.matmul ins(%g, %t : tensor<3x2xf32>, tensor<2x8xf32>) outs(%f : tensor<3x8xf32>) -> tensor<3x8xf32>
  return %mm : tensor<3x8xf32>
}

// -----

// A bmm's backward multiplies by its saved operands transposed in their last two dims:
// both transposes become transposed maps on the batch_matmul (BLAS transpose flags).
// CHECK-DAG: #[[AT:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d3, d1)>
// CHECK-DAG: #[[BT:.*]] = affine_map<(d0, d1, d2, d3) -> (d0, d2, d3)>
// CHECK-LABEL: func.func private @transposed_batch_operands
// CHECK-NOT: linalg.transpose
// CHECK: linalg.batch_matmul indexing_maps = [#[[AT]], #[[BT]], #{{.*}}] ins(%arg0, %arg1 : tensor<4x3x5xf32>, tensor<4x7x3xf32>)
func.func private @transposed_batch_operands(%a: tensor<4x3x5xf32>, %b: tensor<4x7x3xf32>) -> tensor<4x5x7xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %ea = tensor.empty() : tensor<4x5x3xf32>
  %ta = linalg.transpose ins(%a : tensor<4x3x5xf32>) outs(%ea : tensor<4x5x3xf32>) permutation = [0, 2, 1]
  %eb = tensor.empty() : tensor<4x3x7xf32>
  %tb = linalg.transpose ins(%b : tensor<4x7x3xf32>) outs(%eb : tensor<4x3x7xf32>) permutation = [0, 2, 1]
  %e = tensor.empty() : tensor<4x5x7xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x5x7xf32>) -> tensor<4x5x7xf32>
  %mm = linalg.batch_matmul ins(%ta, %tb : tensor<4x5x3xf32>, tensor<4x3x7xf32>) outs(%f : tensor<4x5x7xf32>) -> tensor<4x5x7xf32>
  return %mm : tensor<4x5x7xf32>
}

// -----

// A transpose of the batch dim is not a BLAS flag: it stays a copy.
// CHECK-LABEL: func.func private @batch_dim_transpose
// CHECK: linalg.transpose ins(%arg0 : tensor<3x4x5xf32>) outs(%{{.*}} : tensor<4x3x5xf32>) permutation = [1, 0, 2]
// CHECK: linalg.batch_matmul ins(
func.func private @batch_dim_transpose(%a: tensor<3x4x5xf32>, %b: tensor<4x5x2xf32>) -> tensor<4x3x2xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %ea = tensor.empty() : tensor<4x3x5xf32>
  %ta = linalg.transpose ins(%a : tensor<3x4x5xf32>) outs(%ea : tensor<4x3x5xf32>) permutation = [1, 0, 2]
  %e = tensor.empty() : tensor<4x3x2xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x3x2xf32>) -> tensor<4x3x2xf32>
  %mm = linalg.batch_matmul ins(%ta, %b : tensor<4x3x5xf32>, tensor<4x5x2xf32>) outs(%f : tensor<4x3x2xf32>) -> tensor<4x3x2xf32>
  return %mm : tensor<4x3x2xf32>
}

// -----

// A weight gradient's `t(view(g))` of a 3-D `g` (W3's linear layers): torch-mlir lowers it
// as a 3-D transpose behind a collapse_shape. The matmul reads `g` regrouped as its 2-D
// transpose instead, so no transpose loop is left.
// CHECK-LABEL: func.func private @transposed_3d_operand
// CHECK-NOT: linalg.transpose
// CHECK: %[[G:.*]] = tensor.collapse_shape %arg0 {{\[}}[0, 1], [2]] : tensor<2x4x6xf32> into tensor<8x6xf32>
// CHECK: linalg.matmul indexing_maps = [#{{.*}}, #{{.*}}, #{{.*}}] ins(%[[G]], %arg1 : tensor<8x6xf32>, tensor<8x5xf32>)
func.func private @transposed_3d_operand(%g: tensor<2x4x6xf32>, %x: tensor<8x5xf32>) -> tensor<6x5xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<6x8xf32>
  %ex = tensor.expand_shape %e [[0], [1, 2]] output_shape [6, 2, 4] : tensor<6x8xf32> into tensor<6x2x4xf32>
  %t = linalg.transpose ins(%g : tensor<2x4x6xf32>) outs(%ex : tensor<6x2x4xf32>) permutation = [2, 0, 1]
  %c = tensor.collapse_shape %t [[0], [1, 2]] : tensor<6x2x4xf32> into tensor<6x8xf32>
  %e2 = tensor.empty() : tensor<6x5xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e2 : tensor<6x5xf32>) -> tensor<6x5xf32>
  %mm = linalg.matmul ins(%c, %x : tensor<6x8xf32>, tensor<8x5xf32>) outs(%f : tensor<6x5xf32>) -> tensor<6x5xf32>
  return %mm : tensor<6x5xf32>
}

// -----

// Neither this transpose nor the one of the swapped order keeps x's innermost dim innermost:
// both copies would be strided, so the transpose stays as it is.
// CHECK-LABEL: func.func private @strided_either_way
// CHECK: linalg.transpose ins(%arg0 : tensor<2x4x6xf32>) outs(%{{.*}} : tensor<4x6x2xf32>) permutation = [1, 2, 0]
// CHECK: linalg.matmul ins(
func.func private @strided_either_way(%g: tensor<2x4x6xf32>, %x: tensor<12x5xf32>) -> tensor<4x5xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x6x2xf32>
  %t = linalg.transpose ins(%g : tensor<2x4x6xf32>) outs(%e : tensor<4x6x2xf32>) permutation = [1, 2, 0]
  %c = tensor.collapse_shape %t [[0], [1, 2]] : tensor<4x6x2xf32> into tensor<4x12xf32>
  %e2 = tensor.empty() : tensor<4x5xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e2 : tensor<4x5xf32>) -> tensor<4x5xf32>
  %mm = linalg.matmul ins(%c, %x : tensor<4x12xf32>, tensor<12x5xf32>) outs(%f : tensor<4x5xf32>) -> tensor<4x5xf32>
  return %mm : tensor<4x5xf32>
}

// -----

// W3's in-projection weight gradient: rows (s, j) and columns (a, b) of x[s, a, b, j], a
// transpose that reads x with a stride. The matmul reads instead the transpose of x's dims
// in the order (a, b, s, j), which copies contiguous runs of j.
// CHECK-LABEL: func.func private @strided_transpose_operand
// CHECK: %[[T:.*]] = linalg.transpose ins(%arg0 : tensor<3x4x2x5xf32>) outs(%{{.*}} : tensor<4x2x3x5xf32>) permutation = [1, 2, 0, 3]
// CHECK-NOT: linalg.transpose
// CHECK: %[[G:.*]] = tensor.collapse_shape %[[T]] {{\[}}[0, 1], [2, 3]] : tensor<4x2x3x5xf32> into tensor<8x15xf32>
// CHECK: linalg.matmul indexing_maps = [#{{.*}}, #{{.*}}, #{{.*}}] ins(%[[G]], %arg1 : tensor<8x15xf32>, tensor<8x6xf32>)
func.func private @strided_transpose_operand(%x: tensor<3x4x2x5xf32>, %y: tensor<8x6xf32>) -> tensor<15x6xf32> attributes {ca.kernel} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<3x5x4x2xf32>
  %t = linalg.transpose ins(%x : tensor<3x4x2x5xf32>) outs(%e : tensor<3x5x4x2xf32>) permutation = [0, 3, 1, 2]
  %c = tensor.collapse_shape %t [[0, 1], [2, 3]] : tensor<3x5x4x2xf32> into tensor<15x8xf32>
  %e2 = tensor.empty() : tensor<15x6xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e2 : tensor<15x6xf32>) -> tensor<15x6xf32>
  %mm = linalg.matmul ins(%c, %y : tensor<15x8xf32>, tensor<8x6xf32>) outs(%f : tensor<15x6xf32>) -> tensor<15x6xf32>
  return %mm : tensor<15x6xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#col = affine_map<(d0, d1) -> (d1)>
// A cheap producer with one full-size input (a batch norm's `x - mean`) read by a reduction
// and by an elementwise user: each user computes it again, and no 8x4 tensor of its own
// is left (reading `x` in each user moves fewer bytes than writing the difference out).
// CHECK-LABEL: func.func private @cheap_producer_recomputed
// CHECK: linalg.generic
// CHECK-SAME: iterator_types = ["parallel", "reduction"]
// CHECK-SAME: ins(%{{.*}}, %{{.*}} : tensor<8x4xf32>, tensor<4xf32>)
// CHECK: arith.subf
// CHECK: arith.addf
// CHECK: linalg.generic
// CHECK-SAME: ins(%{{.*}}, %{{.*}}, %{{.*}} : tensor<8x4xf32>, tensor<4xf32>, tensor<8x4xf32>)
// CHECK: arith.subf
// CHECK: arith.mulf
// CHECK-NOT: linalg.generic
// CHECK: return
// NOEPI-LABEL: func.func private @cheap_producer_recomputed
// Without recomputing, the difference is one tensor that both users read.
// KEEP-LABEL: func.func private @cheap_producer_recomputed
// KEEP: %[[D:.*]] = linalg.generic
// KEEP: arith.subf
// KEEP: linalg.generic
// KEEP-SAME: ins(%[[D]] : tensor<8x4xf32>)
// KEEP: linalg.generic
// KEEP-SAME: ins(%[[D]], %{{.*}} : tensor<8x4xf32>, tensor<8x4xf32>)
func.func private @cheap_producer_recomputed(%x: tensor<8x4xf32>, %mean: tensor<4xf32>, %y: tensor<8x4xf32>) -> (tensor<8xf32>, tensor<8x4xf32>) attributes {ca.kernel} {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x4xf32>
  %d = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]} ins(%x, %mean : tensor<8x4xf32>, tensor<4xf32>) outs(%e : tensor<8x4xf32>) {
  ^bb0(%in: f32, %m: f32, %out: f32):
    %0 = arith.subf %in, %m : f32
    linalg.yield %0 : f32
  } -> tensor<8x4xf32>
  %e1 = tensor.empty() : tensor<8xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e1 : tensor<8xf32>) -> tensor<8xf32>
  %s = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]} ins(%d : tensor<8x4xf32>) outs(%z : tensor<8xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %0 = arith.addf %in, %acc : f32
    linalg.yield %0 : f32
  } -> tensor<8xf32>
  %e2 = tensor.empty() : tensor<8x4xf32>
  %p = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]} ins(%d, %y : tensor<8x4xf32>, tensor<8x4xf32>) outs(%e2 : tensor<8x4xf32>) {
  ^bb0(%in: f32, %in_1: f32, %out: f32):
    %0 = arith.mulf %in, %in_1 : f32
    linalg.yield %0 : f32
  } -> tensor<8x4xf32>
  return %s, %p : tensor<8xf32>, tensor<8x4xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
// An expensive producer (an exp) with two users stays one tensor, computed once; its two
// users, siblings over the same loops reading it, become one loop with two results.
// CHECK-LABEL: func.func private @expensive_producer_kept
// CHECK: %[[E:.*]] = linalg.generic
// CHECK: math.exp
// CHECK: linalg.generic
// CHECK-SAME: ins(%[[E]], %{{.*}} : tensor<8x4xf32>, tensor<8x4xf32>)
// CHECK-NOT: math.exp
// CHECK: arith.mulf
// CHECK-NEXT: arith.addf
// CHECK-NEXT: linalg.yield
// CHECK-NOT: linalg.generic
// CHECK: return
// NOEPI-LABEL: func.func private @expensive_producer_kept
func.func private @expensive_producer_kept(%x: tensor<8x4xf32>, %y: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xf32>) attributes {ca.kernel} {
  %e = tensor.empty() : tensor<8x4xf32>
  %d = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<8x4xf32>) outs(%e : tensor<8x4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = math.exp %in : f32
    linalg.yield %0 : f32
  } -> tensor<8x4xf32>
  %e1 = tensor.empty() : tensor<8x4xf32>
  %p = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]} ins(%d, %y : tensor<8x4xf32>, tensor<8x4xf32>) outs(%e1 : tensor<8x4xf32>) {
  ^bb0(%in: f32, %in_1: f32, %out: f32):
    %0 = arith.mulf %in, %in_1 : f32
    linalg.yield %0 : f32
  } -> tensor<8x4xf32>
  %e2 = tensor.empty() : tensor<8x4xf32>
  %q = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]} ins(%d, %y : tensor<8x4xf32>, tensor<8x4xf32>) outs(%e2 : tensor<8x4xf32>) {
  ^bb0(%in: f32, %in_1: f32, %out: f32):
    %0 = arith.addf %in, %in_1 : f32
    linalg.yield %0 : f32
  } -> tensor<8x4xf32>
  return %p, %q : tensor<8x4xf32>, tensor<8x4xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
// A batch norm's two reductions over the batch dim, `sum(g)` and `sum(g * x)`: one loop
// reads `g` and `x` once and feeds both accumulators, each with its own body.
// CHECK-LABEL: func.func private @sibling_reductions
// CHECK: %[[R:.*]]:2 = linalg.generic
// CHECK-SAME: iterator_types = ["reduction", "parallel"]
// CHECK-SAME: ins(%arg0, %arg1 : tensor<8x4xf32>, tensor<8x4xf32>)
// CHECK-SAME: outs(%{{.*}}, %{{.*}} : tensor<4xf32>, tensor<4xf32>)
// CHECK: arith.addf
// CHECK: arith.mulf
// CHECK: arith.addf
// CHECK: linalg.yield
// CHECK-NOT: linalg.generic
// CHECK: return %[[R]]#0, %[[R]]#1
// NOEPI-LABEL: func.func private @sibling_reductions
// KEEP-LABEL: func.func private @sibling_reductions
// APART-LABEL: func.func private @sibling_reductions
// APART: linalg.generic
// APART-SAME: ins(%arg0 : tensor<8x4xf32>)
// APART: linalg.generic
// APART-SAME: ins(%arg0, %arg1 : tensor<8x4xf32>, tensor<8x4xf32>)
func.func private @sibling_reductions(%g: tensor<8x4xf32>, %x: tensor<8x4xf32>) -> (tensor<4xf32>, tensor<4xf32>) attributes {ca.kernel} {
  %c0 = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<4xf32>
  %z0 = linalg.fill ins(%c0 : f32) outs(%e0 : tensor<4xf32>) -> tensor<4xf32>
  %s = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%g : tensor<8x4xf32>) outs(%z0 : tensor<4xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %0 = arith.addf %in, %acc : f32
    linalg.yield %0 : f32
  } -> tensor<4xf32>
  %e1 = tensor.empty() : tensor<4xf32>
  %z1 = linalg.fill ins(%c0 : f32) outs(%e1 : tensor<4xf32>) -> tensor<4xf32>
  %t = linalg.generic {indexing_maps = [#id, #id, #col], iterator_types = ["reduction", "parallel"]} ins(%g, %x : tensor<8x4xf32>, tensor<8x4xf32>) outs(%z1 : tensor<4xf32>) {
  ^bb0(%in: f32, %in_1: f32, %acc: f32):
    %0 = arith.mulf %in, %in_1 : f32
    %1 = arith.addf %0, %acc : f32
    linalg.yield %1 : f32
  } -> tensor<4xf32>
  return %s, %t : tensor<4xf32>, tensor<4xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
// The second reduction reads the first one's result: not siblings, two loops.
// CHECK-LABEL: func.func private @dependent_reductions_apart
// CHECK: %[[S:.*]] = linalg.generic
// CHECK: linalg.generic
// CHECK-SAME: ins(%arg0, %[[S]] : tensor<8x4xf32>, tensor<4xf32>)
// NOEPI-LABEL: func.func private @dependent_reductions_apart
// KEEP-LABEL: func.func private @dependent_reductions_apart
// APART-LABEL: func.func private @dependent_reductions_apart
func.func private @dependent_reductions_apart(%g: tensor<8x4xf32>) -> tensor<4xf32> attributes {ca.kernel} {
  %c0 = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<4xf32>
  %z0 = linalg.fill ins(%c0 : f32) outs(%e0 : tensor<4xf32>) -> tensor<4xf32>
  %s = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%g : tensor<8x4xf32>) outs(%z0 : tensor<4xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %0 = arith.addf %in, %acc : f32
    linalg.yield %0 : f32
  } -> tensor<4xf32>
  %e1 = tensor.empty() : tensor<4xf32>
  %z1 = linalg.fill ins(%c0 : f32) outs(%e1 : tensor<4xf32>) -> tensor<4xf32>
  %t = linalg.generic {indexing_maps = [#id, #col, #col], iterator_types = ["reduction", "parallel"]} ins(%g, %s : tensor<8x4xf32>, tensor<4xf32>) outs(%z1 : tensor<4xf32>) {
  ^bb0(%in: f32, %m: f32, %acc: f32):
    %0 = arith.subf %in, %m : f32
    %1 = arith.addf %0, %acc : f32
    linalg.yield %1 : f32
  } -> tensor<4xf32>
  return %t : tensor<4xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
// The first reduction's result is read inside the body of a loop between the two siblings
// (a `tensor.extract`): the merged loop would come after that use, so they stay apart.
// CHECK-LABEL: func.func private @sibling_used_in_a_body_between
// CHECK: %[[S:.*]] = linalg.generic
// CHECK: linalg.generic
// CHECK: tensor.extract %[[S]]
// CHECK: linalg.generic
// CHECK-SAME: ins(%arg0, %arg1 : tensor<8x4xf32>, tensor<8x4xf32>)
// NOEPI-LABEL: func.func private @sibling_used_in_a_body_between
// KEEP-LABEL: func.func private @sibling_used_in_a_body_between
// APART-LABEL: func.func private @sibling_used_in_a_body_between
func.func private @sibling_used_in_a_body_between(%g: tensor<8x4xf32>, %x: tensor<8x4xf32>, %y: tensor<3xf32>) -> (tensor<4xf32>, tensor<3xf32>, tensor<4xf32>) attributes {ca.kernel} {
  %c0 = arith.constant 0.0 : f32
  %i0 = arith.constant 0 : index
  %e0 = tensor.empty() : tensor<4xf32>
  %z0 = linalg.fill ins(%c0 : f32) outs(%e0 : tensor<4xf32>) -> tensor<4xf32>
  %s = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%g : tensor<8x4xf32>) outs(%z0 : tensor<4xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %0 = arith.addf %in, %acc : f32
    linalg.yield %0 : f32
  } -> tensor<4xf32>
  %e2 = tensor.empty() : tensor<3xf32>
  %u = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%y : tensor<3xf32>) outs(%e2 : tensor<3xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = tensor.extract %s[%i0] : tensor<4xf32>
    %1 = arith.mulf %in, %0 : f32
    linalg.yield %1 : f32
  } -> tensor<3xf32>
  %e1 = tensor.empty() : tensor<4xf32>
  %z1 = linalg.fill ins(%c0 : f32) outs(%e1 : tensor<4xf32>) -> tensor<4xf32>
  %t = linalg.generic {indexing_maps = [#id, #id, #col], iterator_types = ["reduction", "parallel"]} ins(%g, %x : tensor<8x4xf32>, tensor<8x4xf32>) outs(%z1 : tensor<4xf32>) {
  ^bb0(%in: f32, %in_1: f32, %acc: f32):
    %0 = arith.mulf %in, %in_1 : f32
    %1 = arith.addf %0, %acc : f32
    linalg.yield %1 : f32
  } -> tensor<4xf32>
  return %s, %u, %t : tensor<4xf32>, tensor<3xf32>, tensor<4xf32>
}
