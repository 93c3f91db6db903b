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

// Booleans cross the boundary as bytes: a vector<8xi1> load would read packed bits.
// CHECK-LABEL: func.func public @mask(
// CHECK-SAME: %[[M:[a-z0-9]+]]: tensor<4xi8> {bufferization.writable = false}
// CHECK-SAME: -> tensor<4xi8>
// CHECK: %[[B:.*]] = arith.trunci %[[M]] : tensor<4xi8> to tensor<4xi1>
// CHECK: %[[N:.*]] = arith.xori %[[B]]
// CHECK: %[[R:.*]] = arith.extui %[[N]] : tensor<4xi1> to tensor<4xi8>
// CHECK: return %[[R]] : tensor<4xi8>
func.func private @mask(%m: tensor<4xi1>) -> tensor<4xi1> attributes {ca.kernel} {
  %t = arith.constant dense<true> : tensor<4xi1>
  %n = arith.xori %m, %t : tensor<4xi1>
  return %n : tensor<4xi1>
}

// A loop reading the mask takes the byte and truncates it in its body: no i1 buffer.
// CHECK-LABEL: func.func public @select(
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<4xi8> {bufferization.writable = false}
// CHECK: ^bb0(%[[IN:.*]]: i8, %{{.*}}: f32, %{{.*}}: f32):
// CHECK-NEXT: %[[BIT:.*]] = arith.trunci %[[IN]] : i8 to i1
// CHECK-NEXT: arith.select %[[BIT]]
#id = affine_map<(d0) -> (d0)>
func.func private @select(%m: tensor<4xi1>, %x: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel} {
  %e = tensor.empty() : tensor<4xf32>
  %zero = arith.constant 0.0 : f32
  %0 = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
      ins(%m, %x : tensor<4xi1>, tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%b: i1, %v: f32, %o: f32):
    %s = arith.select %b, %v, %zero : f32
    linalg.yield %s : f32
  } -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// A scalar argument (a lifted size of a kernel with dynamic dims) gets no attribute.
// CHECK-LABEL: func.func public @sized(
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<?x3xf32> {bufferization.writable = false}, %{{[a-z0-9]+}}: i64)
func.func private @sized(%a: tensor<?x3xf32>, %n: i64) -> tensor<?x3xf32> attributes {ca.kernel} {
  return %a : tensor<?x3xf32>
}
