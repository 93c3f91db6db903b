// RUN: ca-opt %s --ca-narrow-scalar-inputs | FileCheck %s
// RUN: ca-opt %s --ca-narrow-scalar-inputs | ca-opt | FileCheck %s

// A Python float saved as a 0-d f64 tensor, rounded to f32 in two loops: rounded once.
// CHECK-LABEL: func.func private @scale
// CHECK: %[[N:.*]] = linalg.generic {{.*}} iterator_types = []} ins(%arg1 : tensor<f64>) outs(%{{.*}} : tensor<f32>)
// CHECK: arith.truncf
// CHECK: linalg.generic {{.*}} ins(%arg0, %[[N]] : tensor<8xf32>, tensor<f32>)
// CHECK-NOT: arith.truncf
// CHECK: arith.divf
// CHECK: linalg.generic {{.*}} ins(%{{.*}}, %[[N]] : tensor<8xf32>, tensor<f32>)
// CHECK: arith.mulf
// CHECK: return
#id = affine_map<(d0) -> (d0)>
#scalar = affine_map<(d0) -> ()>
func.func private @scale(%x: tensor<8xf32>, %s: tensor<f64>) -> (tensor<8xf32>, tensor<8xf32>) attributes {ca.kernel} {
  %e = tensor.empty() : tensor<8xf32>
  %r = linalg.generic {indexing_maps = [#id, #scalar, #id], iterator_types = ["parallel"]} ins(%x, %s : tensor<8xf32>, tensor<f64>) outs(%e : tensor<8xf32>) {
  ^bb0(%in: f32, %d: f64, %out: f32):
    %0 = arith.truncf %d : f64 to f32
    %1 = arith.divf %in, %0 : f32
    linalg.yield %1 : f32
  } -> tensor<8xf32>
  %q = linalg.generic {indexing_maps = [#id, #scalar, #id], iterator_types = ["parallel"]} ins(%r, %s : tensor<8xf32>, tensor<f64>) outs(%e : tensor<8xf32>) {
  ^bb0(%in: f32, %d: f64, %out: f32):
    %0 = arith.truncf %d : f64 to f32
    %1 = arith.mulf %in, %0 : f32
    linalg.yield %1 : f32
  } -> tensor<8xf32>
  return %r, %q : tensor<8xf32>, tensor<8xf32>
}

// Read as f64 (computed in f64, not only rounded): left alone.
// CHECK-LABEL: func.func private @wide
// CHECK: ins(%arg0, %arg1 : tensor<8xf64>, tensor<f64>)
// CHECK: arith.mulf %{{.*}}, %{{.*}} : f64
func.func private @wide(%x: tensor<8xf64>, %s: tensor<f64>) -> tensor<8xf64> attributes {ca.kernel} {
  %e = tensor.empty() : tensor<8xf64>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> ()>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%x, %s : tensor<8xf64>, tensor<f64>) outs(%e : tensor<8xf64>) {
  ^bb0(%in: f64, %d: f64, %out: f64):
    %0 = arith.mulf %in, %d : f64
    linalg.yield %0 : f64
  } -> tensor<8xf64>
  return %r : tensor<8xf64>
}

// Rounded to bf16 (an autocast region): one bf16 scalar.
// CHECK-LABEL: func.func private @to_bf16
// CHECK: linalg.generic {{.*}} ins(%arg1 : tensor<f64>) outs(%{{.*}} : tensor<bf16>)
// CHECK: arith.truncf %{{.*}} : f64 to bf16
// CHECK: ins(%arg0, %{{.*}} : tensor<8xbf16>, tensor<bf16>)
// CHECK-NOT: f64
// CHECK: return
func.func private @to_bf16(%x: tensor<8xbf16>, %s: tensor<f64>) -> tensor<8xbf16> attributes {ca.kernel} {
  %e = tensor.empty() : tensor<8xbf16>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> ()>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%x, %s : tensor<8xbf16>, tensor<f64>) outs(%e : tensor<8xbf16>) {
  ^bb0(%in: bf16, %d: f64, %out: bf16):
    %0 = arith.truncf %d : f64 to bf16
    %1 = arith.mulf %in, %0 : bf16
    linalg.yield %1 : bf16
  } -> tensor<8xbf16>
  return %r : tensor<8xbf16>
}
