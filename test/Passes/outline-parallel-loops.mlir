// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-outline-parallel-loops{min-elements=32})' | ca-opt --split-input-file | FileCheck %s

// An elementwise generic over 8x4: it moves into @k__par0, which takes the block bounds
// first and the operands with their types unchanged (a 0-d operand and a broadcast one
// included) and is marked with the depth of the loop to bound (0); the constant the
// region reads is cloned. The kernel calls the fork, which says the body, the extent of
// the split dimension (8) and the block granularity (1: d0 is not the innermost loop).
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
#none = affine_map<(d0, d1) -> ()>
// CHECK-LABEL: func.func @k(
// CHECK-NOT: linalg.generic
// CHECK: call @k__par0_fork(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (memref<8x4xf32>, memref<4xf32>, memref<f32>, memref<8x4xf32>) -> ()
// CHECK: func.func @k__par0(%{{.*}}: index, %{{.*}}: index, %[[A:.*]]: memref<8x4xf32>, %[[B:.*]]: memref<4xf32>, %[[G:.*]]: memref<f32>, %[[C:.*]]: memref<8x4xf32>) attributes {ca.parallel_loop = [0, 8]}
// CHECK: %[[TWO:.*]] = arith.constant 2.0
// CHECK: linalg.generic {{.*}} ins(%[[A]], %[[B]], %[[G]] : memref<8x4xf32>, memref<4xf32>, memref<f32>) outs(%[[C]] : memref<8x4xf32>)
// CHECK: arith.mulf %{{.*}}, %[[TWO]]
// CHECK: func.func private @k__par0_fork(memref<8x4xf32>, memref<4xf32>, memref<f32>, memref<8x4xf32>) attributes {ca.parallel_fork = [@k__par0, 8, 1]}
func.func @k(%a: memref<8x4xf32>, %b: memref<4xf32>, %g: memref<f32>, %c: memref<8x4xf32>) attributes {ca.kernel} {
  %two = arith.constant 2.0 : f32
  linalg.generic {indexing_maps = [#id, #row, #none, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b, %g : memref<8x4xf32>, memref<4xf32>, memref<f32>) outs(%c : memref<8x4xf32>) {
  ^bb0(%x: f32, %y: f32, %s0: f32, %z: f32):
    %s = arith.addf %x, %y : f32
    %m = arith.mulf %s, %two : f32
    %n = arith.mulf %m, %s0 : f32
    linalg.yield %n : f32
  }
  return
}

// -----

// A row reduction (d1 reduced) splits by rows; a scalar the region reads is passed along.
#id = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (d0)>
// CHECK-LABEL: func.func @rows(
// CHECK: call @rows__par0_fork(%{{.*}}, %{{.*}}, %{{.*}}) : (memref<16x8xf64>, memref<16xf64>, f64) -> ()
// CHECK: func.func @rows__par0(%{{.*}}: index, %{{.*}}: index, %{{.*}}: memref<16x8xf64>, %{{.*}}: memref<16xf64>, %{{.*}}: f64) attributes {ca.parallel_loop = [0, 16]}
// CHECK: ca.parallel_fork = [@rows__par0, 16, 1]
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

// A column reduction (a bias gradient: d0 reduced) splits its first parallel dimension,
// d1, the innermost loop (depth 1, blocks of 16). A transpose, which reads d0 at an inner
// position, and a generic that reads d0's index split by d0: every thread sees the whole
// buffers, only its loop is shorter.
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
#t = affine_map<(d0, d1) -> (d1, d0)>
// CHECK-LABEL: func.func @more(
// CHECK-COUNT-3: call @more__par
// CHECK: func.func @more__par2({{.*}}) attributes {ca.parallel_loop = [0, 8]}
// CHECK: linalg.index 0
// CHECK: ca.parallel_fork = [@more__par2, 8, 1]
// CHECK: func.func @more__par1({{.*}}) attributes {ca.parallel_loop = [0, 8]}
// CHECK: ca.parallel_fork = [@more__par1, 8, 1]
// CHECK: func.func @more__par0({{.*}}) attributes {ca.parallel_loop = [1, 32]}
// CHECK: iterator_types = ["reduction", "parallel"]
// CHECK: ca.parallel_fork = [@more__par0, 32, 16]
func.func @more(%a: memref<8x32xf32>, %bias: memref<32xf32>, %x: memref<8x8xf32>, %t: memref<8x8xf32>, %i: memref<8x8xf32>) attributes {ca.kernel} {
  linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}
      ins(%a : memref<8x32xf32>) outs(%bias : memref<32xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %s = arith.addf %v, %acc : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#t, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<8x8xf32>) outs(%t : memref<8x8xf32>) {
  ^bb0(%v: f32, %o: f32):
    linalg.yield %v : f32
  }
  linalg.generic {indexing_maps = [#id], iterator_types = ["parallel", "parallel"]}
      outs(%i : memref<8x8xf32>) {
  ^bb0(%o: f32):
    %r = linalg.index 0 : index
    %j = arith.index_cast %r : index to i64
    %f = arith.sitofp %j : i64 to f32
    linalg.yield %f : f32
  }
  return
}

// -----

// Left alone: a loop nest under min-elements; an output the split dimension does not index
// (every block would write it); a generic that reads another view of the buffer it writes;
// one whose region stores to memory; one whose region loads from the buffer it writes (a
// row another block may be writing); and functions that are not kernels.
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
// CHECK-LABEL: func.func @kept(
// CHECK-NOT: call
// CHECK-COUNT-5: linalg.generic
// CHECK-NOT: __par
func.func @kept(%a: memref<8x8xf32>, %r: memref<8xf32>, %t: memref<8x8xf32>, %small: memref<2x4xf32>, %m: memref<8xf32>) attributes {ca.kernel} {
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%small : memref<2x4xf32>) outs(%small : memref<2x4xf32>) {
  ^bb0(%x: f32, %y: f32):
    %s = arith.addf %x, %x : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#id, #col], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<8x8xf32>) outs(%r : memref<8xf32>) {
  ^bb0(%x: f32, %y: f32):
    linalg.yield %x : f32
  }
  %c = memref.cast %t : memref<8x8xf32> to memref<8x8xf32>
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%c : memref<8x8xf32>) outs(%t : memref<8x8xf32>) {
  ^bb0(%x: f32, %y: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<8x8xf32>) outs(%t : memref<8x8xf32>) {
  ^bb0(%x: f32, %y: f32):
    %c0 = arith.constant 0 : index
    memref.store %x, %m[%c0] : memref<8xf32>
    linalg.yield %x : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<8x8xf32>) outs(%t : memref<8x8xf32>) {
  ^bb0(%x: f32, %y: f32):
    %i = linalg.index 0 : index
    %c7 = arith.constant 7 : index
    %j = arith.subi %c7, %i : index
    %c0 = arith.constant 0 : index
    %o = memref.load %t[%j, %c0] : memref<8x8xf32>
    %s = arith.addf %x, %o : f32
    linalg.yield %s : f32
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

// -----

// A static view is passed as the buffer it views and made again in the body, where
// ca-fold-views can fold it into the loads (a view argument could not be folded).
#id2 = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-LABEL: func.func @window(
// CHECK: call @window__par0_fork(%arg0, %arg1) : (memref<10x10xf32>, memref<8x8xf32>) -> ()
// CHECK: func.func @window__par0(%{{.*}}: index, %{{.*}}: index, %[[A:.*]]: memref<10x10xf32>, %[[B:.*]]: memref<8x8xf32>)
// CHECK: %[[S:.*]] = memref.subview %[[A]][1, 1] [8, 8] [1, 1]
// CHECK: linalg.generic {{.*}} ins(%[[S]] : memref<8x8xf32, strided<[10, 1], offset: 11>>) outs(%[[B]] : memref<8x8xf32>)
func.func @window(%a: memref<10x10xf32>, %b: memref<8x8xf32>) attributes {ca.kernel} {
  %s = memref.subview %a[1, 1] [8, 8] [1, 1] : memref<10x10xf32> to memref<8x8xf32, strided<[10, 1], offset: 11>>
  linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%s : memref<8x8xf32, strided<[10, 1], offset: 11>>) outs(%b : memref<8x8xf32>) {
  ^bb0(%x: f32, %y: f32):
    %e = math.exp %x : f32
    linalg.yield %e : f32
  }
  return
}
