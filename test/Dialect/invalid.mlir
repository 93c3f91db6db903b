// RUN: ca-opt %s --split-input-file --verify-diagnostics

func.func @node_missing_name(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'ca.node' op requires string attribute 'node'}}
  %r = "ca.node"(%g) ({
  ^bb0(%a: tensor<4xf32>):
    "ca.yield"(%a) : (tensor<4xf32>) -> ()
  }) {index = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @node_negative_index(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{attribute 'index' must be >= 0, got -1}}
  %r = "ca.node"(%g) ({
  ^bb0(%a: tensor<4xf32>):
    "ca.yield"(%a) : (tensor<4xf32>) -> ()
  }) {node = "NegBackward0", index = -1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @node_bad_aot(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{attribute 'aot' must be an integer}}
  %r = "ca.node"(%g) ({
  ^bb0(%a: tensor<4xf32>):
    "ca.yield"(%a) : (tensor<4xf32>) -> ()
  }) {node = "NegBackward0", index = 0 : i64, aot = "zero"} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @node_arity(%g: tensor<4xf32>, %h: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{body arguments vs operands: expected 2 values, got 1}}
  %r = "ca.node"(%g, %h) ({
  ^bb0(%a: tensor<4xf32>):
    "ca.yield"(%a) : (tensor<4xf32>) -> ()
  }) {node = "AddBackward0", index = 0 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @node_arg_type(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{body arguments vs operands: type mismatch at #0: tensor<4xf64> vs tensor<4xf32>}}
  %r = "ca.node"(%g) ({
  ^bb0(%a: tensor<4xf64>):
    %t = arith.truncf %a : tensor<4xf64> to tensor<4xf32>
    "ca.yield"(%t) : (tensor<4xf32>) -> ()
  }) {node = "AddBackward0", index = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @yield_arity(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'ca.yield' operands vs node results: expected 1 values, got 0}}
  %r = "ca.node"(%g) ({
  ^bb0(%a: tensor<4xf32>):
    "ca.yield"() : () -> ()
  }) {node = "AddBackward0", index = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @yield_type(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // expected-error@+1 {{'ca.yield' operands vs node results: type mismatch at #0: !torch.vtensor<[5],f32> vs !torch.vtensor<[4],f32>}}
  %r = "ca.node"(%g) ({
  ^bb0(%a: !torch.vtensor<[4],f32>):
    %b = torch.vtensor.literal(dense<0.0> : tensor<5xf32>) : !torch.vtensor<[5],f32>
    "ca.yield"(%b) : (!torch.vtensor<[5],f32>) -> ()
  }) {node = "AddBackward0", index = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %r : !torch.vtensor<[4],f32>
}

// -----

func.func @node_no_terminator(%g: tensor<4xf32>) {
  // expected-error@+1 {{body must end with 'ca.yield'}}
  "ca.node"(%g) ({
  ^bb0(%a: tensor<4xf32>):
    %n = arith.negf %a : tensor<4xf32>
  }) {node = "NegBackward0", index = 0 : i64} : (tensor<4xf32>) -> ()
  return
}

// -----

func.func @node_not_isolated(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{body uses a value defined outside the node}}
  %r = "ca.node"() ({
    %n = arith.negf %g : tensor<4xf32>
    "ca.yield"(%n) : (tensor<4xf32>) -> ()
  }) {node = "NegBackward0", index = 0 : i64} : () -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @node_two_regions(%g: tensor<4xf32>) {
  // expected-error@+1 {{'ca.node' op expects 1 region(s), got 2}}
  "ca.node"() ({
    "ca.yield"() : () -> ()
  }, {
    "ca.yield"() : () -> ()
  }) {node = "NegBackward0", index = 0 : i64} : () -> ()
  return
}

// -----

func.func @yield_outside_node(%g: tensor<4xf32>) {
  // expected-error@+1 {{'ca.yield' op must be nested directly in a 'ca.node'}}
  "ca.yield"(%g) : (tensor<4xf32>) -> ()
  return
}

// -----

func.func @hook_bad_kind(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{unknown hook kind 'post_hok'; expected one of tensor_pre_hook, pre_hook, post_hook, post_acc_grad_hook}}
  %r = "ca.hook"(%g) {kind = "post_hok", hook_id = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @hook_missing_id(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'ca.hook' op requires integer attribute 'hook_id'}}
  %r = "ca.hook"(%g) {kind = "tensor_pre_hook"} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @tensor_pre_hook_arity(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{kind 'tensor_pre_hook' takes 1 operand and returns 1 result, got 2 -> 1}}
  %r = "ca.hook"(%g, %g) {kind = "tensor_pre_hook", hook_id = 0 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @tensor_pre_hook_type(%g: tensor<4xf32>) -> tensor<3xf32> {
  // expected-error@+1 {{tensor_pre_hook result vs operand: type mismatch at #0: tensor<3xf32> vs tensor<4xf32>}}
  %r = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64} : (tensor<4xf32>) -> tensor<3xf32>
  return %r : tensor<3xf32>
}

// -----

func.func @pre_hook_arity(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{kind 'pre_hook' returns as many results as operands, got 2 -> 1}}
  %r = "ca.hook"(%g, %g) {kind = "pre_hook", hook_id = 0 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @post_hook_arity(%g: tensor<4xf32>) {
  // expected-error@+1 {{kind 'post_hook' takes grad_inputs then grad_outputs and returns the grad_inputs}}
  %r:2 = "ca.hook"(%g) {kind = "post_hook", hook_id = 0 : i64} : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  return
}

// -----

func.func @post_hook_type(%gi: tensor<3xf32>, %go: tensor<4xf32>) {
  // expected-error@+1 {{post_hook results vs leading operands: type mismatch at #0: tensor<4xf32> vs tensor<3xf32>}}
  %r = "ca.hook"(%gi, %go) {kind = "post_hook", hook_id = 0 : i64} : (tensor<3xf32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @post_acc_grad_hook_arity(%p: tensor<4xf32>) {
  // expected-error@+1 {{kind 'post_acc_grad_hook' takes the parameter and returns nothing, got 1 -> 1}}
  %r = "ca.hook"(%p) {kind = "post_acc_grad_hook", hook_id = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @hook_unknown_body(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'body' refers to unknown symbol @missing}}
  %r = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @missing} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func private @hook_body(%g: tensor<4xf64>) -> tensor<4xf64>

func.func @hook_body_signature(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{hook body @hook_body inputs: type mismatch at #0: tensor<4xf64> vs tensor<4xf32>}}
  %r = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_body} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @accumulate_type(%p: !torch.vtensor<[10],f32>, %g: !torch.vtensor<[10],f64>) {
  // expected-error@+1 {{gradient type !torch.vtensor<[10],f64> does not match parameter type !torch.vtensor<[10],f32>}}
  "ca.accumulate_grad"(%p, %g) : (!torch.vtensor<[10],f32>, !torch.vtensor<[10],f64>) -> ()
  return
}

// -----

func.func @accumulate_shape(%p: tensor<10x3xf32>, %g: tensor<10x4xf32>) {
  // expected-error@+1 {{gradient type tensor<10x4xf32> does not match parameter type tensor<10x3xf32>}}
  "ca.accumulate_grad"(%p, %g) : (tensor<10x3xf32>, tensor<10x4xf32>) -> ()
  return
}

// -----

func.func @accumulate_arity(%p: tensor<10xf32>) {
  // expected-error@+1 {{takes 2 operands (param, grad) and returns nothing, got 1 -> 0}}
  "ca.accumulate_grad"(%p) : (tensor<10xf32>) -> ()
  return
}

// -----

func.func @accumulate_not_tensor(%p: i64, %g: i64) {
  // expected-error@+1 {{operands must be tensors, got i64 and i64}}
  "ca.accumulate_grad"(%p, %g) : (i64, i64) -> ()
  return
}

// -----

func.func @size_both(%s: !torch.int) {
  // expected-error@+1 {{must have exactly one of a source operand (symbolic) and a 'value' attribute (static)}}
  %n = "ca.size"(%s) {index = 0 : i64, value = 3 : i64} : (!torch.int) -> !torch.int
  return
}

// -----

func.func @size_neither() {
  // expected-error@+1 {{must have exactly one of a source operand (symbolic) and a 'value' attribute (static)}}
  %n = "ca.size"() {index = 0 : i64} : () -> !torch.int
  return
}

// -----

func.func @size_negative() {
  // expected-error@+1 {{attribute 'value' must be >= 0, got -4}}
  %n = "ca.size"() {index = 0 : i64, value = -4 : i64} : () -> !torch.int
  return
}

// -----

func.func @size_float(%s: f32) {
  // expected-error@+1 {{source must be integer-like (!torch.int, index, iN), got f32}}
  %n = "ca.size"(%s) {index = 0 : i64} : (f32) -> !torch.int
  return
}

// -----

func.func @size_result() {
  // expected-error@+1 {{result must be integer-like (!torch.int, index, iN), got f32}}
  %n = "ca.size"() {index = 0 : i64, value = 2 : i64} : () -> f32
  return
}

// -----

func.func @call_python_no_callee(%g: tensor<4xf32>) {
  // expected-error@+1 {{'ca.call_python' op requires string attribute 'callee'}}
  "ca.call_python"(%g) {id = 0 : i64} : (tensor<4xf32>) -> ()
  return
}

// -----

func.func @call_python_empty_callee(%g: tensor<4xf32>) {
  // expected-error@+1 {{attribute 'callee' must not be empty}}
  "ca.call_python"(%g) {callee = "", id = 0 : i64} : (tensor<4xf32>) -> ()
  return
}

// -----

func.func @call_python_bad_id(%g: tensor<4xf32>) {
  // expected-error@+1 {{attribute 'id' must be >= 0, got -2}}
  "ca.call_python"(%g) {callee = "aten::foo", id = -2 : i64} : (tensor<4xf32>) -> ()
  return
}

// -----

func.func @unknown_ca_op() {
  // expected-error@+1 {{unknown operation 'ca.bogus' in dialect 'ca'}}
  "ca.bogus"() : () -> ()
  return
}

// -----

func.func @hook_body_not_symbol(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'body' must be a flat symbol reference, got "hook_0"}}
  %r = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = "hook_0"} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

memref.global "private" @not_a_func : memref<4xf32>

func.func @hook_body_not_func(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'body' @not_a_func must be a func.func, is 'memref.global'}}
  %r = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @not_a_func} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @post_acc_grad_hook_not_tensor(%p: i64) {
  // expected-error@+1 {{kind 'post_acc_grad_hook' operand must be a tensor, got i64}}
  "ca.hook"(%p) {kind = "post_acc_grad_hook", hook_id = 0 : i64} : (i64) -> ()
  return
}

// -----

func.func @yield_with_results(%g: tensor<4xf32>) {
  %r = "ca.node"(%g) ({
  ^bb0(%a: tensor<4xf32>):
    // expected-error@+1 {{'ca.yield' op must not have results}}
    %x = "ca.yield"(%a) : (tensor<4xf32>) -> (tensor<4xf32>)
  }) {node = "NegBackward0", index = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @size_two_sources(%s: !torch.int) {
  // expected-error@+1 {{takes at most 1 operand and returns 1 result, got 2 -> 1}}
  %n = "ca.size"(%s, %s) {index = 0 : i64} : (!torch.int, !torch.int) -> !torch.int
  return
}

// -----

func.func @none_positions_on_tensor_hook(%g: !torch.vtensor<[2],f32>) {
  // expected-error@+1 {{'none_at' is only meaningful on pre_hook and post_hook}}
  %0 = "ca.hook"(%g) {hook_id = 0 : i64, kind = "tensor_pre_hook", none_at = [1]} : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
  return
}

// -----

func.func @negative_none_position(%g: !torch.vtensor<[2],f32>) {
  // expected-error@+1 {{'none_at' must be an array of non-negative integers}}
  %0 = "ca.hook"(%g) {hook_id = 0 : i64, kind = "pre_hook", none_at = [-1]} : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32>
  return
}

// -----

func.func @unpack_without_data(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'ca.hook' op requires integer attribute 'data_id'}}
  %r = "ca.hook"() {kind = "unpack_hook", hook_id = 0 : i64} : () -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @unpack_with_operand(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{kind 'unpack_hook' takes nothing and returns 1 tensor, got 1 -> 1}}
  %r = "ca.hook"(%g) {kind = "unpack_hook", hook_id = 0 : i64, data_id = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @data_id_on_another_kind(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'data_id' is only meaningful on unpack_hook}}
  %r = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, data_id = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @custom_backward_without_outputs(%x: tensor<4xf32>, %g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{kind 'custom_backward' requires array attribute 'outputs'}}
  %r = "ca.hook"(%x, %g) {kind = "custom_backward", hook_id = 0 : i64, saved = 1 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @custom_backward_outputs_count(%x: tensor<4xf32>, %g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{kind 'custom_backward' has 1 results but 'outputs' lists 2 positions}}
  %r = "ca.hook"(%x, %g) {kind = "custom_backward", hook_id = 0 : i64, saved = 1 : i64, outputs = [0, 1]} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @custom_backward_too_many_saved(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{kind 'custom_backward' has 'saved' = 3 but only 1 operands}}
  %r = "ca.hook"(%g) {kind = "custom_backward", hook_id = 0 : i64, saved = 3 : i64, outputs = [0]} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @saved_on_another_kind(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'saved' is only meaningful on custom_backward}}
  %r = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, saved = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}
