// RUN: ca-opt %s --split-input-file --verify-diagnostics --ca-outline-kernels

func.func @backward(%g: !torch.vtensor<[4],f32>) {
  // expected-error@+1 {{ca-outline-kernels needs flat code: run ca-flatten-nodes first}}
  %r = "ca.node"(%g) ({
  ^bb0(%a: !torch.vtensor<[4],f32>):
    %n = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
    "ca.yield"(%n) : (!torch.vtensor<[4],f32>) -> ()
  }) {node = "NegBackward0", index = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return
}

// -----

// expected-error@+1 {{no function @backward to outline}}
module {
  func.func @other(%g: !torch.vtensor<[4],f32>) {
    return
  }
}
