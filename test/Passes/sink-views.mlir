// RUN: ca-opt %s --split-input-file --ca-sink-views | FileCheck %s

// A weight gradient transposed by one kernel (AddmmBackward's `t`) and transposed back by
// the next (TBackward), with a hook between them: the first kernel returns the mm itself,
// the second is an identity view of it and is erased; the accumulation reads the mm.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[G:.*]]: !torch.vtensor<[2,3],f32>, %[[X:.*]]: !torch.vtensor<[2,3],f32>, %[[B:.*]]: !torch.vtensor<[3],f32>, %[[W:.*]]: !torch.vtensor<[3,3],f32>)
// CHECK-NEXT: %[[K:.*]]:2 = call @backward_kernel_0(%[[G]], %[[X]]) : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3,3],f32>)
// CHECK-NEXT: "ca.accumulate_grad"(%[[B]], %[[K]]#0)
// CHECK-NEXT: "ca.hook"(%[[B]])
// CHECK-NEXT: "ca.accumulate_grad"(%[[W]], %[[K]]#1)
// CHECK-NEXT: "ca.hook"(%[[W]])
// CHECK-NEXT: return
// CHECK: func.func private @backward_kernel_0
// CHECK: %[[MM:.*]] = torch.aten.mm
// CHECK-NOT: torch.aten.t %[[MM]]
// CHECK: return %{{.*}}, %[[MM]] :
// CHECK-NOT: @backward_kernel_1
func.func @backward(%g: !torch.vtensor<[2,3],f32>, %x: !torch.vtensor<[2,3],f32>, %b: !torch.vtensor<[3],f32>, %w: !torch.vtensor<[3,3],f32>) {
  %0:2 = call @backward_kernel_0(%g, %x) : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3,3],f32>)
  "ca.accumulate_grad"(%b, %0#0) : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> ()
  "ca.hook"(%b) {hook_id = 0 : i64, kind = "post_acc_grad_hook"} : (!torch.vtensor<[3],f32>) -> ()
  %1 = call @backward_kernel_1(%0#1) : (!torch.vtensor<[3,3],f32>) -> !torch.vtensor<[3,3],f32>
  "ca.accumulate_grad"(%w, %1) : (!torch.vtensor<[3,3],f32>, !torch.vtensor<[3,3],f32>) -> ()
  "ca.hook"(%w) {hook_id = 1 : i64, kind = "post_acc_grad_hook"} : (!torch.vtensor<[3,3],f32>) -> ()
  return
}
func.func private @backward_kernel_0(%g: !torch.vtensor<[2,3],f32>, %x: !torch.vtensor<[2,3],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3,3],f32>) attributes {ca.kernel} {
  %int0 = torch.constant.int 0
  %false = torch.constant.bool false
  %none = torch.constant.none
  %dims = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %0 = torch.aten.sum.dim_IntList %g, %dims, %false, %none : !torch.vtensor<[2,3],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[3],f32>
  %1 = torch.aten.t %g : !torch.vtensor<[2,3],f32> -> !torch.vtensor<[3,2],f32>
  %2 = torch.aten.mm %1, %x : !torch.vtensor<[3,2],f32>, !torch.vtensor<[2,3],f32> -> !torch.vtensor<[3,3],f32>
  %3 = torch.aten.t %2 : !torch.vtensor<[3,3],f32> -> !torch.vtensor<[3,3],f32>
  return %0, %3 : !torch.vtensor<[3],f32>, !torch.vtensor<[3,3],f32>
}
func.func private @backward_kernel_1(%a: !torch.vtensor<[3,3],f32>) -> !torch.vtensor<[3,3],f32> attributes {ca.kernel} {
  %0 = torch.aten.t %a : !torch.vtensor<[3,3],f32> -> !torch.vtensor<[3,3],f32>
  return %0 : !torch.vtensor<[3,3],f32>
}

// -----

