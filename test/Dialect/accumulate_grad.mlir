// RUN: ca-opt %s | ca-opt | FileCheck %s
// Accumulation is a side effect: canonicalize and cse must neither drop nor merge it.
// RUN: ca-opt %s --canonicalize --cse | FileCheck %s --check-prefix=KEEP

// CHECK-LABEL: func.func @accumulate
// CHECK: "ca.accumulate_grad"(%{{.*}}, %{{.*}}) : (!torch.vtensor<[10,10],f32>, !torch.vtensor<[10,10],f32>) -> ()
// CHECK: "ca.accumulate_grad"(%{{.*}}, %{{.*}}) {param_index = 2 : i64} : (tensor<?x10xf64>, tensor<4x10xf64>) -> ()
// KEEP-LABEL: func.func @accumulate
// KEEP-COUNT-3: "ca.accumulate_grad"
func.func @accumulate(%w: !torch.vtensor<[10,10],f32>, %gw: !torch.vtensor<[10,10],f32>,
                      %b: tensor<?x10xf64>, %gb: tensor<4x10xf64>) {
  "ca.accumulate_grad"(%w, %gw) : (!torch.vtensor<[10,10],f32>, !torch.vtensor<[10,10],f32>) -> ()
  "ca.accumulate_grad"(%b, %gb) {param_index = 2 : i64} : (tensor<?x10xf64>, tensor<4x10xf64>) -> ()
  "ca.accumulate_grad"(%b, %gb) {param_index = 2 : i64} : (tensor<?x10xf64>, tensor<4x10xf64>) -> ()
  return
}

// Accumulation must stay ordered before the hook that reads the accumulated .grad.
// KEEP-LABEL: func.func @before_hook
// KEEP: "ca.accumulate_grad"
// KEEP-NEXT: "ca.hook"
func.func @before_hook(%w: !torch.vtensor<[10,10],f32>, %gw: !torch.vtensor<[10,10],f32>) {
  "ca.accumulate_grad"(%w, %gw) : (!torch.vtensor<[10,10],f32>, !torch.vtensor<[10,10],f32>) -> ()
  "ca.hook"(%w) {kind = "post_acc_grad_hook", hook_id = 0 : i64} : (!torch.vtensor<[10,10],f32>) -> ()
  return
}
