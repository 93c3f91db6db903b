// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-prepare-kernel-abi)' | ca-opt | FileCheck %s

// Kernels become public C-interface functions whose arguments bufferization may not write;
// other functions are left alone.
// CHECK-LABEL: func.func public @k(
// CHECK-SAME: {bufferization.writable = false}
// CHECK-SAME: attributes {ca.kernel, llvm.emit_c_interface}
// CHECK-LABEL: func.func private @helper(
// CHECK-NOT: bufferization.writable
func.func private @k(%a: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel} {
  return %a : tensor<4xf32>
}
func.func private @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
