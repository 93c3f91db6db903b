// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-gpu-parallel-dims-first)' | ca-opt | FileCheck %s --check-prefix=FIRST
// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-gpu-parallel-dims-first,func.func(convert-linalg-to-parallel-loops),canonicalize,ca-gpu-flatten-parallel)' | ca-opt | FileCheck %s --check-prefix=FLAT

// A column sum (a bias gradient): the reduction dim comes first in linalg's order.
// FIRST: #[[IN:map[0-9]*]] = affine_map<(d0, d1) -> (d1, d0)>
// FIRST: #[[OUT:map[0-9]*]] = affine_map<(d0, d1) -> (0, d0)>
// FIRST-LABEL: func.func @column_sum
// FIRST: linalg.generic {indexing_maps = [#[[IN]], #[[OUT]]], iterator_types = ["parallel", "reduction"]}
// FLAT-LABEL: func.func @column_sum
// FLAT-NOT: scf.for {{.*}} {
// FLAT: scf.parallel (%[[J:.*]]) = (%{{.*}}) to (%{{.*}}) step
// FLAT: scf.for
// FLAT: memref.load %{{.*}}[%{{.*}}, %[[J]]] : memref<8x4xf32>
func.func @column_sum(%x: memref<8x4xf32>, %s: memref<1x4xf32>) {
  linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (0, d1)>],
                  iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<8x4xf32>) outs(%s : memref<1x4xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %0 = arith.addf %in, %acc : f32
    linalg.yield %0 : f32
  }
  return
}

// Two parallel dims become one loop over 8*4 = 32 elements, indices by div/rem.
// FLAT-LABEL: func.func @elementwise
// FLAT-DAG: %[[C32:.*]] = arith.constant 32 : index
// FLAT-DAG: %[[C4:.*]] = arith.constant 4 : index
// FLAT: scf.parallel (%[[K:.*]]) = (%{{.*}}) to (%[[C32]])
// FLAT: %[[J:.*]] = arith.remui %[[K]], %[[C4]]
// FLAT: %[[I:.*]] = arith.divui %[[K]], %[[C4]]
// FLAT: memref.store %{{.*}}, %{{.*}}[%[[I]], %[[J]]] : memref<8x4xf32>
func.func @elementwise(%x: memref<8x4xf32>, %y: memref<8x4xf32>) {
  linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<8x4xf32>) outs(%y : memref<8x4xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.mulf %in, %in : f32
    linalg.yield %0 : f32
  }
  return
}

// A full reduction has no parallel dim: its loop goes into a one-iteration parallel loop.
// FLAT-LABEL: func.func @total
// FLAT: scf.parallel (%{{.*}}) = (%{{.*}}) to (%{{.*}}) step
// FLAT: scf.for
// FLAT: scf.reduce
// FLAT: return
func.func @total(%x: memref<8xf32>, %s: memref<f32>) {
  linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> ()>],
                  iterator_types = ["reduction"]}
      ins(%x : memref<8xf32>) outs(%s : memref<f32>) {
  ^bb0(%in: f32, %acc: f32):
    %0 = arith.addf %in, %acc : f32
    linalg.yield %0 : f32
  }
  return
}
