// RUN: ca-opt %s --split-input-file --ca-inline-hooks | FileCheck %s
// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-inline-hooks{wrap-in-node=false})' | FileCheck %s --check-prefix=BARE

// A traced `g * 0.5`: the call becomes a `hook` node holding the body; the body function,
// now unreferenced, is erased.
// CHECK-NOT: func.func private @hook_0
// CHECK-LABEL: func.func @scaled
// CHECK-SAME: (%[[P:.*]]: !torch.vtensor<[4],f32>, %[[G:.*]]: !torch.vtensor<[4],f32>)
// CHECK-NOT: ca.hook
// CHECK: %[[H:.*]] = "ca.node"(%[[G]]) ({
// CHECK-NEXT: ^bb0(%[[A:.*]]: !torch.vtensor<[4],f32>):
// CHECK-NEXT: %[[HALF:.*]] = torch.constant.float 5.000000e-01
// CHECK-NEXT: %[[M:.*]] = torch.aten.mul.Scalar %[[A]], %[[HALF]]
// CHECK-NEXT: "ca.yield"(%[[M]])
// CHECK-NEXT: }) {index = 0 : i64, node = "hook"}
// CHECK-NEXT: "ca.accumulate_grad"(%[[P]], %[[H]])
// CHECK-NOT: func.func
// BARE-LABEL: func.func @scaled
// BARE-SAME: (%[[P:.*]]: !torch.vtensor<[4],f32>, %[[G:.*]]: !torch.vtensor<[4],f32>)
// BARE-NOT: ca.node
// BARE: %[[HALF:.*]] = torch.constant.float 5.000000e-01 {ca.provenance = "hook#0"}
// BARE-NEXT: %[[M:.*]] = torch.aten.mul.Scalar %[[G]], %[[HALF]] {ca.provenance = "hook#0"}
// BARE-NEXT: "ca.accumulate_grad"(%[[P]], %[[M]])
func.func private @hook_0(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %half = torch.constant.float 5.000000e-01
  %r = torch.aten.mul.Scalar %g, %half : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  return %r : !torch.vtensor<[4],f32>
}
func.func @scaled(%p: !torch.vtensor<[4],f32>, %g: !torch.vtensor<[4],f32>) {
  %h = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_0} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %h) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}

// -----

// Negative: a hook without a body (it could not be traced, e.g. it prints) stays a call.
// CHECK-LABEL: func.func @untraced
// CHECK: %[[H:.*]] = "ca.hook"(%{{.*}}) {hook_id = 0 : i64, kind = "tensor_pre_hook"}
// CHECK-NEXT: "ca.accumulate_grad"(%{{.*}}, %[[H]])
// CHECK-NOT: ca.node
func.func @untraced(%p: !torch.vtensor<[4],f32>, %g: !torch.vtensor<[4],f32>) {
  %h = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %h) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}

// -----

// Two hooks sharing one body: both are inlined, each with its own id, then the body goes.
// CHECK-NOT: @hook_neg
// CHECK-LABEL: func.func @shared
// CHECK-SAME: (%[[G1:.*]]: !torch.vtensor<[3],f32>, %[[G2:.*]]: !torch.vtensor<[3],f32>)
// CHECK: %[[A:.*]] = "ca.node"(%[[G1]])
// CHECK: torch.aten.neg
// CHECK: {index = 1 : i64, node = "hook"}
// CHECK: %[[B:.*]] = "ca.node"(%[[G2]])
// CHECK: torch.aten.neg
// CHECK: {index = 2 : i64, node = "hook"}
// CHECK-NOT: ca.hook
// CHECK: return %[[A]], %[[B]]
// CHECK-NOT: @hook_neg
func.func private @hook_neg(%g: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %r = torch.aten.neg %g : !torch.vtensor<[3],f32> -> !torch.vtensor<[3],f32>
  return %r : !torch.vtensor<[3],f32>
}
func.func @shared(%g1: !torch.vtensor<[3],f32>, %g2: !torch.vtensor<[3],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) {
  %a = "ca.hook"(%g1) {kind = "tensor_pre_hook", hook_id = 1 : i64, body = @hook_neg} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  %b = "ca.hook"(%g2) {kind = "tensor_pre_hook", hook_id = 2 : i64, body = @hook_neg} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %a, %b : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>
}

// -----

// Negative: a post_acc_grad_hook is a side effect on param.grad; it stays, after the
// accumulation it observes, while the tensor hook before it is inlined.
// CHECK-LABEL: func.func @post_acc_grad
// CHECK: %[[N:.*]] = "ca.node"
// CHECK: node = "hook"
// CHECK-NEXT: "ca.accumulate_grad"(%[[P:.*]], %[[N]])
// CHECK-NEXT: "ca.hook"(%[[P]]) {hook_id = 1 : i64, kind = "post_acc_grad_hook"}
// CHECK-NEXT: return
func.func private @hook_0(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %r = torch.aten.neg %g : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %r : !torch.vtensor<[4],f32>
}
func.func @post_acc_grad(%p: !torch.vtensor<[4],f32>, %g: !torch.vtensor<[4],f32>) {
  %h = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_0} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %h) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  "ca.hook"(%p) {kind = "post_acc_grad_hook", hook_id = 1 : i64} : (!torch.vtensor<[4],f32>) -> ()
  return
}

