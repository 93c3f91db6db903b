// RUN: ca-opt %s | ca-opt | FileCheck %s

// CHECK-LABEL: func.func private @hook_0
func.func private @hook_0(%g: !torch.vtensor<[10],f32>) -> !torch.vtensor<[10],f32>

// CHECK-LABEL: func.func @all_kinds
func.func @all_kinds(%g: !torch.vtensor<[10],f32>, %gi: !torch.vtensor<[3],f32>, %p: !torch.vtensor<[10],f32>) -> !torch.vtensor<[10],f32> {
  // CHECK: %[[A:.*]] = "ca.hook"(%{{.*}}) {body = @hook_0, hook_id = 0 : i64, kind = "tensor_pre_hook"} : (!torch.vtensor<[10],f32>) -> !torch.vtensor<[10],f32>
  %a = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_0} : (!torch.vtensor<[10],f32>) -> !torch.vtensor<[10],f32>
  // CHECK: "ca.hook"(%[[A]], %{{.*}}) {hook_id = 1 : i64, kind = "pre_hook"} : (!torch.vtensor<[10],f32>, !torch.vtensor<[3],f32>) -> (!torch.vtensor<[10],f32>, !torch.vtensor<[3],f32>)
  %b:2 = "ca.hook"(%a, %gi) {kind = "pre_hook", hook_id = 1 : i64} : (!torch.vtensor<[10],f32>, !torch.vtensor<[3],f32>) -> (!torch.vtensor<[10],f32>, !torch.vtensor<[3],f32>)
  // post_hook: grad_inputs (%gi) then grad_outputs (%b#0), returns the grad_inputs.
  // CHECK: "ca.hook"(%{{.*}}, %{{.*}}) {hook_id = 2 : i64, kind = "post_hook"} : (!torch.vtensor<[3],f32>, !torch.vtensor<[10],f32>) -> !torch.vtensor<[3],f32>
  %c = "ca.hook"(%b#1, %b#0) {kind = "post_hook", hook_id = 2 : i64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[10],f32>) -> !torch.vtensor<[3],f32>
  // CHECK: "ca.hook"(%{{.*}}) {hook_id = 3 : i64, kind = "post_acc_grad_hook"} : (!torch.vtensor<[10],f32>) -> ()
  "ca.hook"(%p) {kind = "post_acc_grad_hook", hook_id = 3 : i64} : (!torch.vtensor<[10],f32>) -> ()
  return %b#0 : !torch.vtensor<[10],f32>
}

// Hooks have side effects: canonicalization must keep a hook whose results are unused.
// RUN: ca-opt %s --canonicalize | FileCheck %s --check-prefix=KEEP
// KEEP-LABEL: func.func @unused_result
// KEEP: "ca.hook"
func.func @unused_result(%g: !torch.vtensor<[10],f32>) {
  %a = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64} : (!torch.vtensor<[10],f32>) -> !torch.vtensor<[10],f32>
  return
}

// A pre hook whose second gradient is None: only the present one is an operand.
// CHECK-LABEL: func.func @none_positions
// CHECK: "ca.hook"(%{{.*}}) {hook_id = 1 : i64, kind = "pre_hook", none_at = [1]}
func.func @none_positions(%g: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
  %0 = "ca.hook"(%g) {hook_id = 1 : i64, kind = "pre_hook", none_at = [1]} : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
  return %0 : !torch.vtensor<[2],f32>
}

// A saved-tensor unpack hook (activation checkpointing): nothing in, the saved tensor out;
// `data_id` is the position of what the pack hook returned.
// CHECK-LABEL: func.func @unpack
// CHECK: "ca.hook"() {data_id = 2 : i64, hook_id = 5 : i64, kind = "unpack_hook"} : () -> !torch.vtensor<[4,8],f32>
func.func @unpack() -> !torch.vtensor<[4,8],f32> {
  %t = "ca.hook"() {kind = "unpack_hook", hook_id = 5 : i64, data_id = 2 : i64} : () -> !torch.vtensor<[4,8],f32>
  return %t : !torch.vtensor<[4,8],f32>
}

// A host call: the backward of a custom autograd.Function camlir could not trace. Two saved
// tensors (the second None: `saved_none_at`), one grad_output; results are entries 0 and 2
// of what the backward returns (entry 1 needs no gradient).
// CHECK-LABEL: func.func @custom_backward
// CHECK: "ca.hook"(%{{.*}}, %{{.*}}) {hook_id = 4 : i64, kind = "custom_backward", outputs = [0, 2], saved = 1 : i64, saved_none_at = [1]} : (!torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32>) -> (!torch.vtensor<[4,3],f32>, !torch.vtensor<[3],f32>)
func.func @custom_backward(%x: !torch.vtensor<[4,3],f32>, %g: !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[3],f32> {
  %gx, %gw = "ca.hook"(%x, %g) {kind = "custom_backward", hook_id = 4 : i64, saved = 1 : i64, saved_none_at = [1], outputs = [0, 2]} : (!torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32>) -> (!torch.vtensor<[4,3],f32>, !torch.vtensor<[3],f32>)
  return %gw : !torch.vtensor<[3],f32>
}
