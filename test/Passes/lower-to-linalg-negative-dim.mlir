// RUN: ca-opt %s --ca-lower-to-linalg | ca-opt | FileCheck %s

// A scatter with dim = -1 (torch.sort's backward) crashed torch-mlir's lowering (a
// segmentation fault, the whole process gone); the lowering makes the dim positive first.
// CHECK-LABEL: func.func private @backward_kernel_0
// CHECK-NOT: torch.aten
// CHECK: scf.for
// CHECK: return
func.func @backward(%g: !torch.vtensor<[20],f32>, %i: !torch.vtensor<[20],si64>, %p: !torch.vtensor<[20],f32>) {
  %0 = call @backward_kernel_0(%g, %i) : (!torch.vtensor<[20],f32>, !torch.vtensor<[20],si64>) -> !torch.vtensor<[20],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[20],f32>, !torch.vtensor<[20],f32>) -> ()
  return
}
func.func private @backward_kernel_0(%g: !torch.vtensor<[20],f32>, %i: !torch.vtensor<[20],si64>) -> !torch.vtensor<[20],f32> attributes {ca.kernel} {
  %int-1 = torch.constant.int -1
  %0 = torch.aten.neg %g : !torch.vtensor<[20],f32> -> !torch.vtensor<[20],f32>
  %1 = torch.aten.scatter.src %0, %int-1, %i, %g : !torch.vtensor<[20],f32>, !torch.int, !torch.vtensor<[20],si64>, !torch.vtensor<[20],f32> -> !torch.vtensor<[20],f32>
  return %1 : !torch.vtensor<[20],f32>
}
