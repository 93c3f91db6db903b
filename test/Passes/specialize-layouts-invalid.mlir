// RUN: ca-opt %s --verify-diagnostics --pass-pipeline='builtin.module(ca-specialize-layouts{perms=0:1x0})'

// An argument that a ca op uses as itself (the leaf whose .grad is written) cannot be
// passed as a permuted view: its gradient would land on the view.
// expected-error@+1 {{argument is used as itself by a ca op}}
func.func @backward(%w: !torch.vtensor<[4,3],f32>, %g: !torch.vtensor<[4,3],f32>) {
  "ca.accumulate_grad"(%w, %g) : (!torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32>) -> ()
  return
}
