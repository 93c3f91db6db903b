// Each chunk is parsed on its own: an error in one does not stop the others, diagnostics
// keep the line numbers of the whole file, and the output keeps the separators.
// RUN: not ca-opt %s --split-input-file 2>%t.err | FileCheck %s
// RUN: FileCheck %s --check-prefix=ERR < %t.err

// CHECK: func.func @first
// CHECK: // -----
// CHECK: func.func @third
// ERR: split-input-file.mlir:19:8: error: 'ca.hook' op unknown hook kind 'wrong'
// ERR-NOT: error

func.func @first() {
  return
}

// -----

func.func @second(%g: tensor<4xf32>) {
  %r = "ca.hook"(%g) {kind = "wrong", hook_id = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @third() {
  return
}
