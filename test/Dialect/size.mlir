// RUN: ca-opt %s | ca-opt | FileCheck %s

// CHECK-LABEL: func.func @sizes
// CHECK: %[[N:.*]] = "ca.size"(%{{.*}}) {index = 0 : i64} : (!torch.int) -> !torch.int
// CHECK: "ca.size"() {index = 1 : i64, value = 10 : i64} : () -> !torch.int
// CHECK: "ca.size"(%{{.*}}) {index = 2 : i64} : (index) -> index
// CHECK: "ca.size"() {index = 3 : i64, value = 4 : i64} : () -> i64
func.func @sizes(%s0: !torch.int, %i: index) -> (!torch.int, !torch.int) {
  %n = "ca.size"(%s0) {index = 0 : i64} : (!torch.int) -> !torch.int
  %n2 = "ca.size"(%s0) {index = 0 : i64} : (!torch.int) -> !torch.int
  %m = "ca.size"() {index = 1 : i64, value = 10 : i64} : () -> !torch.int
  %k = "ca.size"(%i) {index = 2 : i64} : (index) -> index
  %c = "ca.size"() {index = 3 : i64, value = 4 : i64} : () -> i64
  return %n, %n2 : !torch.int, !torch.int
}
