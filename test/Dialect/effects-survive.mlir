// RUN: ca-opt %s --pass-pipeline='builtin.module(func.func(canonicalize,cse),symbol-dce)' | FileCheck %s

// Accumulation and hooks have effects no result shows: MLIR's dead-code elimination (in
// canonicalize and cse) must keep them, even when nothing reads their results, and must
// not merge two identical ones.
// CHECK-LABEL: func.func @backward
// CHECK: "ca.hook"
// CHECK: "ca.hook"
// CHECK: "ca.accumulate_grad"
// CHECK: "ca.accumulate_grad"
// CHECK: "ca.hook"{{.*}}post_acc_grad_hook
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %0 = "ca.hook"(%g) {hook_id = 0 : i64, kind = "tensor_pre_hook"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %1 = "ca.hook"(%g) {hook_id = 0 : i64, kind = "tensor_pre_hook"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %g) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  "ca.accumulate_grad"(%p, %g) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  "ca.hook"(%p) {hook_id = 1 : i64, kind = "post_acc_grad_hook"} : (!torch.vtensor<[4],f32>) -> ()
  return
}
