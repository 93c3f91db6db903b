// RUN: ca-opt %s --split-input-file --ca-depthwise-kernels | FileCheck %s
// RUN: ca-opt %s --split-input-file --pass-pipeline='builtin.module(ca-depthwise-kernels{twins=true})' | FileCheck %s --check-prefix=TWIN

// With twins=true the op stays as the kernel's torch twin, on the kernel's three tensors,
// returning the two gradients the kernel returns (the runtime measures one against the other).
// TWIN: func.func private @backward_kernel_1__torch(%{{.*}}: !torch.vtensor<[2,8,2,2],f32>, %{{.*}}: !torch.vtensor<[2,8,4,4],f32>, %{{.*}}: !torch.vtensor<[8,1,3,3],f32>) -> (!torch.vtensor<[2,8,4,4],f32>, !torch.vtensor<[8,1,3,3],f32>) attributes {ca.torch_twin = "backward_kernel_1"}
// TWIN: %[[R0:.*]], %[[R1:.*]], %{{.*}} = torch.aten.convolution_backward %arg0, %arg1, %arg2, %none
// TWIN-NOT: ca.host
// TWIN: return %[[R0]], %[[R1]]

// A depthwise 3x3 backward (8 channels, 2x2 outputs from 4x4 with stride 2, padding 1) on
// the host becomes a call of a new kernel: the input gradient sums, per tap, a shifted
// window of grad_y placed with stride 2 into zeros (innermost loop: the last spatial dim,
// parallel); the weight gradient sums grad_y times a window of the padded input (innermost
// loop: the last tap dim, parallel). No bias gradient was asked for: a none.
// CHECK-LABEL: func.func @backward(
// CHECK-NOT: torch.aten.convolution_backward
// CHECK: %[[K:.*]]:2 = call @backward_kernel_1(%{{.*}}, %{{.*}}, %{{.*}}) : (tensor<2x8x2x2xf32>, tensor<2x8x4x4xf32>, tensor<8x1x3x3xf32>) -> (tensor<2x8x4x4xf32>, tensor<8x1x3x3xf32>)
// CHECK: %[[GX:.*]] = torch_c.from_builtin_tensor %[[K]]#0 : tensor<2x8x4x4xf32> -> !torch.vtensor<[2,8,4,4],f32>
// CHECK: %[[GW:.*]] = torch_c.from_builtin_tensor %[[K]]#1 : tensor<8x1x3x3xf32> -> !torch.vtensor<[8,1,3,3],f32>
// CHECK: "ca.accumulate_grad"(%arg1, %[[GX]])
// CHECK: "ca.accumulate_grad"(%arg2, %[[GW]])
// CHECK: func.func private @backward_kernel_1(%{{.*}}: tensor<2x8x2x2xf32>, %{{.*}}: tensor<2x8x4x4xf32>, %{{.*}}: tensor<8x1x3x3xf32>) -> (tensor<2x8x4x4xf32>, tensor<8x1x3x3xf32>) attributes {ca.kernel}
// CHECK: tensor.insert_slice %{{.*}} into %{{.*}}[0, 0, 1, 1] [2, 8, 2, 2] [1, 1, 2, 2] : tensor<2x8x2x2xf32> into tensor<2x8x6x6xf32>
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "parallel"]
// CHECK: tensor.pad %{{.*}} low[0, 0, 1, 1] high[0, 0, 1, 1]
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction", "reduction", "reduction", "parallel"]
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0, 1], [2], [3]] output_shape [8, 1, 3, 3] : tensor<8x3x3xf32> into tensor<8x1x3x3xf32>
func.func @backward(%gy: !torch.vtensor<[2,8,2,2],f32>, %x: !torch.vtensor<[2,8,4,4],f32>, %w: !torch.vtensor<[8,1,3,3],f32>) {
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int0 = torch.constant.int 0
  %int8 = torch.constant.int 8
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %stride = torch.prim.ListConstruct %int2, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %opad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %mask = torch.prim.ListConstruct %true, %true, %false : (!torch.bool, !torch.bool, !torch.bool) -> !torch.list<bool>
  %r0, %r1, %r2 = torch.aten.convolution_backward %gy, %x, %w, %none, %stride, %pad, %dil, %false, %opad, %int8, %mask {ca.host} : !torch.vtensor<[2,8,2,2],f32>, !torch.vtensor<[2,8,4,4],f32>, !torch.vtensor<[8,1,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int, !torch.list<bool> -> !torch.vtensor<[2,8,4,4],f32>, !torch.vtensor<[8,1,3,3],f32>, !torch.none
  "ca.accumulate_grad"(%x, %r0) : (!torch.vtensor<[2,8,4,4],f32>, !torch.vtensor<[2,8,4,4],f32>) -> ()
  "ca.accumulate_grad"(%w, %r1) : (!torch.vtensor<[8,1,3,3],f32>, !torch.vtensor<[8,1,3,3],f32>) -> ()
  return
}
func.func private @backward_kernel_0(%a: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.kernel} {
  return %a : !torch.vtensor<[4],f32>
}

// -----

// Left on the host: a grouped convolution that is not depthwise (2 channels per group),
// and a depthwise one on an 8x8 output map (torch's kernel is faster there).
// CHECK-LABEL: func.func @backward(
// CHECK-COUNT-2: torch.aten.convolution_backward
func.func @backward(%gy: !torch.vtensor<[2,4,2,2],f32>, %x: !torch.vtensor<[2,4,2,2],f32>, %w: !torch.vtensor<[4,2,1,1],f32>,
                    %gy2: !torch.vtensor<[2,8,8,8],f32>, %x2: !torch.vtensor<[2,8,8,8],f32>, %w2: !torch.vtensor<[8,1,3,3],f32>) {
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %int2 = torch.constant.int 2
  %int8 = torch.constant.int 8
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %ones = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %zeros = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %mask = torch.prim.ListConstruct %true, %true, %false : (!torch.bool, !torch.bool, !torch.bool) -> !torch.list<bool>
  %a0, %a1, %a2 = torch.aten.convolution_backward %gy, %x, %w, %none, %ones, %zeros, %ones, %false, %zeros, %int2, %mask {ca.host} : !torch.vtensor<[2,4,2,2],f32>, !torch.vtensor<[2,4,2,2],f32>, !torch.vtensor<[4,2,1,1],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int, !torch.list<bool> -> !torch.vtensor<[2,4,2,2],f32>, !torch.vtensor<[4,2,1,1],f32>, !torch.none
  %b0, %b1, %b2 = torch.aten.convolution_backward %gy2, %x2, %w2, %none, %ones, %ones, %ones, %false, %zeros, %int8, %mask {ca.host} : !torch.vtensor<[2,8,8,8],f32>, !torch.vtensor<[2,8,8,8],f32>, !torch.vtensor<[8,1,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int, !torch.list<bool> -> !torch.vtensor<[2,8,8,8],f32>, !torch.vtensor<[8,1,3,3],f32>, !torch.none
  "ca.accumulate_grad"(%x, %a0) : (!torch.vtensor<[2,4,2,2],f32>, !torch.vtensor<[2,4,2,2],f32>) -> ()
  "ca.accumulate_grad"(%x2, %b0) : (!torch.vtensor<[2,8,8,8],f32>, !torch.vtensor<[2,8,8,8],f32>) -> ()
  return
}
