// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-narrow-float-conversions)' | FileCheck %s

// f64 <-> bf16/f16 through f32 (rounding twice, as PyTorch's c10::BFloat16(double) does).
// CHECK-LABEL: func.func @floats
// CHECK-SAME: (%[[D:.*]]: f64, %[[B:.*]]: bf16, %[[H:.*]]: vector<8xf16>)
// CHECK: %[[T:.*]] = arith.truncf %[[D]] : f64 to f32
// CHECK: %[[TB:.*]] = arith.truncf %[[T]] : f32 to bf16
// CHECK: %[[E:.*]] = arith.extf %[[B]] : bf16 to f32
// CHECK: %[[EB:.*]] = arith.extf %[[E]] : f32 to f64
// CHECK: %[[V:.*]] = arith.extf %[[H]] : vector<8xf16> to vector<8xf32>
// CHECK: %[[VD:.*]] = arith.extf %[[V]] : vector<8xf32> to vector<8xf64>
// f32 <-> bf16 is left alone (arith-expand{include-bf16=true} takes it).
// CHECK: %[[KEEP:.*]] = arith.truncf %{{.*}} : f32 to bf16
// CHECK: return %[[TB]], %[[EB]], %[[VD]], %[[KEEP]]
func.func @floats(%d: f64, %b: bf16, %h: vector<8xf16>) -> (bf16, f64, vector<8xf64>, bf16) {
  %0 = arith.truncf %d : f64 to bf16
  %1 = arith.extf %b : bf16 to f64
  %2 = arith.extf %h : vector<8xf16> to vector<8xf64>
  %f = arith.constant 1.5 : f32
  %3 = arith.truncf %f : f32 to bf16
  return %0, %1, %2, %3 : bf16, f64, vector<8xf64>, bf16
}

// Integers <-> bf16/f16 through f32.
// CHECK-LABEL: func.func @ints
// CHECK-SAME: (%[[I:.*]]: i64, %[[X:.*]]: f16)
// CHECK: %[[S:.*]] = arith.sitofp %[[I]] : i64 to f32
// CHECK: %[[SB:.*]] = arith.truncf %[[S]] : f32 to bf16
// CHECK: %[[U:.*]] = arith.uitofp %[[I]] : i64 to f32
// CHECK: %[[UH:.*]] = arith.truncf %[[U]] : f32 to f16
// CHECK: %[[W:.*]] = arith.extf %[[X]] : f16 to f32
// CHECK: %[[N:.*]] = arith.fptosi %[[W]] : f32 to i32
// CHECK: return %[[SB]], %[[UH]], %[[N]]
func.func @ints(%i: i64, %x: f16) -> (bf16, f16, i32) {
  %0 = arith.sitofp %i : i64 to bf16
  %1 = arith.uitofp %i : i64 to f16
  %2 = arith.fptosi %x : f16 to i32
  return %0, %1, %2 : bf16, f16, i32
}

// f32 and f64 conversions are not touched.
// CHECK-LABEL: func.func @wide
// CHECK-NEXT: arith.truncf %{{.*}} : f64 to f32
// CHECK-NEXT: arith.sitofp %{{.*}} : i64 to f64
func.func @wide(%d: f64, %i: i64) -> (f32, f64) {
  %0 = arith.truncf %d : f64 to f32
  %1 = arith.sitofp %i : i64 to f64
  return %0, %1 : f32, f64
}

// The `contract` flag arith-emulate-unsupported-floats sets is dropped, so canonicalize
// cannot fold extf(truncf(x)) and skip an op's rounding.
// CHECK-LABEL: func.func @rounding
// CHECK: arith.truncf %{{.*}} : f32 to bf16
// CHECK-NOT: fastmath
// CHECK: arith.extf %{{.*}} : bf16 to f32
// CHECK: return
func.func @rounding(%x: f32) -> f32 {
  %0 = arith.truncf %x fastmath<contract> : f32 to bf16
  %1 = arith.extf %0 fastmath<contract> : bf16 to f32
  return %1 : f32
}
