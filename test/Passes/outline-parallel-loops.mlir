// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-outline-parallel-loops{min-elements=32})' | ca-opt --split-input-file | FileCheck %s

// An elementwise generic over 8x4 rows: it moves into @k__par0 (the chunked operands'
// outer dimension dynamic), the kernel calls the fork, which says the body, the extent
// (8 rows) and, per operand, [rank, chunked, bytes per row]. A broadcast operand that does
// not use d0 keeps its type and is passed whole; the constant the region reads is cloned.
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
// CHECK-LABEL: func.func @k(
// CHECK-NOT: linalg.generic
// CHECK: call @k__par0_fork(%{{.*}}, %{{.*}}, %{{.*}}) : (memref<8x4xf32>, memref<4xf32>, memref<8x4xf32>) -> ()
// CHECK: func.func @k__par0(%[[A:.*]]: memref<?x4xf32>, %[[B:.*]]: memref<4xf32>, %[[C:.*]]: memref<?x4xf32>)
// CHECK: %[[TWO:.*]] = arith.constant 2.0
// CHECK: linalg.generic {{.*}} ins(%[[A]], %[[B]] : memref<?x4xf32>, memref<4xf32>) outs(%[[C]] : memref<?x4xf32>)
// CHECK: arith.mulf %{{.*}}, %[[TWO]]
// CHECK: func.func private @k__par0_fork(memref<8x4xf32>, memref<4xf32>, memref<8x4xf32>) attributes {ca.parallel_fork = [@k__par0, 8, {{\[}}[2, 1, 16], [1, 0, 0], [2, 1, 16]]]}
func.func @k(%a: memref<8x4xf32>, %b: memref<4xf32>, %c: memref<8x4xf32>) attributes {ca.kernel} {
  %two = arith.constant 2.0 : f32
  linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : memref<8x4xf32>, memref<4xf32>) outs(%c : memref<8x4xf32>) {
  ^bb0(%x: f32, %y: f32, %z: f32):
    %s = arith.addf %x, %y : f32
    %m = arith.mulf %s, %two : f32
    linalg.yield %m : f32
  }
  return
}

// -----

// A row reduction (softmax-like: d1 is reduced, d0 parallel) is split by rows; a scalar
// argument the region reads is passed along.
#id = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (d0)>
// CHECK-LABEL: func.func @rows(
// CHECK: call @rows__par0_fork(%{{.*}}, %{{.*}}, %{{.*}}) : (memref<16x8xf64>, memref<16xf64>, f64) -> ()
// CHECK: func.func @rows__par0(%{{.*}}: memref<?x8xf64>, %{{.*}}: memref<?xf64>, %{{.*}}: f64)
// CHECK: ca.parallel_fork = [@rows__par0, 16, {{\[}}[2, 1, 64], [1, 1, 8], [-1, 0, 0]]]
func.func @rows(%a: memref<16x8xf64>, %r: memref<16xf64>, %scale: f64) attributes {ca.kernel} {
  linalg.generic {indexing_maps = [#id, #out], iterator_types = ["parallel", "reduction"]}
      ins(%a : memref<16x8xf64>) outs(%r : memref<16xf64>) {
  ^bb0(%x: f64, %acc: f64):
    %m = arith.mulf %x, %scale : f64
    %s = arith.addf %m, %acc : f64
    linalg.yield %s : f64
  }
  return
}

// -----

// Left alone: a reduction along the first dimension (a bias gradient), a transposed output
// (d0 not its outer index), a loop nest under min-elements, a generic that reads a view of
// the buffer it writes, one that reads d0's index (a thread's block would count from its
// own first row), and functions that are not kernels.
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
#t = affine_map<(d0, d1) -> (d1, d0)>
// CHECK-LABEL: func.func @kept(
// CHECK-NOT: call
// CHECK-COUNT-5: linalg.generic
// CHECK-NOT: __par
func.func @kept(%a: memref<8x8xf32>, %bias: memref<8xf32>, %t: memref<8x8xf32>, %small: memref<2x4xf32>) attributes {ca.kernel} {
  linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
      ins(%a : memref<8x8xf32>) outs(%bias : memref<8xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %s = arith.addf %x, %acc : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#id, #t], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<8x8xf32>) outs(%t : memref<8x8xf32>) {
  ^bb0(%x: f32, %y: f32):
    linalg.yield %x : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%small : memref<2x4xf32>) outs(%small : memref<2x4xf32>) {
  ^bb0(%x: f32, %y: f32):
    %s = arith.addf %x, %x : f32
    linalg.yield %s : f32
  }
  %c = memref.cast %t : memref<8x8xf32> to memref<8x8xf32>
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%c : memref<8x8xf32>) outs(%t : memref<8x8xf32>) {
  ^bb0(%x: f32, %y: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#id], iterator_types = ["parallel", "parallel"]}
      outs(%t : memref<8x8xf32>) {
  ^bb0(%y: f32):
    %i = linalg.index 0 : index
    %j = arith.index_cast %i : index to i64
    %f = arith.sitofp %j : i64 to f32
    linalg.yield %f : f32
  }
  return
}

// CHECK-LABEL: func.func @host(
// CHECK: linalg.generic
func.func @host(%a: memref<8x8xf32>, %b: memref<8x8xf32>) {
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<8x8xf32>) outs(%b : memref<8x8xf32>) {
  ^bb0(%x: f32, %y: f32):
    linalg.yield %x : f32
  }
  return
}
