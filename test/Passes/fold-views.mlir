// RUN: ca-opt %s --split-input-file --ca-fold-views | FileCheck %s

// A shifted window of a padded buffer, read and written: the accesses go to the buffer
// itself, the offsets in the indices (the vectorizer refuses the strided view).
// CHECK-LABEL: func.func @window
// CHECK: affine.for %[[I:.*]] = 0 to 8 {
// CHECK-NEXT: affine.for %[[J:.*]] = 0 to 8 {
// CHECK-NEXT: %[[V:.*]] = affine.load %arg0[%[[I]] + 1, %[[J]] + 2] : memref<10x10xf32>
// CHECK-NEXT: affine.store %[[V]], %arg0[%[[J]] + 1, %[[I]] + 2] : memref<10x10xf32>
func.func @window(%a: memref<10x10xf32>) {
  %s = memref.subview %a[1, 2] [8, 8] [1, 1] : memref<10x10xf32> to memref<8x8xf32, strided<[10, 1], offset: 12>>
  affine.for %i = 0 to 8 {
    affine.for %j = 0 to 8 {
      %v = affine.load %s[%i, %j] : memref<8x8xf32, strided<[10, 1], offset: 12>>
      affine.store %v, %s[%j, %i] : memref<8x8xf32, strided<[10, 1], offset: 12>>
    }
  }
  return
}

// -----

// One tap of a flattened 3x3 weight, broadcast to NCHW (collapse, slice, expand): the
// load reads the weight at (channel, 0, 1, 2), tap 5.
// CHECK-LABEL: func.func @tap
// CHECK: affine.for %[[C:.*]] = 0 to 88 {
// CHECK-NEXT: affine.load %arg0[%[[C]], 0, 1, 2] : memref<88x1x3x3xf32>
func.func @tap(%w: memref<88x1x3x3xf32>, %o: memref<1x88x1x1xf32>) {
  %c = memref.collapse_shape %w [[0], [1, 2, 3]] : memref<88x1x3x3xf32> into memref<88x9xf32>
  %s = memref.subview %c[0, 5] [88, 1] [1, 1] : memref<88x9xf32> to memref<88x1xf32, strided<[9, 1], offset: 5>>
  %e = memref.expand_shape %s [[0, 1], [2, 3]] output_shape [1, 88, 1, 1] : memref<88x1xf32, strided<[9, 1], offset: 5>> into memref<1x88x1x1xf32, strided<[792, 9, 1, 1], offset: 5>>
  affine.for %i = 0 to 88 {
    %v = affine.load %e[0, %i, 0, 0] : memref<1x88x1x1xf32, strided<[792, 9, 1, 1], offset: 5>>
    affine.store %v, %o[0, %i, 0, 0] : memref<1x88x1x1xf32>
  }
  return
}

// -----

// Left alone: a stride-2 slice (the vectorizer would read the root's index 2*j as
// contiguous), and a window narrowed along a loop of 4 iterations (a vector of 8 past its
// end, masked by the view's bounds, would land in the root's next row).
// CHECK-LABEL: func.func @kept
// CHECK: affine.load %{{.*}}[%{{.*}}, %{{.*}}] : memref<4x4xf32, strided<[20, 2], offset: 1>>
// CHECK: affine.store %{{.*}}, %{{.*}}[%{{.*}}, %{{.*}}] : memref<4x4xf32, strided<[10, 1], offset: 11>>
func.func @kept(%a: memref<10x10xf32>, %b: memref<10x10xf32>) {
  %s2 = memref.subview %a[0, 1] [4, 4] [2, 2] : memref<10x10xf32> to memref<4x4xf32, strided<[20, 2], offset: 1>>
  %w = memref.subview %b[1, 1] [4, 4] [1, 1] : memref<10x10xf32> to memref<4x4xf32, strided<[10, 1], offset: 11>>
  affine.for %i = 0 to 4 {
    affine.for %j = 0 to 4 {
      %v = affine.load %s2[%i, %j] : memref<4x4xf32, strided<[20, 2], offset: 1>>
      affine.store %v, %w[%i, %j] : memref<4x4xf32, strided<[10, 1], offset: 11>>
    }
  }
  return
}
