// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-lower-to-linalg{twins=true})' | FileCheck %s

// With twins, the torch-dialect original of the kernel stays as a private function that
// is not a kernel: the runtime may run it through torch when that measures faster.
// CHECK-LABEL: func.func @backward
// CHECK: call @backward_kernel_0(%{{.*}}) : (tensor<4xf32>) -> tensor<4xf32>
// CHECK: func.func private @backward_kernel_0(%arg0: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel}
// CHECK: arith.negf
// CHECK: func.func private @backward_kernel_0__torch(%{{.*}}: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.torch_twin = "backward_kernel_0"}
// CHECK-NEXT: torch.aten.neg
func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
  %0 = call @backward_kernel_0(%g) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}
func.func private @backward_kernel_0(%a: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.kernel} {
  %0 = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}
