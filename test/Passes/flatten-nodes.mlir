// RUN: ca-opt %s --split-input-file --ca-flatten-nodes | FileCheck %s
// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-flatten-nodes{keep-provenance=false})' | FileCheck %s --check-prefix=NOPROV

// One node: the body replaces the node, block arguments become the node's operands.
// CHECK-LABEL: func.func @one_node
// CHECK-SAME: (%[[G:.*]]: !torch.vtensor<[4],f32>)
// CHECK-NOT: ca.node
// CHECK: %[[N:.*]] = torch.aten.neg %[[G]] {ca.provenance = "NegBackward0#0"}
// CHECK-NOT: ca.yield
// CHECK: return %[[N]]
// NOPROV-LABEL: func.func @one_node
// NOPROV: torch.aten.neg %{{.*}} : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
// NOPROV-NOT: ca.provenance
func.func @one_node(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %r = "ca.node"(%g) ({
  ^bb0(%a: !torch.vtensor<[4],f32>):
    %n = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
    "ca.yield"(%n) : (!torch.vtensor<[4],f32>) -> ()
  }) {node = "NegBackward0", index = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %r : !torch.vtensor<[4],f32>
}

// -----

// Two chained nodes (the second from an AOT region), a pass-through result, and the
// runtime ops around them, which stay in place and in order.
// CHECK-LABEL: func.func @chain
// CHECK-SAME: (%[[G:.*]]: !torch.vtensor<[4],f32>, %[[P:.*]]: !torch.vtensor<[4],f32>)
// CHECK: %[[A:.*]] = torch.aten.neg %[[G]] {ca.provenance = "NegBackward0#0"}
// CHECK: %[[B:.*]] = torch.aten.mul.Tensor %[[A]], %[[A]] {ca.provenance = "aot0:MulBackward0#1"}
// CHECK: %[[H:.*]] = "ca.hook"(%[[B]])
// CHECK: "ca.accumulate_grad"(%[[P]], %[[H]])
// CHECK: return %[[A]]
func.func @chain(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %r = "ca.node"(%g) ({
  ^bb0(%a: !torch.vtensor<[4],f32>):
    %n = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
    "ca.yield"(%n) : (!torch.vtensor<[4],f32>) -> ()
  }) {node = "NegBackward0", index = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %s:2 = "ca.node"(%r) ({
  ^bb0(%a: !torch.vtensor<[4],f32>):
    %m = torch.aten.mul.Tensor %a, %a : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
    "ca.yield"(%m, %a) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  }) {node = "MulBackward0", index = 1 : i64, aot = 0 : i64} : (!torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>)
  %h = "ca.hook"(%s#0) {kind = "tensor_pre_hook", hook_id = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %h) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return %s#1 : !torch.vtensor<[4],f32>
}

// -----

// Nothing to do without nodes.
// CHECK-LABEL: func.func @no_nodes
// CHECK-NEXT: return
func.func @no_nodes() {
  return
}
