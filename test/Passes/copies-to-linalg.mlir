// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-copies-to-linalg)' | ca-opt | FileCheck %s

// CHECK-LABEL: func.func @k
// CHECK-NOT: memref.copy
// CHECK: linalg.copy {{.*}}ins(%{{.*}} : memref<4x4xf32, strided<[1, 4]>>) outs(%{{.*}} : memref<4x4xf32>)
func.func @k(%a: memref<4x4xf32, strided<[1, 4]>>, %b: memref<4x4xf32>) {
  memref.copy %a, %b : memref<4x4xf32, strided<[1, 4]>> to memref<4x4xf32>
  return
}
