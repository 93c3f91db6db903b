// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-specialize-layouts{perms=0:1x0})' | ca-opt --split-input-file | FileCheck %s
// RUN: not ca-opt %s --pass-pipeline='builtin.module(ca-specialize-layouts{perms=0:1x1})' 2>&1 | FileCheck %s --check-prefix=BAD

// Argument 0 arrives as its contiguous transpose ([3,4]) and is permuted back in the IR.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[W:[a-z0-9]+]]: !torch.vtensor<[3,4],f32>, %{{[a-z0-9]+}}: !torch.vtensor<[4,3],f32>)
// CHECK: %[[L:[0-9]+]] = torch.prim.ListConstruct
// CHECK: %[[P:[0-9]+]] = torch.aten.permute %[[W]], %[[L]] : !torch.vtensor<[3,4],f32>, !torch.list<int> -> !torch.vtensor<[4,3],f32>
// CHECK: torch.aten.mul.Tensor %[[P]]
// BAD: error: ca-specialize-layouts: '0:1x1' is not 'ARG:P0xP1...' with a permutation
func.func @backward(%w: !torch.vtensor<[4,3],f32>, %p: !torch.vtensor<[4,3],f32>) {
  %0 = torch.aten.mul.Tensor %w, %w : !torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32>) -> ()
  return
}


// -----

// Dynamic dims are permuted like static ones (a program compiled with dynamic dims).
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[W:[a-z0-9]+]]: !torch.vtensor<[3,?],f32>
// CHECK: torch.aten.permute %[[W]], %{{[0-9]+}} : !torch.vtensor<[3,?],f32>, !torch.list<int> -> !torch.vtensor<[?,3],f32>
func.func @backward(%w: !torch.vtensor<[?,3],f32>, %p: !torch.vtensor<[?,3],f32>) {
  %0 = torch.aten.mul.Tensor %w, %w : !torch.vtensor<[?,3],f32>, !torch.vtensor<[?,3],f32> -> !torch.vtensor<[?,3],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[?,3],f32>, !torch.vtensor<[?,3],f32>) -> ()
  return
}
