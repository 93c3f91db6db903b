// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-unique-kernel-results)' | FileCheck %s

// A kernel's torch twin (ca-lower-to-linalg{twins=true}) returns what the kernel keeps:
// here the first of two equal results, not the argument returned as is.
// CHECK-LABEL: func.func private @k(
// CHECK-SAME: -> tensor<4xf32> attributes {ca.kernel}
// CHECK-LABEL: func.func private @k__torch(
// CHECK-SAME: -> !torch.vtensor<[4],f32> attributes {ca.torch_twin = "k"}
// CHECK: %[[N:.*]] = torch.aten.neg
// CHECK-NEXT: return %[[N]] : !torch.vtensor<[4],f32>
#id = affine_map<(d0) -> (d0)>
func.func @backward(%h: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %r:3 = call @k(%h) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>)
  return %r#0, %r#1, %r#2 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
func.func private @k(%b: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) attributes {ca.kernel} {
  %e = tensor.empty() : tensor<4xf32>
  %0 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%b : tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %n = arith.negf %in : f32
    linalg.yield %n : f32
  } -> tensor<4xf32>
  return %0, %0, %b : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
func.func private @k__torch(%b: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) attributes {ca.torch_twin = "k"} {
  %0 = torch.aten.neg %b : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %0, %0, %b : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}
