// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-expand-powers)' | ca-opt | FileCheck %s
// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-expand-powers{max-exponent=2})' | FileCheck %s --check-prefix=SMALL

// x^2, x^3, x^-1, x^-2: PyTorch's own formulas in the element type.
// CHECK-LABEL: func.func @exact
// CHECK-SAME: (%[[X:.*]]: f32)
// CHECK-NOT: math.fpowi
// CHECK-DAG: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK: %[[SQ:.*]] = arith.mulf %[[X]], %[[X]] : f32
// CHECK: %[[SQ2:.*]] = arith.mulf %[[X]], %[[X]] : f32
// CHECK: %[[CUBE:.*]] = arith.mulf %[[SQ2]], %[[X]] : f32
// CHECK: %[[INV:.*]] = arith.divf %{{.*}}, %[[X]] : f32
// CHECK: %[[SQ3:.*]] = arith.mulf %[[X]], %[[X]] : f32
// CHECK: %[[INV2:.*]] = arith.divf %{{.*}}, %[[SQ3]] : f32
// CHECK: return %[[ONE]], %[[X]], %[[SQ]], %[[CUBE]], %[[INV]], %[[INV2]]
// SMALL-LABEL: func.func @exact
// SMALL-NOT: math.fpowi %{{.*}}, %c2
// SMALL: math.fpowi %{{.*}}, %c3
// SMALL-NOT: math.fpowi
// SMALL: return
func.func @exact(%x: f32) -> (f32, f32, f32, f32, f32, f32) {
  %c0 = arith.constant 0 : i64
  %c1 = arith.constant 1 : i64
  %c2 = arith.constant 2 : i64
  %c3 = arith.constant 3 : i64
  %cm1 = arith.constant -1 : i64
  %cm2 = arith.constant -2 : i64
  %a = math.fpowi %x, %c0 : f32, i64
  %b = math.fpowi %x, %c1 : f32, i64
  %c = math.fpowi %x, %c2 : f32, i64
  %d = math.fpowi %x, %c3 : f32, i64
  %e = math.fpowi %x, %cm1 : f32, i64
  %f = math.fpowi %x, %cm2 : f32, i64
  return %a, %b, %c, %d, %e, %f : f32, f32, f32, f32, f32, f32
}

// Other f32 powers: repeated squaring in f64, rounded once; a division for n < 0.
// CHECK-LABEL: func.func @wide
// CHECK-SAME: (%[[X:.*]]: f32)
// CHECK: %[[W:.*]] = arith.extf %[[X]] : f32 to f64
// CHECK: %[[W2:.*]] = arith.mulf %[[W]], %[[W]] : f64
// CHECK: %[[W4:.*]] = arith.mulf %[[W2]], %[[W2]] : f64
// CHECK: %[[W5:.*]] = arith.mulf %[[W]], %[[W4]] : f64
// CHECK: %[[R:.*]] = arith.truncf %[[W5]] : f64 to f32
// CHECK: arith.extf
// CHECK: arith.mulf
// CHECK: arith.mulf
// CHECK: %[[INV:.*]] = arith.divf %{{.*}}, %{{.*}} : f64
// CHECK: %[[RN:.*]] = arith.truncf %[[INV]] : f64 to f32
// CHECK: return %[[R]], %[[RN]]
func.func @wide(%x: f32) -> (f32, f32) {
  %c5 = arith.constant 5 : i32
  %cm4 = arith.constant -4 : i64
  %a = math.fpowi %x, %c5 : f32, i32
  %b = math.fpowi %x, %cm4 : f32, i64
  return %a, %b : f32, f32
}

// powf by constants: integer-valued like fpowi, 0.5 -> sqrt, -0.5 -> 1/sqrt; others stay.
// CHECK-LABEL: func.func @powf
// CHECK-SAME: (%[[X:.*]]: f32)
// CHECK: %[[SQ:.*]] = arith.mulf %[[X]], %[[X]] : f32
// CHECK: %[[S:.*]] = math.sqrt %[[X]] : f32
// CHECK: %[[S2:.*]] = math.sqrt %[[X]] : f32
// CHECK: %[[RS:.*]] = arith.divf %{{.*}}, %[[S2]] : f32
// CHECK: %[[P:.*]] = math.powf %[[X]], %{{.*}} : f32
// CHECK: return %[[SQ]], %[[S]], %[[RS]], %[[P]]
func.func @powf(%x: f32) -> (f32, f32, f32, f32) {
  %two = arith.constant 2.000000e+00 : f32
  %half = arith.constant 5.000000e-01 : f32
  %mhalf = arith.constant -5.000000e-01 : f32
  %other = arith.constant 1.500000e+00 : f32
  %a = math.powf %x, %two : f32
  %b = math.powf %x, %half : f32
  %c = math.powf %x, %mhalf : f32
  %d = math.powf %x, %other : f32
  return %a, %b, %c, %d : f32, f32, f32, f32
}

// Vectors (splat exponents), f64, integers; non-constant and large exponents stay.
// CHECK-LABEL: func.func @others
// CHECK-SAME: (%[[V:.*]]: vector<8xf32>, %[[D:.*]]: f64, %[[I:.*]]: i32, %[[N:.*]]: i64, %[[Y:.*]]: f32)
// CHECK: %[[VS:.*]] = arith.mulf %[[V]], %[[V]] : vector<8xf32>
// CHECK: %[[VC:.*]] = arith.mulf %[[VS]], %[[V]] : vector<8xf32>
// CHECK: %[[D2:.*]] = arith.mulf %[[D]], %[[D]] : f64
// CHECK: %[[D4:.*]] = arith.mulf %[[D2]], %[[D2]] : f64
// CHECK: %[[I2:.*]] = arith.muli %[[I]], %[[I]] : i32
// CHECK: %[[I3:.*]] = arith.muli %[[I]], %[[I2]] : i32
// CHECK: %[[DYN:.*]] = math.fpowi %[[Y]], %[[N]] : f32, i64
// CHECK: %[[BIG:.*]] = math.fpowi %[[Y]], %{{.*}} : f32, i64
// CHECK: %[[NEG:.*]] = math.ipowi %[[I]], %{{.*}} : i32
// CHECK: return %[[VC]], %[[D4]], %[[I3]], %[[DYN]], %[[BIG]], %[[NEG]]
func.func @others(%v: vector<8xf32>, %d: f64, %i: i32, %n: i64, %y: f32) -> (vector<8xf32>, f64, i32, f32, f32, i32) {
  %c3v = arith.constant dense<3> : vector<8xi64>
  %c4 = arith.constant 4 : i64
  %c3i = arith.constant 3 : i32
  %c17 = arith.constant 17 : i64
  %cm1i = arith.constant -1 : i32
  %a = math.fpowi %v, %c3v : vector<8xf32>, vector<8xi64>
  %b = math.fpowi %d, %c4 : f64, i64
  %c = math.ipowi %i, %c3i : i32
  %e = math.fpowi %y, %n : f32, i64
  %f = math.fpowi %y, %c17 : f32, i64
  %g = math.ipowi %i, %cm1i : i32
  return %a, %b, %c, %e, %f, %g : vector<8xf32>, f64, i32, f32, f32, i32
}
