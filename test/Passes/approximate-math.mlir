// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-approximate-math)' | ca-opt | FileCheck %s

// f32 exp, erf and tanh become fma polynomials; f64 is left to libm.
// CHECK-LABEL: func.func @k
// CHECK-NOT: math.exp %{{.*}} : f32
// CHECK-NOT: math.erf %{{.*}} : f32
// CHECK-NOT: math.tanh %{{.*}} : f32
// CHECK: math.fma
// CHECK: math.floor
// CHECK: math.copysign
// CHECK: math.exp %{{.*}} : f64
func.func @k(%x: f32, %y: f64) -> (f32, f32, f64, f32) {
  %a = math.exp %x : f32
  %b = math.erf %x : f32
  %c = math.exp %y : f64
  %d = math.tanh %x : f32
  return %a, %b, %c, %d : f32, f32, f64, f32
}
