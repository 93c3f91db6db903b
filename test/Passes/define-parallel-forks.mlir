// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-define-parallel-forks)' | ca-opt | FileCheck %s
// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-define-parallel-forks)' | FileCheck %s --check-prefix=DECL

// The fork of a body that splits an extent of 8 (blocks of at least 4) over a 2-D memref
// and a scalar: its arguments go into a stack array for GOMP_parallel's task; the task
// takes its block [lo, hi) and calls the body with lo, hi and the arguments as they were.
// The body becomes internal: its task is its only caller.
// CHECK-LABEL: llvm.func internal @k__par0(
// CHECK-LABEL: llvm.func internal @k__par0_fork(
// CHECK: %[[CTX:.*]] = llvm.alloca %{{.*}} x i64
// CHECK: %[[TASK:.*]] = llvm.mlir.addressof @k__par0_task
// CHECK: %[[THREADS:.*]] = llvm.call @_ZN2at15get_num_threadsEv() : () -> i32
// CHECK: llvm.call @GOMP_parallel(%[[TASK]], %[[CTX]], %[[THREADS]], %{{.*}}) : (!llvm.ptr, !llvm.ptr, i32, i32) -> ()
// CHECK-LABEL: llvm.func internal @k__par0_task(
// CHECK: %[[TID:.*]] = llvm.call @omp_get_thread_num()
// CHECK: llvm.call @omp_get_num_threads()
// CHECK: llvm.mlir.constant(8 : i64)
// CHECK: llvm.mlir.constant(4 : i64)
// CHECK: %[[LO:.*]] = llvm.select
// CHECK: %[[HI:.*]] = llvm.select
// CHECK: llvm.cond_br
// CHECK: %[[ALLOC:.*]] = llvm.load %{{.*}} : !llvm.ptr -> !llvm.ptr
// CHECK: %[[ALIGNED:.*]] = llvm.load %{{.*}} : !llvm.ptr -> !llvm.ptr
// CHECK: %[[SCALE:.*]] = llvm.load %{{.*}} : !llvm.ptr -> f32
// CHECK: llvm.call @k__par0(%[[LO]], %[[HI]], %[[ALLOC]], %[[ALIGNED]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[SCALE]])
// DECL-DAG: llvm.func @GOMP_parallel(!llvm.ptr, !llvm.ptr, i32, i32)
// DECL-DAG: llvm.func @omp_get_thread_num() -> i32
// DECL-DAG: llvm.func @omp_get_num_threads() -> i32
// DECL-DAG: llvm.func @_ZN2at15get_num_threadsEv() -> i32
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
  llvm.func @k__par0(%lo: i64, %hi: i64, %a0: !llvm.ptr, %a1: !llvm.ptr, %a2: i64, %a3: i64, %a4: i64, %a5: i64, %a6: i64, %a7: f32) {
    llvm.return
  }
  llvm.func @k__par0_fork(!llvm.ptr, !llvm.ptr, i64, i64, i64, i64, i64, f32)
      attributes {ca.parallel_fork = [@k__par0, 8, 4], sym_visibility = "private"}
}
