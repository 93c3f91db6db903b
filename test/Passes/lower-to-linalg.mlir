// RUN: ca-opt %s --split-input-file --ca-lower-to-linalg | FileCheck %s

// The kernel becomes linalg on builtin tensors; the host converts at the call.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[G:.*]]: !torch.vtensor<[4],f32>, %[[P:.*]]: !torch.vtensor<[4],f32>)
// CHECK-NEXT: %[[IN:.*]] = torch_c.to_builtin_tensor %[[G]] : !torch.vtensor<[4],f32> -> tensor<4xf32>
// CHECK-NEXT: %[[R:.*]] = call @backward_kernel_0(%[[IN]]) : (tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT: %[[OUT:.*]] = torch_c.from_builtin_tensor %[[R]] : tensor<4xf32> -> !torch.vtensor<[4],f32>
// CHECK-NEXT: "ca.accumulate_grad"(%[[P]], %[[OUT]])
// CHECK: func.func private @backward_kernel_0(%arg0: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel}
// CHECK: linalg.generic
// CHECK: arith.negf
// CHECK-NOT: torch.aten
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %0 = call @backward_kernel_0(%g) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}
func.func private @backward_kernel_0(%a: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.kernel} {
  %0 = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}

// -----

// A matmul against a transposed weight: torch-mlir writes the transpose out; the cpu
// backend folds it into the BLAS call later (see test/Passes/fuse-elementwise.mlir).
// CHECK-LABEL: func.func @backward(%arg0: !torch.vtensor<[3,2],f32>
// CHECK: func.func private @backward_kernel_0
// CHECK: linalg.transpose
// CHECK: linalg.fill
// CHECK: linalg.matmul
func.func @backward(%g: !torch.vtensor<[3,2],f32>, %w: !torch.vtensor<[8,2],f32>) -> !torch.vtensor<[3,8],f32> {
  %0 = call @backward_kernel_0(%g, %w) : (!torch.vtensor<[3,2],f32>, !torch.vtensor<[8,2],f32>) -> !torch.vtensor<[3,8],f32>
  return %0 : !torch.vtensor<[3,8],f32>
}
func.func private @backward_kernel_0(%g: !torch.vtensor<[3,2],f32>, %w: !torch.vtensor<[8,2],f32>) -> !torch.vtensor<[3,8],f32> attributes {ca.kernel} {
  %t = torch.aten.t %w : !torch.vtensor<[8,2],f32> -> !torch.vtensor<[2,8],f32>
  %0 = torch.aten.mm %g, %t : !torch.vtensor<[3,2],f32>, !torch.vtensor<[2,8],f32> -> !torch.vtensor<[3,8],f32>
  return %0 : !torch.vtensor<[3,8],f32>
}

// -----

// Without kernels the pass changes nothing.
// CHECK-LABEL: func.func @backward
// CHECK-NEXT: "ca.accumulate_grad"
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  "ca.accumulate_grad"(%p, %g) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}
