// RUN: ca-opt %s --split-input-file --ca-register-reductions | FileCheck %s

// A row sum: the accumulator moves into iter_args of the inner loop, loaded and stored once.
// CHECK-LABEL: func.func @rows
// CHECK: affine.for %[[C:.*]] = 0 to 16 {
// CHECK-NEXT: %[[A0:.*]] = affine.load %arg1[%[[C]]] : memref<16xf32>
// CHECK-NEXT: %[[R:.*]] = affine.for %{{.*}} = 0 to 16 iter_args(%[[A:.*]] = %[[A0]]) -> (f32) {
// CHECK: %[[S:.*]] = arith.addf %{{.*}}, %[[A]] : f32
// CHECK-NEXT: affine.yield %[[S]] : f32
// CHECK: affine.store %[[R]], %arg1[%[[C]]] : memref<16xf32>
func.func @rows(%in: memref<16x16xf32>, %acc: memref<16xf32>) {
  affine.for %c = 0 to 16 {
    affine.for %i = 0 to 16 {
      %a = affine.load %acc[%c] : memref<16xf32>
      %x = affine.load %in[%c, %i] : memref<16x16xf32>
      %s = arith.addf %x, %a : f32
      affine.store %s, %acc[%c] : memref<16xf32>
    }
  }
  return
}

// -----

// Batch-norm's per-channel sum over (N, H, W): carried through both inner loops, never past
// the channel loop (the accumulator's address depends on it).
// CHECK-LABEL: func.func @nchw
// CHECK: affine.for %{{.*}} = 0 to 4 {
// CHECK-NEXT: affine.for %[[C:.*]] = 0 to 3 {
// CHECK-NEXT: %[[A0:.*]] = affine.load %arg1[%[[C]]]
// CHECK-NEXT: %[[R:.*]] = affine.for %{{.*}} = 0 to 5 iter_args(%[[H:.*]] = %[[A0]]) -> (f32) {
// CHECK-NEXT: %[[W:.*]] = affine.for %{{.*}} = 0 to 8 iter_args(%{{.*}} = %[[H]]) -> (f32) {
// CHECK: affine.yield %[[W]] : f32
// CHECK: affine.store %[[R]], %arg1[%[[C]]]
func.func @nchw(%in: memref<4x3x5x8xf32>, %acc: memref<3xf32>) {
  affine.for %n = 0 to 4 {
    affine.for %c = 0 to 3 {
      affine.for %h = 0 to 5 {
        affine.for %w = 0 to 8 {
          %x = affine.load %in[%n, %c, %h, %w] : memref<4x3x5x8xf32>
          %a = affine.load %acc[%c] : memref<3xf32>
          %s = arith.addf %x, %a : f32
          affine.store %s, %acc[%c] : memref<3xf32>
        }
      }
    }
  }
  return
}

// -----

// The loop also reads the accumulator through a view: left as it is.
// CHECK-LABEL: func.func @aliased
// CHECK: affine.for
// CHECK-NOT: iter_args
// CHECK: affine.store
func.func @aliased(%in: memref<16xf32>, %acc: memref<1xf32>) {
  %v = memref.expand_shape %acc [[0, 1]] output_shape [1, 1] : memref<1xf32> into memref<1x1xf32>
  affine.for %i = 0 to 16 {
    %a = affine.load %acc[0] : memref<1xf32>
    %b = affine.load %v[0, 0] : memref<1x1xf32>
    %s = arith.addf %a, %b : f32
    affine.store %s, %acc[0] : memref<1xf32>
  }
  return
}

// -----

// The accumulator's address depends on the loop itself: not a reduction of that loop.
// CHECK-LABEL: func.func @elementwise
// CHECK-NOT: iter_args
func.func @elementwise(%in: memref<16xf32>, %out: memref<16xf32>) {
  affine.for %i = 0 to 16 {
    %a = affine.load %out[%i] : memref<16xf32>
    %x = affine.load %in[%i] : memref<16xf32>
    %s = arith.addf %x, %a : f32
    affine.store %s, %out[%i] : memref<16xf32>
  }
  return
}