// A saved weight passed as its contiguous base and permuted in the IR (ca-specialize-layouts)
// is permuted in the first kernel, but only a kernel after the hook multiplies by it: the
// first kernel no longer returns the permutation (a transposed copy), the host passes the
// base to the second kernel, which permutes it itself (a BLAS transpose flag once lowered).
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[G:.*]]: !torch.vtensor<[2,3],f32>, %[[WB:.*]]: !torch.vtensor<[3,3],f32>, %[[B:.*]]: !torch.vtensor<[3],f32>)
// CHECK-NEXT: %[[K0:.*]] = call @backward_kernel_0(%[[G]]) : (!torch.vtensor<[2,3],f32>) -> !torch.vtensor<[3],f32>
// CHECK-NEXT: "ca.accumulate_grad"(%[[B]], %[[K0]])
// CHECK-NEXT: "ca.hook"(%[[B]])
// CHECK-NEXT: %[[K1:.*]] = call @backward_kernel_1(%[[G]], %[[WB]]) : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[3,3],f32>) -> !torch.vtensor<[2,3],f32>
// CHECK-NEXT: return %[[K1]]
// CHECK: func.func private @backward_kernel_0(%{{.*}}: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[3],f32>
// CHECK-NOT: torch.aten.permute
// CHECK: func.func private @backward_kernel_1(%[[A0:.*]]: !torch.vtensor<[2,3],f32>, %[[A1:.*]]: !torch.vtensor<[3,3],f32>)
// CHECK: %[[P:.*]] = torch.aten.permute %[[A1]]
// CHECK: %[[T:.*]] = torch.aten.t %[[P]]
// CHECK: torch.aten.mm %[[A0]], %[[T]]
func.func @backward(%g: !torch.vtensor<[2,3],f32>, %wb: !torch.vtensor<[3,3],f32>, %b: !torch.vtensor<[3],f32>) -> !torch.vtensor<[2,3],f32> {
  %0:2 = call @backward_kernel_0(%wb, %g) : (!torch.vtensor<[3,3],f32>, !torch.vtensor<[2,3],f32>) -> (!torch.vtensor<[3,3],f32>, !torch.vtensor<[3],f32>)
  "ca.accumulate_grad"(%b, %0#1) : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> ()
  "ca.hook"(%b) {hook_id = 0 : i64, kind = "post_acc_grad_hook"} : (!torch.vtensor<[3],f32>) -> ()
  %1 = call @backward_kernel_1(%g, %0#0) : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[3,3],f32>) -> !torch.vtensor<[2,3],f32>
  return %1 : !torch.vtensor<[2,3],f32>
}
func.func private @backward_kernel_0(%wb: !torch.vtensor<[3,3],f32>, %g: !torch.vtensor<[2,3],f32>) -> (!torch.vtensor<[3,3],f32>, !torch.vtensor<[3],f32>) attributes {ca.kernel} {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %none = torch.constant.none
  %perm = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %0 = torch.aten.permute %wb, %perm : !torch.vtensor<[3,3],f32>, !torch.list<int> -> !torch.vtensor<[3,3],f32>
  %dims = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %1 = torch.aten.sum.dim_IntList %g, %dims, %false, %none : !torch.vtensor<[2,3],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[3],f32>
  return %0, %1 : !torch.vtensor<[3,3],f32>, !torch.vtensor<[3],f32>
}
func.func private @backward_kernel_1(%g: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[3,3],f32>) -> !torch.vtensor<[2,3],f32> attributes {ca.kernel} {
  %0 = torch.aten.t %w : !torch.vtensor<[3,3],f32> -> !torch.vtensor<[3,3],f32>
  %1 = torch.aten.mm %g, %0 : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,3],f32> -> !torch.vtensor<[2,3],f32>
  return %1 : !torch.vtensor<[2,3],f32>
}

// -----

// A view of a value computed in the kernel, read by a later kernel: the producer returns
// the value, the consumer recomputes the view (a reshape here) from it.
// CHECK-LABEL: func.func @backward
// CHECK: %[[K0:.*]] = call @backward_kernel_0(%{{.*}}) : (!torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
// CHECK: "ca.hook"
// CHECK: call @backward_kernel_1(%[[K0]]) : (!torch.vtensor<[2,3],f32>) -> !torch.vtensor<[6],f32>
// CHECK: func.func private @backward_kernel_0
// CHECK: %[[N:.*]] = torch.aten.neg
// CHECK-NEXT: return %[[N]]
// CHECK: func.func private @backward_kernel_1(%[[A:.*]]: !torch.vtensor<[2,3],f32>)
// CHECK: %[[V:.*]] = torch.aten.view %[[A]]
// CHECK: torch.aten.mul.Tensor %[[V]], %[[V]]
func.func @backward(%g: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[6],f32> {
  %0 = call @backward_kernel_0(%g) : (!torch.vtensor<[2,3],f32>) -> !torch.vtensor<[6],f32>
  "ca.hook"() {hook_id = 0 : i64, kind = "post_hook"} : () -> ()
  %1 = call @backward_kernel_1(%0) : (!torch.vtensor<[6],f32>) -> !torch.vtensor<[6],f32>
  return %1 : !torch.vtensor<[6],f32>
}
func.func private @backward_kernel_0(%g: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[6],f32> attributes {ca.kernel} {
  %int6 = torch.constant.int 6
  %0 = torch.aten.neg %g : !torch.vtensor<[2,3],f32> -> !torch.vtensor<[2,3],f32>
  %shape = torch.prim.ListConstruct %int6 : (!torch.int) -> !torch.list<int>
  %1 = torch.aten.view %0, %shape : !torch.vtensor<[2,3],f32>, !torch.list<int> -> !torch.vtensor<[6],f32>
  return %1 : !torch.vtensor<[6],f32>
}
func.func private @backward_kernel_1(%a: !torch.vtensor<[6],f32>) -> !torch.vtensor<[6],f32> attributes {ca.kernel} {
  %0 = torch.aten.mul.Tensor %a, %a : !torch.vtensor<[6],f32>, !torch.vtensor<[6],f32> -> !torch.vtensor<[6],f32>
  return %0 : !torch.vtensor<[6],f32>
}

// -----

// What stays: a view the host reads itself (an accumulation needs the tensor), and a view
// whose shape is a symbolic size (a kernel argument, not a constant).
// CHECK-LABEL: func.func @backward
// CHECK: %[[K:.*]]:2 = call @backward_kernel_0
// CHECK-NEXT: "ca.accumulate_grad"(%{{.*}}, %[[K]]#0)
// CHECK-NEXT: "ca.hook"
// CHECK-NEXT: call @backward_kernel_1(%[[K]]#1)
// CHECK: func.func private @backward_kernel_0
// CHECK: %[[T:.*]] = torch.aten.t
// CHECK: %[[V:.*]] = torch.aten.view
// CHECK: return %[[T]], %[[V]]
func.func @backward(%g: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[3,2],f32>, %n: !torch.int) -> !torch.vtensor<[?],f32> {
  %0:2 = call @backward_kernel_0(%g, %n) : (!torch.vtensor<[2,3],f32>, !torch.int) -> (!torch.vtensor<[3,2],f32>, !torch.vtensor<[?],f32>)
  "ca.accumulate_grad"(%w, %0#0) : (!torch.vtensor<[3,2],f32>, !torch.vtensor<[3,2],f32>) -> ()
  "ca.hook"(%w) {hook_id = 0 : i64, kind = "post_acc_grad_hook"} : (!torch.vtensor<[3,2],f32>) -> ()
  %1 = call @backward_kernel_1(%0#1) : (!torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32>
  return %1 : !torch.vtensor<[?],f32>
}
func.func private @backward_kernel_0(%g: !torch.vtensor<[2,3],f32>, %n: !torch.int) -> (!torch.vtensor<[3,2],f32>, !torch.vtensor<[?],f32>) attributes {ca.kernel} {
  %0 = torch.aten.t %g : !torch.vtensor<[2,3],f32> -> !torch.vtensor<[3,2],f32>
  %1 = torch.aten.neg %g : !torch.vtensor<[2,3],f32> -> !torch.vtensor<[2,3],f32>
  %shape = torch.prim.ListConstruct %n : (!torch.int) -> !torch.list<int>
  %2 = torch.aten.view %1, %shape : !torch.vtensor<[2,3],f32>, !torch.list<int> -> !torch.vtensor<[?],f32>
  return %0, %2 : !torch.vtensor<[3,2],f32>, !torch.vtensor<[?],f32>
}
func.func private @backward_kernel_1(%a: !torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32> attributes {ca.kernel} {
  %0 = torch.aten.neg %a : !torch.vtensor<[?],f32> -> !torch.vtensor<[?],f32>
  return %0 : !torch.vtensor<[?],f32>
}

// -----

// A channels_last saved activation, passed permuted to contiguous (NHWC) and permuted back
// in the kernel, that only a host op (run through torch) reads: the host makes the view
// from the argument itself, so torch's kernel gets the channels_last tensor with no copy,
// and the kernel keeps only its own result.
// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[G:.*]]: !torch.vtensor<[2,3,4,4],f32>, %[[X:.*]]: !torch.vtensor<[2,4,4,3],f32>)
// CHECK: %[[NCHW:.*]] = torch.aten.permute %[[X]], %{{.*}} {ca.host} : !torch.vtensor<[2,4,4,3],f32>, !torch.list<int> -> !torch.vtensor<[2,3,4,4],f32>
// CHECK-NEXT: %[[K:.*]] = call @backward_kernel_0(%[[G]]) : (!torch.vtensor<[2,3,4,4],f32>) -> !torch.vtensor<[2,3,4,4],f32>
// CHECK: torch.aten.convolution_backward %[[K]], %[[NCHW]], {{.*}} {ca.host}
// CHECK: func.func private @backward_kernel_0(%{{.*}}: !torch.vtensor<[2,3,4,4],f32>) -> !torch.vtensor<[2,3,4,4],f32>
// CHECK-NOT: torch.aten.permute
// CHECK: return
func.func @backward(%g: !torch.vtensor<[2,3,4,4],f32>, %x: !torch.vtensor<[2,4,4,3],f32>) {
  %0:2 = call @backward_kernel_0(%g, %x) : (!torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,4,4,3],f32>) -> (!torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,3,4,4],f32>)
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %bias = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %ones = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %zeros = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %mask = torch.prim.ListConstruct %false, %true, %false : (!torch.bool, !torch.bool, !torch.bool) -> !torch.list<bool>
  %w = torch.vtensor.literal(dense<1.0> : tensor<3x3x1x1xf32>) : !torch.vtensor<[3,3,1,1],f32>
  %r0, %r1, %r2 = torch.aten.convolution_backward %0#0, %0#1, %w, %bias, %ones, %zeros, %ones, %false, %zeros, %int1, %mask {ca.host} : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[3,3,1,1],f32>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int, !torch.list<bool> -> !torch.none, !torch.vtensor<[3,3,1,1],f32>, !torch.none
  return
}
func.func private @backward_kernel_0(%g: !torch.vtensor<[2,3,4,4],f32>, %x: !torch.vtensor<[2,4,4,3],f32>) -> (!torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,3,4,4],f32>) attributes {ca.kernel} {
  %float2 = torch.constant.float 2.000000e+00
  %0 = torch.aten.mul.Scalar %g, %float2 : !torch.vtensor<[2,3,4,4],f32>, !torch.float -> !torch.vtensor<[2,3,4,4],f32>
  %int0 = torch.constant.int 0
  %int3 = torch.constant.int 3
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %perm = torch.prim.ListConstruct %int0, %int3, %int1, %int2 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %1 = torch.aten.permute %x, %perm : !torch.vtensor<[2,4,4,3],f32>, !torch.list<int> -> !torch.vtensor<[2,3,4,4],f32>
  return %0, %1 : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,3,4,4],f32>
}

// -----

// A view of a value the kernel computes (an output projection's mm, viewed as (L, B, H, D)
// and permuted to (B, H, L, D)) that only a host op reads: the kernel returns the mm itself,
// contiguous, and the host makes the view, so torch's attention backward gets the layout
// eager's engine hands it instead of a contiguous copy.
// CHECK-LABEL: func.func @backward
// CHECK: %[[MM:.*]] = call @backward_kernel_0(%{{.*}}, %{{.*}}) : (!torch.vtensor<[16,32],f32>, !torch.vtensor<[32,32],f32>) -> !torch.vtensor<[16,32],f32>
// CHECK: %[[V:.*]] = torch.aten.view %[[MM]], %{{.*}} {ca.host} : !torch.vtensor<[16,32],f32>, !torch.list<int> -> !torch.vtensor<[8,2,4,8],f32>
// CHECK: %[[P:.*]] = torch.aten.permute %[[V]], %{{.*}} {ca.host} : !torch.vtensor<[8,2,4,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,8,8],f32>
// CHECK: torch.aten.neg %[[P]] {ca.host}
// CHECK: func.func private @backward_kernel_0({{.*}}) -> !torch.vtensor<[16,32],f32>
// CHECK: %[[R:.*]] = torch.aten.mm
// CHECK-NOT: torch.aten.permute
// CHECK: return %[[R]]
func.func @backward(%g: !torch.vtensor<[16,32],f32>, %w: !torch.vtensor<[32,32],f32>) {
  %0 = call @backward_kernel_0(%g, %w) : (!torch.vtensor<[16,32],f32>, !torch.vtensor<[32,32],f32>) -> !torch.vtensor<[2,4,8,8],f32>
  %1 = torch.aten.neg %0 {ca.host} : !torch.vtensor<[2,4,8,8],f32> -> !torch.vtensor<[2,4,8,8],f32>
  return
}
func.func private @backward_kernel_0(%g: !torch.vtensor<[16,32],f32>, %w: !torch.vtensor<[32,32],f32>) -> !torch.vtensor<[2,4,8,8],f32> attributes {ca.kernel} {
  %0 = torch.aten.mm %g, %w : !torch.vtensor<[16,32],f32>, !torch.vtensor<[32,32],f32> -> !torch.vtensor<[16,32],f32>
  %int8 = torch.constant.int 8
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %shape = torch.prim.ListConstruct %int8, %int2, %int4, %int8 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %1 = torch.aten.view %0, %shape : !torch.vtensor<[16,32],f32>, !torch.list<int> -> !torch.vtensor<[8,2,4,8],f32>
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int3 = torch.constant.int 3
  %perm = torch.prim.ListConstruct %int1, %int2, %int0, %int3 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %2 = torch.aten.permute %1, %perm : !torch.vtensor<[8,2,4,8],f32>, !torch.list<int> -> !torch.vtensor<[2,4,8,8],f32>
  return %2 : !torch.vtensor<[2,4,8,8],f32>
}

// -----

// A view after a permutation may not be a view in torch (it needs a copy there): such a
// chain stays in the kernel.
// CHECK-LABEL: func.func @backward
// CHECK: %[[K:.*]] = call @backward_kernel_0(%{{.*}}) : (!torch.vtensor<[4,6],f32>) -> !torch.vtensor<[24],f32>
// CHECK-NEXT: torch.aten.neg %[[K]] {ca.host}
// CHECK: func.func private @backward_kernel_0
// CHECK: torch.aten.t
// CHECK: torch.aten.view
func.func @backward(%g: !torch.vtensor<[4,6],f32>) {
  %0 = call @backward_kernel_0(%g) : (!torch.vtensor<[4,6],f32>) -> !torch.vtensor<[24],f32>
  %1 = torch.aten.neg %0 {ca.host} : !torch.vtensor<[24],f32> -> !torch.vtensor<[24],f32>
  return
}
func.func private @backward_kernel_0(%g: !torch.vtensor<[4,6],f32>) -> !torch.vtensor<[24],f32> attributes {ca.kernel} {
  %float2 = torch.constant.float 2.000000e+00
  %0 = torch.aten.mul.Scalar %g, %float2 : !torch.vtensor<[4,6],f32>, !torch.float -> !torch.vtensor<[4,6],f32>
  %1 = torch.aten.t %0 : !torch.vtensor<[4,6],f32> -> !torch.vtensor<[6,4],f32>
  %int24 = torch.constant.int 24
  %shape = torch.prim.ListConstruct %int24 : (!torch.int) -> !torch.list<int>
  %2 = torch.aten.view %1, %shape : !torch.vtensor<[6,4],f32>, !torch.list<int> -> !torch.vtensor<[24],f32>
  return %2 : !torch.vtensor<[24],f32>
}
