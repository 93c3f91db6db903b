// RUN: ca-opt %s --split-input-file --ca-outline-kernels | FileCheck %s

// A hook is a barrier: compute before it and after it become two kernels. The
// accumulation of the first kernel's result moves after that kernel's call.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[G:.*]]: !torch.vtensor<[4],f32>, %[[P:.*]]: !torch.vtensor<[4],f32>)
// CHECK-NEXT: %[[K0:.*]] = call @backward_kernel_0(%[[G]])
// CHECK-NEXT: "ca.accumulate_grad"(%[[P]], %[[K0]])
// CHECK-NEXT: %[[H:.*]] = "ca.hook"(%[[K0]])
// CHECK-NEXT: %[[K1:.*]] = call @backward_kernel_1(%[[H]], %[[G]])
// CHECK-NEXT: "ca.accumulate_grad"(%[[P]], %[[K1]])
// CHECK-NEXT: return
// CHECK: func.func private @backward_kernel_0(%[[A:.*]]: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.kernel}
// CHECK-NEXT: %[[N:.*]] = torch.aten.neg %[[A]]
// CHECK-NEXT: return %[[N]]
// CHECK: func.func private @backward_kernel_1({{.*}}) -> !torch.vtensor<[4],f32> attributes {ca.kernel}
// CHECK: torch.aten.mul.Tensor
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %0 = torch.aten.neg %g : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  %1 = "ca.hook"(%0) {hook_id = 0 : i64, kind = "tensor_pre_hook"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %2 = torch.aten.mul.Tensor %1, %g : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %2) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}

// -----

// Accumulation does not cut a run: both accumulations follow the one kernel, in their
// order. Constants stay on the host only while the host uses them; kernels get copies.
// CHECK-LABEL: func.func @backward
// CHECK-NOT: torch.constant
// CHECK: %[[K:.*]]:2 = call @backward_kernel_0
// CHECK-NEXT: "ca.accumulate_grad"(%{{.*}}, %[[K]]#0)
// CHECK-NEXT: "ca.accumulate_grad"(%{{.*}}, %[[K]]#1)
// CHECK-NEXT: return
// CHECK: func.func private @backward_kernel_0
// CHECK: torch.constant.int 2
// CHECK: torch.aten.mul.Scalar
// CHECK: torch.aten.add.Tensor
// CHECK-NOT: func.func private @backward_kernel_1
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>, %q: !torch.vtensor<[4],f32>) {
  %int2 = torch.constant.int 2
  %0 = torch.aten.mul.Scalar %g, %int2 : !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  %1 = torch.aten.add.Tensor %0, %g, %int2 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%q, %1) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}

// -----

// An extern op (no lowering: see docs/op-coverage.md) stays on the host between kernels.
// CHECK-LABEL: func.func @backward
// CHECK: call @backward_kernel_0
// CHECK-NEXT: torch.operator "torch.aten._scaled_dot_product_flash_attention_for_cpu_backward"
// CHECK-NEXT: call @backward_kernel_1
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %0 = torch.aten.neg %g : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.operator "torch.aten._scaled_dot_product_flash_attention_for_cpu_backward"(%0) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %2 = torch.aten.neg %1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %2) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}

// -----

// Compute nobody reads is dropped rather than outlined.
// CHECK-LABEL: func.func @backward
// CHECK-NEXT: return
// CHECK-NOT: ca.kernel
func.func @backward(%g: !torch.vtensor<[4],f32>) {
  %0 = torch.aten.neg %g : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return
}


// -----

// A symbolic capture's lifted size: the list that reads it is cloned into the kernel, and
// the size (a host scalar, not cloneable) becomes a kernel argument.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[G:[a-z0-9]+]]: !torch.vtensor<[],f32>, %[[S:[a-z0-9]+]]: !torch.int, %[[P:[a-z0-9]+]]: !torch.vtensor<[?,3],f32>)
// CHECK-NEXT: %[[N:.*]] = "ca.size"(%[[S]])
// CHECK-NEXT: %[[K:.*]] = call @backward_kernel_0(%[[G]], %[[N]]) : (!torch.vtensor<[],f32>, !torch.int) -> !torch.vtensor<[?,3],f32>
// CHECK-NEXT: "ca.accumulate_grad"(%[[P]], %[[K]])
// CHECK: func.func private @backward_kernel_0(%[[A:[a-z0-9]+]]: !torch.vtensor<[],f32>, %[[B:[a-z0-9]+]]: !torch.int) -> !torch.vtensor<[?,3],f32> attributes {ca.kernel}
// CHECK: torch.prim.ListConstruct %[[B]], %{{.*}} : (!torch.int, !torch.int) -> !torch.list<int>
// CHECK: torch.aten.expand %[[A]]
func.func @backward(%g: !torch.vtensor<[],f32>, %s: !torch.int, %p: !torch.vtensor<[?,3],f32>) {
  %n = "ca.size"(%s) {index = 0 : i64} : (!torch.int) -> !torch.int
  %int3 = torch.constant.int 3
  %l = torch.prim.ListConstruct %n, %int3 : (!torch.int, !torch.int) -> !torch.list<int>
  %false = torch.constant.bool false
  %0 = torch.aten.expand %g, %l, %false : !torch.vtensor<[],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[?,3],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[?,3],f32>, !torch.vtensor<[?,3],f32>) -> ()
  return
}
