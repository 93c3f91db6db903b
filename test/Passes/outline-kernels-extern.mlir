// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-outline-kernels{extern-ops=aten.cumsum})' | FileCheck %s --check-prefix=EXTERN
// An op named in `extern-ops` is kept on the host like the built-in extern ops, and marked
// `ca.host`, so that ca-lower-to-linalg's outlining after a move to the host keeps it there.
// EXTERN-LABEL: func.func @backward
// EXTERN: call @backward_kernel_0
// EXTERN-NEXT: torch.aten.cumsum {{.*}} {ca.host}
// EXTERN-NEXT: call @backward_kernel_1
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %int0 = torch.constant.int 0
  %none = torch.constant.none
  %0 = torch.aten.neg %g : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %1 = torch.aten.cumsum %0, %int0, %none : !torch.vtensor<[4],f32>, !torch.int, !torch.none -> !torch.vtensor<[4],f32>
  %2 = torch.aten.neg %1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %2) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}
