// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-bound-parallel-loops)' | ca-opt | FileCheck %s

// The loop at the marked depth (1: the columns of a bias gradient) runs over the function's
// block [%lo, %hi); the loop around it and the mark are gone or unchanged.
// CHECK: func.func @k__par0(%[[LO:[a-z0-9]+]]: index, %[[HI:[a-z0-9]+]]: index,
// CHECK-NOT: ca.parallel_loop
// CHECK: scf.for %{{.*}} = %c0 to %c8 step %c1 {
// CHECK: scf.for %{{.*}} = %[[LO]] to %[[HI]] step %c1 {
func.func @k__par0(%lo: index, %hi: index, %a: memref<8x32xf32>, %b: memref<32xf32>) attributes {ca.parallel_loop = [1, 32]} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %c32 = arith.constant 32 : index
  scf.for %i = %c0 to %c8 step %c1 {
    scf.for %j = %c0 to %c32 step %c1 {
      %x = memref.load %a[%i, %j] : memref<8x32xf32>
      %y = memref.load %b[%j] : memref<32xf32>
      %s = arith.addf %x, %y : f32
      memref.store %s, %b[%j] : memref<32xf32>
    }
  }
  return
}

// A vectorized loop (step 8) widens its fork's blocks to whole vectors (grain 1 -> 8).
// CHECK: func.func @v__par0(%[[VLO:[a-z0-9]+]]: index, %[[VHI:[a-z0-9]+]]: index,
// CHECK: scf.for %{{.*}} = %[[VLO]] to %[[VHI]] step %c8 {
// CHECK: func.func private @v__par0_fork(memref<64xf32>) attributes {ca.parallel_fork = [@v__par0, 64, 8]}
func.func @v__par0(%lo: index, %hi: index, %a: memref<64xf32>) attributes {ca.parallel_loop = [0, 64]} {
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %c64 = arith.constant 64 : index
  %z = arith.constant dense<0.0> : vector<8xf32>
  scf.for %i = %c0 to %c64 step %c8 {
    vector.transfer_write %z, %a[%i] {in_bounds = [true]} : vector<8xf32>, memref<64xf32>
  }
  return
}
func.func private @v__par0_fork(memref<64xf32>) attributes {ca.parallel_fork = [@v__par0, 64, 1]}
