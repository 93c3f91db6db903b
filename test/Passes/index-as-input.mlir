// RUN: ca-opt %s --ca-index-as-input | FileCheck %s
// RUN: ca-opt %s --ca-index-as-input | ca-opt | FileCheck %s

// A one-hot from the targets: the column index becomes a read of a constant 0, 1, 2.
// CHECK-LABEL: func.func private @one_hot
// CHECK: %[[IOTA:.*]] = arith.constant dense<[0, 1, 2]> : tensor<3xi64>
// CHECK: linalg.generic
// CHECK-SAME: ins(%{{.*}}, %[[IOTA]] : tensor<4xi64>, tensor<3xi64>)
// CHECK-NOT: linalg.index
// CHECK: arith.index_cast %{{.*}} : i64 to index
// CHECK: arith.cmpi eq
// CHECK: return
#row = affine_map<(d0, d1) -> (d0)>
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func private @one_hot(%t: tensor<4xi64>) -> tensor<4x3xf32> attributes {ca.kernel} {
  %one = arith.constant 1.0 : f32
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x3xf32>
  %r = linalg.generic {indexing_maps = [#row, #id], iterator_types = ["parallel", "parallel"]} ins(%t : tensor<4xi64>) outs(%e : tensor<4x3xf32>) {
  ^bb0(%in: i64, %out: f32):
    %i = arith.index_cast %in : i64 to index
    %j = linalg.index 1 : index
    %eq = arith.cmpi eq, %i, %j : index
    %v = arith.select %eq, %one, %zero : f32
    linalg.yield %v : f32
  } -> tensor<4x3xf32>
  return %r : tensor<4x3xf32>
}

// A loop whose size is not static keeps its linalg.index.
// CHECK-LABEL: func.func private @dynamic
// CHECK: linalg.index 0
func.func private @dynamic(%t: tensor<?xf32>) -> tensor<?xf32> attributes {ca.kernel} {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %t, %c0 : tensor<?xf32>
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%t : tensor<?xf32>) outs(%e : tensor<?xf32>) {
  ^bb0(%in: f32, %out: f32):
    %i = linalg.index 0 : index
    %c = arith.index_cast %i : index to i64
    %f = arith.sitofp %c : i64 to f32
    %v = arith.addf %in, %f : f32
    linalg.yield %v : f32
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}
