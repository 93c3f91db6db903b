// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-unique-kernel-results)' | ca-opt | FileCheck %s

// A value returned twice and an argument returned as is: the kernel keeps one result, the
// host reads it twice and reads the argument directly.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[G:[a-z0-9]+]]: tensor<f32>, %[[H:[a-z0-9]+]]: tensor<4xf32>)
// CHECK: %[[R:.*]] = call @k(%[[G]], %[[H]]) : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>
// CHECK: return %[[R]], %[[R]], %[[H]] : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
// CHECK-LABEL: func.func private @k
// CHECK-SAME: -> tensor<4xf32> attributes {ca.kernel}
// CHECK: return %{{.*}} : tensor<4xf32>
#s = affine_map<(d0) -> ()>
#id = affine_map<(d0) -> (d0)>
func.func @backward(%g: tensor<f32>, %h: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %r:3 = call @k(%g, %h) : (tensor<f32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>)
  return %r#0, %r#1, %r#2 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
func.func private @k(%a: tensor<f32>, %b: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) attributes {ca.kernel} {
  %e = tensor.empty() : tensor<4xf32>
  %0 = linalg.generic {indexing_maps = [#s, #id], iterator_types = ["parallel"]} ins(%a : tensor<f32>) outs(%e : tensor<4xf32>) {
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  } -> tensor<4xf32>
  return %0, %0, %b : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
