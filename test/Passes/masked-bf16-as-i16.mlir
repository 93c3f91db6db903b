// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-masked-bf16-as-i16)' | FileCheck %s
// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-masked-bf16-as-i16)' | ca-opt | FileCheck %s

// A partial last vector of a bf16 row: the masked load and store move i16 lanes.
// CHECK-LABEL: llvm.func @tail
// CHECK-SAME: (%[[P:.*]]: !llvm.ptr, %[[Q:.*]]: !llvm.ptr, %[[M:.*]]: vector<8xi1>)
// CHECK: %[[PASS:.*]] = llvm.mlir.poison : vector<8xbf16>
// CHECK: %[[PASS16:.*]] = llvm.bitcast %[[PASS]] : vector<8xbf16> to vector<8xi16>
// CHECK: %[[L16:.*]] = llvm.intr.masked.load %[[P]], %[[M]], %[[PASS16]] {alignment = 2 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xi16>) -> vector<8xi16>
// CHECK: %[[L:.*]] = llvm.bitcast %[[L16]] : vector<8xi16> to vector<8xbf16>
// CHECK: %[[S16:.*]] = llvm.bitcast %[[L]] : vector<8xbf16> to vector<8xi16>
// CHECK: llvm.intr.masked.store %[[S16]], %[[Q]], %[[M]] {alignment = 2 : i32} : vector<8xi16>, vector<8xi1> into !llvm.ptr
// CHECK-NOT: xbf16>, vector<8xi1> into
// CHECK: llvm.return
llvm.func @tail(%p: !llvm.ptr, %q: !llvm.ptr, %m: vector<8xi1>) {
  %z = llvm.mlir.poison : vector<8xbf16>
  %v = llvm.intr.masked.load %p, %m, %z {alignment = 2 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xbf16>) -> vector<8xbf16>
  llvm.intr.masked.store %v, %q, %m {alignment = 2 : i32} : vector<8xbf16>, vector<8xi1> into !llvm.ptr
  llvm.return
}

// f16 and f32 lanes are left alone (F16C and AVX load them as they are).
// CHECK-LABEL: llvm.func @others
// CHECK: llvm.intr.masked.load %{{.*}} : (!llvm.ptr, vector<8xi1>, vector<8xf16>) -> vector<8xf16>
// CHECK: llvm.intr.masked.store %{{.*}} : vector<8xf32>, vector<8xi1> into !llvm.ptr
// CHECK-NOT: llvm.bitcast
llvm.func @others(%p: !llvm.ptr, %q: !llvm.ptr, %m: vector<8xi1>, %x: vector<8xf32>) {
  %z = llvm.mlir.poison : vector<8xf16>
  %v = llvm.intr.masked.load %p, %m, %z {alignment = 2 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xf16>) -> vector<8xf16>
  llvm.intr.masked.store %x, %q, %m {alignment = 4 : i32} : vector<8xf32>, vector<8xi1> into !llvm.ptr
  llvm.return
}

// Gathers and scatters of bf16 lanes too.
// CHECK-LABEL: llvm.func @gather
// CHECK: %[[G:.*]] = llvm.intr.masked.gather %{{.*}} {alignment = 2 : i32} : (vector<8x!llvm.ptr>, vector<8xi1>, vector<8xi16>) -> vector<8xi16>
// CHECK: llvm.bitcast %[[G]] : vector<8xi16> to vector<8xbf16>
// CHECK: llvm.intr.masked.scatter %{{.*}} {alignment = 2 : i32} : vector<8xi16>, vector<8xi1> into vector<8x!llvm.ptr>
llvm.func @gather(%ps: vector<8x!llvm.ptr>, %m: vector<8xi1>) {
  %z = llvm.mlir.poison : vector<8xbf16>
  %v = llvm.intr.masked.gather %ps, %m, %z {alignment = 2 : i32} : (vector<8x!llvm.ptr>, vector<8xi1>, vector<8xbf16>) -> vector<8xbf16>
  llvm.intr.masked.scatter %v, %ps, %m {alignment = 2 : i32} : vector<8xbf16>, vector<8xi1> into vector<8x!llvm.ptr>
  llvm.return
}
