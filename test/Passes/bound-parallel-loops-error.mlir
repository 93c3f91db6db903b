// RUN: not ca-opt %s --pass-pipeline='builtin.module(ca-bound-parallel-loops)' 2>&1 | FileCheck %s


// Two loop nests where one was expected: an error, not a loop left whole in every thread.
// CHECK: @two does not hold one loop nest (2 scf.for at one level)
func.func @two(%lo: index, %hi: index, %a: memref<8xf32>) attributes {ca.parallel_loop = [0, 8]} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %z = arith.constant 0.0 : f32
  scf.for %i = %c0 to %c8 step %c1 {
    memref.store %z, %a[%i] : memref<8xf32>
  }
  scf.for %i = %c0 to %c8 step %c1 {
    memref.store %z, %a[%i] : memref<8xf32>
  }
  return
}
