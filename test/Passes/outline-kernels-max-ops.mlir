// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-outline-kernels{max-ops=3})' | FileCheck %s

// A run longer than max-ops is cut into as few kernels as fit (5 ops, 3 at most: two).
// The even cut would fall after the second op, where two values (%0 and %1) cross it;
// one op later only %2 does, so the cut goes there and the first kernel takes three ops.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[G:.*]]: !torch.vtensor<[4],f32>, %[[P:.*]]: !torch.vtensor<[4],f32>)
// CHECK-NEXT: %[[K0:.*]] = call @backward_kernel_0(%[[G]]) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
// CHECK-NEXT: %[[K1:.*]] = call @backward_kernel_1(%[[K0]])
// CHECK-NEXT: "ca.accumulate_grad"(%[[P]], %[[K1]])
// CHECK-NEXT: return
// CHECK: func.func private @backward_kernel_0
// CHECK-NEXT: torch.aten.neg
// CHECK-NEXT: torch.aten.exp
// CHECK-NEXT: torch.aten.mul.Tensor
// CHECK-NEXT: return
// CHECK: func.func private @backward_kernel_1
// CHECK-NEXT: torch.aten.neg
// CHECK-NEXT: torch.aten.exp
// CHECK-NEXT: return
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %0 = torch.aten.neg %g : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.exp %g : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %2 = torch.aten.mul.Tensor %0, %1 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %3 = torch.aten.neg %2 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %4 = torch.aten.exp %3 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %4) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}

// -----

// Seven ops, 3 at most: three kernels (2 + 2 + 3: every cut in reach is crossed by as
// many values, so the even ones stay). %2, read across the second cut, is an output of
// the second kernel and an input of the third.
// CHECK-LABEL: func.func @backward
// CHECK-NEXT: %[[A:.*]] = call @backward_kernel_0
// CHECK-NEXT: %[[B:.*]]:2 = call @backward_kernel_1
// CHECK-NEXT: %[[C:.*]] = call @backward_kernel_2
// CHECK-NEXT: "ca.accumulate_grad"
// CHECK-NEXT: return
// CHECK-COUNT-3: attributes {ca.kernel}
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %0 = torch.aten.neg %g : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.exp %0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %2 = torch.aten.sin %1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %3 = torch.aten.cos %2 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %4 = torch.aten.tanh %3 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %5 = torch.aten.mul.Tensor %4, %2 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %6 = torch.aten.neg %5 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %6) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}
