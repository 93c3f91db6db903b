// RUN: ca-opt %s --split-input-file --ca-lower-to-linalg | ca-opt --split-input-file | FileCheck %s

// An op the lowering cannot convert moves to the host, marked `ca.host`, and the lowering
// carries on: the ops before and after it become kernels of their own. The module records
// what moved. Here: an op torch-mlir does not know, and cumsum, whose tm_tensor.scan
// camlir cannot lower (found from the locations of what was left, not from error text).
// CHECK: module attributes {ca.host_ops = ["aten.camlir_no_such_op"]}
// CHECK-LABEL: func.func @backward
// CHECK: %[[A:.*]] = call @backward_kernel_0(%{{.*}}) : (tensor<4xf32>) -> tensor<4xf32>
// CHECK: %[[B:.*]] = torch_c.from_builtin_tensor %[[A]]
// CHECK: %[[C:.*]] = torch.operator "torch.aten.camlir_no_such_op"(%[[B]]) {ca.host}
// CHECK: %[[D:.*]] = torch_c.to_builtin_tensor %[[C]]
// CHECK: call @backward_kernel_1(%[[D]])
// CHECK: "ca.accumulate_grad"
// CHECK-DAG: func.func private @backward_kernel_0({{.*}}) -> tensor<4xf32> attributes {ca.kernel}
// CHECK-DAG: func.func private @backward_kernel_1({{.*}}) -> tensor<4xf32> attributes {ca.kernel}
// CHECK-NOT: torch.aten
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %0 = call @backward_kernel_0(%g) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}
func.func private @backward_kernel_0(%a: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.kernel} {
  %0 = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.operator "torch.aten.camlir_no_such_op"(%0) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %2 = torch.aten.neg %1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %2 : !torch.vtensor<[4],f32>
}

// -----

// CHECK: module attributes {ca.host_ops = ["aten.cumsum"]}
// CHECK-LABEL: func.func @backward
// CHECK: call @backward_kernel_0
// CHECK: torch.aten.cumsum {{.*}} {ca.host}
// CHECK: call @backward_kernel_1
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %0 = call @backward_kernel_0(%g) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}
func.func private @backward_kernel_0(%a: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.kernel} {
  %int0 = torch.constant.int 0
  %none = torch.constant.none
  %0 = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.cumsum %0, %int0, %none : !torch.vtensor<[4],f32>, !torch.int, !torch.none -> !torch.vtensor<[4],f32>
  %2 = torch.aten.exp %1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %2 : !torch.vtensor<[4],f32>
}
