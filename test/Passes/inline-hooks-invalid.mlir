// RUN: ca-opt %s --split-input-file --verify-diagnostics --ca-inline-hooks

// The verifier accepts a body whose types are compatible with the hook's ([?] vs [4]),
// but the cloned ops would not fit: the pass refuses, naming the hook.
func.func private @hook_dyn(%g: !torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32> {
  %r = torch.aten.neg %g : !torch.vtensor<[?],f32> -> !torch.vtensor<[?],f32>
  return %r : !torch.vtensor<[?],f32>
}
func.func @signature_mismatch(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // expected-error@+1 {{ca-inline-hooks: hook 3 (body @hook_dyn): body signature (!torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32> differs from the hook's (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>}}
  %h = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 3 : i64, body = @hook_dyn} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %h : !torch.vtensor<[4],f32>
}

// -----

// Incompatible element types: the `ca` verifier already rejects the module when parsed.
func.func private @hook_f64(%g: !torch.vtensor<[4],f64>) -> !torch.vtensor<[4],f64>
func.func @signature_incompatible(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // expected-error@+1 {{hook body @hook_f64 inputs: type mismatch at #0: !torch.vtensor<[4],f64> vs !torch.vtensor<[4],f32>}}
  %h = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %h : !torch.vtensor<[4],f32>
}

// -----

// A body that is only a declaration cannot be inlined.
func.func private @hook_decl(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
func.func @declaration(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  // expected-error@+1 {{ca-inline-hooks: hook 0 (body @hook_decl) is a declaration; only a single-block function can be inlined}}
  %h = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_decl} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %h : !torch.vtensor<[4],f32>
}
