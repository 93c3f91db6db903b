// RUN: ca-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(ca-bf16-as-i16)' | FileCheck %s
// RUN: ca-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(ca-bf16-as-i16)' | ca-opt --split-input-file | FileCheck %s

// A partial last vector of a bf16 row (masked load and store), a value rounded by
// arith-expand's integer code (the bitcast folds away), a select and a zero constant.
// CHECK-LABEL: llvm.func @tail
// CHECK-SAME: (%[[P:.*]]: !llvm.ptr, %[[Q:.*]]: !llvm.ptr, %[[M:.*]]: vector<8xi1>, %[[I:.*]]: vector<8xi16>)
// CHECK: %[[PASS:.*]] = llvm.mlir.poison : vector<8xi16>
// CHECK: %[[ZERO:.*]] = llvm.mlir.constant(dense<0> : vector<8xi16>) : vector<8xi16>
// CHECK: %[[L:.*]] = llvm.intr.masked.load %[[P]], %[[M]], %[[PASS]] {alignment = 2 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xi16>) -> vector<8xi16>
// CHECK: %[[S:.*]] = llvm.select %[[M]], %[[L]], %[[I]] : vector<8xi1>, vector<8xi16>
// CHECK: %[[T:.*]] = llvm.select %[[M]], %[[S]], %[[ZERO]] : vector<8xi1>, vector<8xi16>
// CHECK: llvm.intr.masked.store %[[T]], %[[Q]], %[[M]] {alignment = 2 : i32} : vector<8xi16>, vector<8xi1> into !llvm.ptr
// CHECK-NOT: bf16
llvm.func @tail(%p: !llvm.ptr, %q: !llvm.ptr, %m: vector<8xi1>, %i: vector<8xi16>) {
  %z = llvm.mlir.poison : vector<8xbf16>
  %zero = llvm.mlir.constant(dense<0.000000e+00> : vector<8xbf16>) : vector<8xbf16>
  %v = llvm.intr.masked.load %p, %m, %z {alignment = 2 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xbf16>) -> vector<8xbf16>
  %b = llvm.bitcast %i : vector<8xi16> to vector<8xbf16>
  %s = llvm.select %m, %v, %b : vector<8xi1>, vector<8xbf16>
  %t = llvm.select %m, %s, %zero : vector<8xi1>, vector<8xbf16>
  llvm.intr.masked.store %t, %q, %m {alignment = 2 : i32} : vector<8xbf16>, vector<8xi1> into !llvm.ptr
  llvm.return
}

// -----

// The element-by-element gather a strided vector read becomes: scalar loads, a vector
// carried through a block argument, an array of one-element vectors on the stack; scalar
// constants keep their bits (1.0 is 0x3F80 = 16256, -2.0 is 0xC000 = -16384).
// CHECK-LABEL: llvm.func @gather
// CHECK: %[[ONE:.*]] = llvm.mlir.constant(16256 : i16) : i16
// CHECK: %[[NEG:.*]] = llvm.mlir.constant(dense<[16256, -16384]> : vector<2xi16>) : vector<2xi16>
// CHECK: llvm.alloca %{{.*}} x !llvm.array<8 x array<1 x vector<1xi16>>> : (i64) -> !llvm.ptr
// CHECK: llvm.br ^bb1(%{{.*}} : vector<8xi16>)
// CHECK: ^bb1(%[[ACC:.*]]: vector<8xi16>):
// CHECK: %[[G:.*]] = llvm.getelementptr %{{.*}}[%{{.*}}] : (!llvm.ptr, i64) -> !llvm.ptr, i16
// CHECK: %[[X:.*]] = llvm.load %[[G]] : !llvm.ptr -> i16
// CHECK: llvm.insertelement %[[X]], %[[ACC]][%{{.*}} : i64] : vector<8xi16>
// CHECK: llvm.insertvalue %{{.*}}[0, 0] : !llvm.array<8 x array<1 x vector<1xi16>>>
// CHECK: llvm.store %[[ONE]], %{{.*}} : i16, !llvm.ptr
// CHECK-NOT: bf16
llvm.func @gather(%p: !llvm.ptr, %n: i64, %c: i1) -> vector<2xbf16> {
  %one = llvm.mlir.constant(1.0 : bf16) : bf16
  %pair = llvm.mlir.constant(dense<[1.0, -2.0]> : vector<2xbf16>) : vector<2xbf16>
  %k = llvm.mlir.constant(1 : index) : i64
  %stack = llvm.alloca %k x !llvm.array<8 x array<1 x vector<1xbf16>>> : (i64) -> !llvm.ptr
  %init = llvm.mlir.poison : vector<8xbf16>
  llvm.br ^bb1(%init : vector<8xbf16>)
^bb1(%acc: vector<8xbf16>):
  %g = llvm.getelementptr %p[%n] : (!llvm.ptr, i64) -> !llvm.ptr, bf16
  %x = llvm.load %g : !llvm.ptr -> bf16
  %next = llvm.insertelement %x, %acc[%n : i64] : vector<8xbf16>
  llvm.cond_br %c, ^bb1(%next : vector<8xbf16>), ^bb2
^bb2:
  %e = llvm.extractelement %acc[%n : i64] : vector<8xbf16>
  %u = llvm.mlir.undef : !llvm.array<8 x array<1 x vector<1xbf16>>>
  %one_v = llvm.mlir.poison : vector<1xbf16>
  %w = llvm.insertelement %e, %one_v[%n : i64] : vector<1xbf16>
  %a = llvm.insertvalue %w, %u[0, 0] : !llvm.array<8 x array<1 x vector<1xbf16>>>
  llvm.store %a, %stack : !llvm.array<8 x array<1 x vector<1xbf16>>>, !llvm.ptr
  llvm.store %one, %g : bf16, !llvm.ptr
  llvm.return %pair : vector<2xbf16>
}

// -----

// A global of bf16 constants (a memref.global of zeros, fuzz seed 165) keeps its bits.
// CHECK-LABEL: llvm.mlir.global private constant @zeros(dense<[0, 16256, -16384]> : tensor<3xi16>) {addr_space = 0 : i32, alignment = 64 : i64} : !llvm.array<3 x i16>
// CHECK-LABEL: llvm.func @read
// CHECK: %[[A:.*]] = llvm.mlir.addressof @zeros : !llvm.ptr
// CHECK: llvm.load %{{.*}} : !llvm.ptr -> i16
llvm.mlir.global private constant @zeros(dense<[0.0, 1.0, -2.0]> : tensor<3xbf16>) {addr_space = 0 : i32, alignment = 64 : i64} : !llvm.array<3 x bf16>
llvm.func @read(%i: i64, %q: !llvm.ptr) {
  %a = llvm.mlir.addressof @zeros : !llvm.ptr
  %g = llvm.getelementptr %a[%i] : (!llvm.ptr, i64) -> !llvm.ptr, bf16
  %x = llvm.load %g : !llvm.ptr -> bf16
  llvm.store %x, %q : bf16, !llvm.ptr
  llvm.return
}

// -----

// Arithmetic on bf16 is not a move: the module is left as it was, all of it.
// CHECK-LABEL: llvm.func @arith
// CHECK: llvm.mlir.poison : vector<8xbf16>
// CHECK: llvm.fadd %{{.*}} : bf16
llvm.func @arith(%a: bf16, %b: bf16) -> bf16 {
  %z = llvm.mlir.poison : vector<8xbf16>
  %s = llvm.fadd %a, %b : bf16
  llvm.return %s : bf16
}
