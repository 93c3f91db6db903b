// RUN: ca-opt %s --split-input-file --ca-host-result-layouts | FileCheck %s

// The flash-attention backward's gradients are (B, H, L, D) laid out as (B, L, H, D): the
// kernel that reads two of them takes their contiguous permutations, made on the host, and
// permutes them back itself; the accumulation still reads the third result itself.
// CHECK-LABEL: func.func @backward
// CHECK: %[[R:.*]]:3 = torch.operator "torch.aten._scaled_dot_product_flash_attention_for_cpu_backward"
// CHECK: %[[L:.*]] = torch.prim.ListConstruct %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} :
// CHECK-NEXT: %[[P0:.*]] = torch.aten.permute %[[R]]#0, %[[L]] {ca.host} : !torch.vtensor<[2,4,8,16],f32>, !torch.list<int> -> !torch.vtensor<[2,8,4,16],f32>
// CHECK: %[[P1:.*]] = torch.aten.permute %[[R]]#1, %{{.*}} {ca.host} : !torch.vtensor<[2,4,8,16],f32>, !torch.list<int> -> !torch.vtensor<[2,8,4,16],f32>
// CHECK: %[[K:.*]] = call @backward_kernel_0(%[[P0]], %[[P1]]) : (!torch.vtensor<[2,8,4,16],f32>, !torch.vtensor<[2,8,4,16],f32>) -> !torch.vtensor<[2,4,8,16],f32>
// CHECK: "ca.accumulate_grad"(%{{.*}}, %[[R]]#2)
// CHECK: func.func private @backward_kernel_0(%[[A:.*]]: !torch.vtensor<[2,8,4,16],f32>, %[[B:.*]]: !torch.vtensor<[2,8,4,16],f32>) -> !torch.vtensor<[2,4,8,16],f32>
// CHECK-DAG: %[[BA:.*]] = torch.aten.permute %[[A]], %{{.*}} : !torch.vtensor<[2,8,4,16],f32>, !torch.list<int> -> !torch.vtensor<[2,4,8,16],f32>
// CHECK-DAG: %[[BB:.*]] = torch.aten.permute %[[B]], %{{.*}} : !torch.vtensor<[2,8,4,16],f32>, !torch.list<int> -> !torch.vtensor<[2,4,8,16],f32>
// CHECK: torch.aten.add.Tensor %[[BA]], %[[BB]]
func.func @backward(%g: !torch.vtensor<[2,4,8,16],f32>, %q: !torch.vtensor<[2,4,8,16],f32>, %k: !torch.vtensor<[2,4,8,16],f32>, %v: !torch.vtensor<[2,4,8,16],f32>, %o: !torch.vtensor<[2,4,8,16],f32>, %lse: !torch.vtensor<[2,4,8],f32>, %leaf: !torch.vtensor<[2,4,8,16],f32>) -> !torch.vtensor<[2,4,8,16],f32> {
  %float0 = torch.constant.float 0.000000e+00
  %false = torch.constant.bool false
  %none = torch.constant.none
  %r:3 = torch.operator "torch.aten._scaled_dot_product_flash_attention_for_cpu_backward"(%g, %q, %k, %v, %o, %lse, %float0, %false, %none, %none) {ca.host} : (!torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8],f32>, !torch.float, !torch.bool, !torch.none, !torch.none) -> (!torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>)
  %s = call @backward_kernel_0(%r#0, %r#1) : (!torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>) -> !torch.vtensor<[2,4,8,16],f32>
  "ca.accumulate_grad"(%leaf, %r#2) : (!torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>) -> ()
  return %s : !torch.vtensor<[2,4,8,16],f32>
}
func.func private @backward_kernel_0(%a: !torch.vtensor<[2,4,8,16],f32>, %b: !torch.vtensor<[2,4,8,16],f32>) -> !torch.vtensor<[2,4,8,16],f32> attributes {ca.kernel} {
  %int1 = torch.constant.int 1
  %0 = torch.aten.add.Tensor %a, %b, %int1 : !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.int -> !torch.vtensor<[2,4,8,16],f32>
  return %0 : !torch.vtensor<[2,4,8,16],f32>
}

// -----

// A kernel called twice keeps its signature (one call could not change it alone), and an
// op outside the table is left as it is.
// CHECK-LABEL: func.func @backward
// CHECK-NOT: torch.aten.permute
// CHECK: call @backward_kernel_0(%{{.*}}#0) : (!torch.vtensor<[2,4,8,16],f32>)
// CHECK: call @backward_kernel_0(%{{.*}}#1) : (!torch.vtensor<[2,4,8,16],f32>)
// CHECK: call @backward_kernel_1(%{{.*}}) : (!torch.vtensor<[2,4,8,16],f32>)
// CHECK: func.func private @backward_kernel_0(%{{.*}}: !torch.vtensor<[2,4,8,16],f32>)
// CHECK-NOT: torch.aten.permute
func.func @backward(%g: !torch.vtensor<[2,4,8,16],f32>, %q: !torch.vtensor<[2,4,8,16],f32>, %k: !torch.vtensor<[2,4,8,16],f32>, %v: !torch.vtensor<[2,4,8,16],f32>, %o: !torch.vtensor<[2,4,8,16],f32>, %lse: !torch.vtensor<[2,4,8],f32>) -> (!torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>) {
  %float0 = torch.constant.float 0.000000e+00
  %false = torch.constant.bool false
  %none = torch.constant.none
  %r:3 = torch.operator "torch.aten._scaled_dot_product_flash_attention_for_cpu_backward"(%g, %q, %k, %v, %o, %lse, %float0, %false, %none, %none) {ca.host} : (!torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8],f32>, !torch.float, !torch.bool, !torch.none, !torch.none) -> (!torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>)
  %s0 = call @backward_kernel_0(%r#0) : (!torch.vtensor<[2,4,8,16],f32>) -> !torch.vtensor<[2,4,8,16],f32>
  %s1 = call @backward_kernel_0(%r#1) : (!torch.vtensor<[2,4,8,16],f32>) -> !torch.vtensor<[2,4,8,16],f32>
  %n = torch.aten.neg %g {ca.host} : !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,8,16],f32>
  %s2 = call @backward_kernel_1(%n) : (!torch.vtensor<[2,4,8,16],f32>) -> !torch.vtensor<[2,4,8,16],f32>
  return %s0, %s1, %s2 : !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>
}
func.func private @backward_kernel_0(%a: !torch.vtensor<[2,4,8,16],f32>) -> !torch.vtensor<[2,4,8,16],f32> attributes {ca.kernel} {
  %0 = torch.aten.neg %a : !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,8,16],f32>
  return %0 : !torch.vtensor<[2,4,8,16],f32>
}
func.func private @backward_kernel_1(%a: !torch.vtensor<[2,4,8,16],f32>) -> !torch.vtensor<[2,4,8,16],f32> attributes {ca.kernel} {
  %0 = torch.aten.neg %a : !torch.vtensor<[2,4,8,16],f32> -> !torch.vtensor<[2,4,8,16],f32>
  return %0 : !torch.vtensor<[2,4,8,16],f32>
}
