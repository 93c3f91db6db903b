// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-specialize-shapes{sizes=10 shapes=1:10x4})' | FileCheck %s
// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-specialize-shapes{sizes=? shapes=1:?x4})' | FileCheck %s --check-prefix=DYN

// The batch size becomes 10 everywhere; the shape check it made trivially true goes.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: %{{.*}}: !torch.vtensor<[10,4],f32>
// CHECK-NOT: ca.size
// CHECK-NOT: torch.runtime.assert
// CHECK: torch.aten.expand {{.*}} -> !torch.vtensor<[10,2],f32>
// CHECK: torch.aten.mm {{.*}} -> !torch.vtensor<[2,4],f32>
// CHECK: "ca.accumulate_grad"(%{{.*}}, %{{.*}}) : (!torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32>) -> ()
// A dim marked dynamic stays `?`, and its check stays.
// DYN-LABEL: func.func @backward
// DYN-SAME: %{{.*}}: !torch.vtensor<[?,4],f32>
// DYN: "ca.size"
// DYN: torch.runtime.assert
// DYN: torch.aten.expand {{.*}} -> !torch.vtensor<[?,2],f32>
func.func @backward(%g: !torch.vtensor<[],f32>, %x: !torch.vtensor<[?,4],f32>, %p: !torch.vtensor<[2,4],f32>, %s: !torch.int) {
  %n = "ca.size"(%s) {index = 0 : i64} : (!torch.int) -> !torch.int
  %int0 = torch.constant.int 0
  %int2 = torch.constant.int 2
  %false = torch.constant.bool false
  %d = torch.aten.size.int %x, %int0 : !torch.vtensor<[?,4],f32>, !torch.int -> !torch.int
  %eq = torch.aten.eq.int %d, %n : !torch.int, !torch.int -> !torch.bool
  torch.runtime.assert %eq, "batch mismatch"
  %l = torch.prim.ListConstruct %n, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %e = torch.aten.expand %g, %l, %false : !torch.vtensor<[],f32>, !torch.list<int>, !torch.bool -> !torch.vtensor<[?,2],f32>
  %t = torch.aten.t %e : !torch.vtensor<[?,2],f32> -> !torch.vtensor<[2,?],f32>
  %w = torch.aten.mm %t, %x : !torch.vtensor<[2,?],f32>, !torch.vtensor<[?,4],f32> -> !torch.vtensor<[2,4],f32>
  "ca.accumulate_grad"(%p, %w) : (!torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32>) -> ()
  return
}
