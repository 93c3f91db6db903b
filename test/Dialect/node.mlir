// RUN: ca-opt %s | ca-opt | FileCheck %s
// RUN: ca-opt %s --mlir-print-op-generic | ca-opt | FileCheck %s

// CHECK-LABEL: func.func @mm_backward
// CHECK-SAME: (%[[G:.*]]: !torch.vtensor<[4,8],f32>, %[[W:.*]]: !torch.vtensor<[8,8],f32>)
// CHECK: %[[R:.*]] = "ca.node"(%[[G]], %[[W]]) ({
// CHECK-NEXT: ^bb0(%[[A:.*]]: !torch.vtensor<[4,8],f32>, %[[B:.*]]: !torch.vtensor<[8,8],f32>):
// CHECK-NEXT: %[[MM:.*]] = torch.aten.mm %[[A]], %[[B]]
// CHECK-NEXT: "ca.yield"(%[[MM]]) : (!torch.vtensor<[4,8],f32>) -> ()
// CHECK-NEXT: }) {index = 1 : i64, node = "MmBackward0"}
// CHECK: return %[[R]]
func.func @mm_backward(%g: !torch.vtensor<[4,8],f32>, %w: !torch.vtensor<[8,8],f32>) -> !torch.vtensor<[4,8],f32> {
  %gx = "ca.node"(%g, %w) ({
  ^bb0(%go: !torch.vtensor<[4,8],f32>, %w0: !torch.vtensor<[8,8],f32>):
    %r = torch.aten.mm %go, %w0 : !torch.vtensor<[4,8],f32>, !torch.vtensor<[8,8],f32> -> !torch.vtensor<[4,8],f32>
    "ca.yield"(%r) : (!torch.vtensor<[4,8],f32>) -> ()
  }) {node = "MmBackward0", index = 1 : i64} : (!torch.vtensor<[4,8],f32>, !torch.vtensor<[8,8],f32>) -> !torch.vtensor<[4,8],f32>
  return %gx : !torch.vtensor<[4,8],f32>
}

// A node from an AOT-compiled region, several results, and builtin tensors (after lowering).
// CHECK-LABEL: func.func @aot_region
// CHECK: %[[R:.*]]:2 = "ca.node"
// CHECK: {aot = 0 : i64, index = 0 : i64, node = "CompiledFunctionBackward"} : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
// CHECK: return %[[R]]#0, %[[R]]#1
func.func @aot_region(%g: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %r:2 = "ca.node"(%g) ({
  ^bb0(%a: tensor<4xf32>):
    %n = arith.negf %a : tensor<4xf32>
    "ca.yield"(%a, %n) : (tensor<4xf32>, tensor<4xf32>) -> ()
  }) {node = "CompiledFunctionBackward", index = 0 : i64, aot = 0 : i64} : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  return %r#0, %r#1 : tensor<4xf32>, tensor<4xf32>
}

// A node with no inputs or outputs is legal (a node whose work is all side effects).
// CHECK-LABEL: func.func @empty
// CHECK: "ca.node"() ({
// CHECK-NEXT: "ca.yield"() : () -> ()
func.func @empty() {
  "ca.node"() ({
    "ca.yield"() : () -> ()
  }) {node = "NoopBackward", index = 7 : i64} : () -> ()
  return
}
