// RUN: ca-opt %s --verify-diagnostics --ca-lower-to-linalg=function=host

// With no host function to move it to, an op torch-mlir cannot lower is named in the error.
func.func @backward(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %0 = call @backward_kernel_0(%g) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}
// expected-error@+1 {{not converted: aten.camlir_no_such_op}}
func.func private @backward_kernel_0(%a: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.kernel} {
  %0 = torch.operator "torch.aten.camlir_no_such_op"(%a) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %0 : !torch.vtensor<[4],f32>
}
