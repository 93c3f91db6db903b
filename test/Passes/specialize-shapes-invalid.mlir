// RUN: ca-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(ca-specialize-shapes{sizes=10 shapes=0:3x4})'

// expected-error@+1 {{argument 0 has static dim 2, shapes gives 3}}
func.func @backward(%x: !torch.vtensor<[2,4],f32>) {
  return
}

// -----

func.func @backward(%x: !torch.vtensor<[?,4],f32>, %s: !torch.int, %t: !torch.int) {
  %a = "ca.size"(%s) {index = 0 : i64} : (!torch.int) -> !torch.int
  // expected-error@+1 {{ca.size #1 has no value in sizes=10}}
  %b = "ca.size"(%t) {index = 1 : i64} : (!torch.int) -> !torch.int
  return
}
