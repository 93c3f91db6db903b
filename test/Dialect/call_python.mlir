// RUN: ca-opt %s | ca-opt | FileCheck %s
// RUN: ca-opt %s --canonicalize | FileCheck %s --check-prefix=KEEP

// CHECK-LABEL: func.func @opaque
// CHECK: %[[R:.*]]:2 = "ca.call_python"(%{{.*}}) {callee = "aten::_scaled_dot_product_flash_attention_for_cpu_backward", id = 0 : i64} : (!torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>)
// CHECK: "ca.call_python"() {callee = "print", id = 1 : i64} : () -> ()
// The call may do anything in Python: it survives even with no uses.
// KEEP-LABEL: func.func @opaque
// KEEP-COUNT-2: "ca.call_python"
func.func @opaque(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %r:2 = "ca.call_python"(%g) {callee = "aten::_scaled_dot_product_flash_attention_for_cpu_backward", id = 0 : i64} : (!torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>)
  "ca.call_python"() {callee = "print", id = 1 : i64} : () -> ()
  return %r#0 : !torch.vtensor<[4],f32>
}
