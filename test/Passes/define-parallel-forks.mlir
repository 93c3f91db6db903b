// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-define-parallel-forks)' | ca-opt | FileCheck %s
// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-define-parallel-forks)' | FileCheck %s --check-prefix=DECL

// The fork of a body that takes a chunked 2-D memref (8 rows of 16 bytes) and a scalar:
// its arguments go into a stack array for GOMP_parallel's task; the task takes rows
// [lo, hi) of the 8, moves the memref's aligned pointer by lo * 16 bytes and sets its outer
// size to hi - lo; the scalar and the other descriptor fields pass unchanged.
// CHECK-LABEL: llvm.func internal @k__par0_fork(
// CHECK: %[[CTX:.*]] = llvm.alloca %{{.*}} x i64
// CHECK: %[[TASK:.*]] = llvm.mlir.addressof @k__par0_task
// CHECK: llvm.call @GOMP_parallel(%[[TASK]], %[[CTX]], %{{.*}}, %{{.*}}) : (!llvm.ptr, !llvm.ptr, i32, i32) -> ()
// CHECK-LABEL: llvm.func internal @k__par0_task(
// CHECK: llvm.call @omp_get_thread_num()
// CHECK: llvm.call @omp_get_num_threads()
// CHECK: %[[EXT:.*]] = llvm.mlir.constant(8 : i64)
// CHECK: llvm.cond_br
// CHECK: %[[ROWS:.*]] = llvm.sub %[[HI:.*]], %[[LO:.*]] : i64
// CHECK: %[[ALLOC:.*]] = llvm.load %{{.*}} : !llvm.ptr -> !llvm.ptr
// CHECK: %[[ALIGNED:.*]] = llvm.load %{{.*}} : !llvm.ptr -> !llvm.ptr
// CHECK: %[[SCALE:.*]] = llvm.load %{{.*}} : !llvm.ptr -> f32
// CHECK: %[[RB:.*]] = llvm.mlir.constant(16 : i64)
// CHECK: %[[OFF:.*]] = llvm.mul %[[LO]], %[[RB]]
// CHECK: %[[MOVED:.*]] = llvm.getelementptr %[[ALIGNED]][%[[OFF]]] : (!llvm.ptr, i64) -> !llvm.ptr, i8
// CHECK: llvm.call @k__par0(%[[ALLOC]], %[[MOVED]], %{{.*}}, %[[ROWS]], %{{.*}}, %{{.*}}, %{{.*}}, %[[SCALE]])
// DECL-DAG: llvm.func @GOMP_parallel(!llvm.ptr, !llvm.ptr, i32, i32)
// DECL-DAG: llvm.func @omp_get_thread_num() -> i32
// DECL-DAG: llvm.func @omp_get_num_threads() -> i32
// DECL-NOT: ca.parallel_fork
module {
  llvm.func @k(%p: !llvm.ptr, %s: f32) {
    %c0 = llvm.mlir.constant(0 : i64) : i64
    %c8 = llvm.mlir.constant(8 : i64) : i64
    %c4 = llvm.mlir.constant(4 : i64) : i64
    %c1 = llvm.mlir.constant(1 : i64) : i64
    llvm.call @k__par0_fork(%p, %p, %c0, %c8, %c4, %c4, %c1, %s) : (!llvm.ptr, !llvm.ptr, i64, i64, i64, i64, i64, f32) -> ()
    llvm.return
  }
  llvm.func @k__par0(!llvm.ptr, !llvm.ptr, i64, i64, i64, i64, i64, f32)
  llvm.func @k__par0_fork(!llvm.ptr, !llvm.ptr, i64, i64, i64, i64, i64, f32)
      attributes {ca.parallel_fork = [@k__par0, 8, [[2, 1, 16], [-1, 0, 0]]], sym_visibility = "private"}
}