// -----

// Order: the inlined body sits where the hook was, between the node producing its
// gradient and the accumulation consuming it; the untraced hook after it stays in place.
// CHECK-LABEL: func.func @ordered
// CHECK: %[[MM:.*]] = "ca.node"
// CHECK: node = "MulBackward0"
// CHECK-NEXT: %[[H:.*]] = "ca.node"(%[[MM]])
// CHECK: torch.aten.add.Tensor
// CHECK: node = "hook"
// CHECK-NEXT: "ca.accumulate_grad"(%{{.*}}, %[[H]])
// CHECK-NEXT: %[[K:.*]] = "ca.hook"(%[[MM]]) {hook_id = 1 : i64, kind = "tensor_pre_hook"}
// CHECK-NEXT: "ca.accumulate_grad"(%{{.*}}, %[[K]])
// CHECK-NEXT: return
func.func private @hook_0(%g: !torch.vtensor<[2,2],f32>) -> !torch.vtensor<[2,2],f32> {
  %one = torch.constant.int 1
  %r = torch.aten.add.Tensor %g, %g, %one : !torch.vtensor<[2,2],f32>, !torch.vtensor<[2,2],f32>, !torch.int -> !torch.vtensor<[2,2],f32>
  return %r : !torch.vtensor<[2,2],f32>
}
func.func @ordered(%w: !torch.vtensor<[2,2],f32>, %v: !torch.vtensor<[2,2],f32>, %g: !torch.vtensor<[2,2],f32>) {
  %m = "ca.node"(%g) ({
  ^bb0(%a: !torch.vtensor<[2,2],f32>):
    %n = torch.aten.mul.Tensor %a, %a : !torch.vtensor<[2,2],f32>, !torch.vtensor<[2,2],f32> -> !torch.vtensor<[2,2],f32>
    "ca.yield"(%n) : (!torch.vtensor<[2,2],f32>) -> ()
  }) {node = "MulBackward0", index = 0 : i64} : (!torch.vtensor<[2,2],f32>) -> !torch.vtensor<[2,2],f32>
  %h = "ca.hook"(%m) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_0} : (!torch.vtensor<[2,2],f32>) -> !torch.vtensor<[2,2],f32>
  "ca.accumulate_grad"(%w, %h) : (!torch.vtensor<[2,2],f32>, !torch.vtensor<[2,2],f32>) -> ()
  %k = "ca.hook"(%m) {kind = "tensor_pre_hook", hook_id = 1 : i64} : (!torch.vtensor<[2,2],f32>) -> !torch.vtensor<[2,2],f32>
  "ca.accumulate_grad"(%v, %k) : (!torch.vtensor<[2,2],f32>, !torch.vtensor<[2,2],f32>) -> ()
  return
}

// -----

// A hook that returned None traces to a body returning its argument: no node is left, the
// accumulation reads the gradient directly.
// CHECK-LABEL: func.func @unchanged
// CHECK-SAME: (%[[P:.*]]: !torch.vtensor<[4],f32>, %[[G:.*]]: !torch.vtensor<[4],f32>)
// CHECK-NEXT: "ca.accumulate_grad"(%[[P]], %[[G]])
// CHECK-NEXT: return
func.func private @hook_0(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  return %g : !torch.vtensor<[4],f32>
}
func.func @unchanged(%p: !torch.vtensor<[4],f32>, %g: !torch.vtensor<[4],f32>) {
  %h = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_0} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %h) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}

// -----

// A module pre_hook with two gradients; a public body is inlined but kept (it may be used
// from outside the module).
// CHECK: func.func @pre_body
// CHECK-LABEL: func.func @pre(
// CHECK: %[[N:.*]]:2 = "ca.node"(%{{.*}}, %{{.*}})
// CHECK: node = "hook"
// CHECK: return %[[N]]#0, %[[N]]#1
func.func @pre_body(%a: !torch.vtensor<[2],f32>, %b: !torch.vtensor<[3],f32>) -> (!torch.vtensor<[2],f32>, !torch.vtensor<[3],f32>) {
  %na = torch.aten.neg %a : !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
  return %na, %b : !torch.vtensor<[2],f32>, !torch.vtensor<[3],f32>
}
func.func @pre(%a: !torch.vtensor<[2],f32>, %b: !torch.vtensor<[3],f32>) -> (!torch.vtensor<[2],f32>, !torch.vtensor<[3],f32>) {
  %r:2 = "ca.hook"(%a, %b) {kind = "pre_hook", hook_id = 4 : i64, body = @pre_body} : (!torch.vtensor<[2],f32>, !torch.vtensor<[3],f32>) -> (!torch.vtensor<[2],f32>, !torch.vtensor<[3],f32>)
  return %r#0, %r#1 : !torch.vtensor<[2],f32>, !torch.vtensor<[3],f32>
}
