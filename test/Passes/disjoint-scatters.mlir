// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-disjoint-scatters)' | FileCheck %s
// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-disjoint-scatters)' | ca-opt | FileCheck %s

// Three select backwards (q, k, v of a packed projection) summed: one chain, one zeros.
// CHECK-LABEL: func.func @three_slices
// CHECK-SAME: (%[[G0:.*]]: !torch.vtensor<[4,5],f32>, %[[G1:.*]]: !torch.vtensor<[4,5],f32>, %[[G2:.*]]: !torch.vtensor<[4,5],f32>)
// CHECK: %[[Z:.*]] = torch.aten.new_zeros
// CHECK-NOT: torch.aten.new_zeros
// CHECK: %[[S2:.*]] = torch.aten.select_scatter %[[Z]], %[[G2]], %{{.*}}, %{{.*}}
// CHECK: %[[S1:.*]] = torch.aten.select_scatter %[[S2]], %[[G1]]
// CHECK: %[[S0:.*]] = torch.aten.select_scatter %[[S1]], %[[G0]]
// CHECK-NOT: torch.aten.add.Tensor
// CHECK: return %[[S0]]
func.func @three_slices(%g0: !torch.vtensor<[4,5],f32>, %g1: !torch.vtensor<[4,5],f32>, %g2: !torch.vtensor<[4,5],f32>) -> !torch.vtensor<[3,4,5],f32> {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int4 = torch.constant.int 4
  %int5 = torch.constant.int 5
  %none = torch.constant.none
  %false = torch.constant.bool false
  %shape = torch.prim.ListConstruct %int3, %int4, %int5 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %z2 = torch.aten.new_zeros %g2, %shape, %none, %none, %none, %false : !torch.vtensor<[4,5],f32>, !torch.list<int>, !torch.none, !torch.none, !torch.none, !torch.bool -> !torch.vtensor<[3,4,5],f32>
  %s2 = torch.aten.select_scatter %z2, %g2, %int0, %int2 : !torch.vtensor<[3,4,5],f32>, !torch.vtensor<[4,5],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,4,5],f32>
  %z1 = torch.aten.new_zeros %g1, %shape, %none, %none, %none, %false : !torch.vtensor<[4,5],f32>, !torch.list<int>, !torch.none, !torch.none, !torch.none, !torch.bool -> !torch.vtensor<[3,4,5],f32>
  %s1 = torch.aten.select_scatter %z1, %g1, %int0, %int1 : !torch.vtensor<[3,4,5],f32>, !torch.vtensor<[4,5],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,4,5],f32>
  %a = torch.aten.add.Tensor %s2, %s1, %int1 : !torch.vtensor<[3,4,5],f32>, !torch.vtensor<[3,4,5],f32>, !torch.int -> !torch.vtensor<[3,4,5],f32>
  %z0 = torch.aten.new_zeros %g0, %shape, %none, %none, %none, %false : !torch.vtensor<[4,5],f32>, !torch.list<int>, !torch.none, !torch.none, !torch.none, !torch.bool -> !torch.vtensor<[3,4,5],f32>
  %s0 = torch.aten.select_scatter %z0, %g0, %int0, %int0 : !torch.vtensor<[3,4,5],f32>, !torch.vtensor<[4,5],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,4,5],f32>
  %b = torch.aten.add.Tensor %s0, %a, %int1 : !torch.vtensor<[3,4,5],f32>, !torch.vtensor<[3,4,5],f32>, !torch.int -> !torch.vtensor<[3,4,5],f32>
  return %b : !torch.vtensor<[3,4,5],f32>
}

// The same index twice (-1 is 2 here), another dim, alpha 2, or a term that is not over
// zeros: the adds stay.
// CHECK-LABEL: func.func @left_alone
// CHECK-COUNT-4: torch.aten.add.Tensor
// CHECK: return
func.func @left_alone(%g: !torch.vtensor<[3,3],f32>, %x: !torch.vtensor<[3,3,3],f32>) -> (!torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>) {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %intm1 = torch.constant.int -1
  %none = torch.constant.none
  %false = torch.constant.bool false
  %shape = torch.prim.ListConstruct %int3, %int3, %int3 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %z = torch.aten.new_zeros %g, %shape, %none, %none, %none, %false : !torch.vtensor<[3,3],f32>, !torch.list<int>, !torch.none, !torch.none, !torch.none, !torch.bool -> !torch.vtensor<[3,3,3],f32>
  %s2 = torch.aten.select_scatter %z, %g, %int0, %int2 : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,3,3],f32>
  %sm1 = torch.aten.select_scatter %z, %g, %int0, %intm1 : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,3,3],f32>
  %same = torch.aten.add.Tensor %s2, %sm1, %int1 : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>, !torch.int -> !torch.vtensor<[3,3,3],f32>
  %d1 = torch.aten.select_scatter %z, %g, %int1, %int0 : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,3,3],f32>
  %otherdim = torch.aten.add.Tensor %s2, %d1, %int1 : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>, !torch.int -> !torch.vtensor<[3,3,3],f32>
  %s0 = torch.aten.select_scatter %z, %g, %int0, %int0 : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,3,3],f32>
  %alpha = torch.aten.add.Tensor %s2, %s0, %int2 : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>, !torch.int -> !torch.vtensor<[3,3,3],f32>
  %notzero = torch.aten.select_scatter %x, %g, %int0, %int0 : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,3,3],f32>
  %plain = torch.aten.add.Tensor %s2, %notzero, %int1 : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>, !torch.int -> !torch.vtensor<[3,3,3],f32>
  return %same, %otherdim, %alpha, %plain : !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>, !torch.vtensor<[3,3,3],f32>
}
