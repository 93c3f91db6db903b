// RUN: ca-opt %s | FileCheck %s --check-prefix=PRETTY
// PRETTY: torch.aten.neg %{{.*}} : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>

// RUN: ca-opt %s --mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC
// GENERIC: "func.func"() <{function_type = {{.*}}, sym_name = "f"}>
// GENERIC: "torch.aten.neg"(%{{.*}}) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>

// Standard input, and -o.
// RUN: ca-opt < %s | FileCheck %s --check-prefix=PRETTY
// RUN: ca-opt - < %s | FileCheck %s --check-prefix=PRETTY
// RUN: ca-opt %s -o %t.out.mlir && FileCheck %s --check-prefix=PRETTY < %t.out.mlir

// Locations on request.
// RUN: ca-opt %s --mlir-print-debuginfo | FileCheck %s --check-prefix=DEBUGINFO
// DEBUGINFO: loc(

// A pipeline mixing a camlir pass and upstream passes, as flags and as text; the dump
// after every pass names each one.
// RUN: ca-opt %s --ca-flatten-nodes --canonicalize --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=DUMP
// RUN: ca-opt %s --pass-pipeline='builtin.module(ca-flatten-nodes,func.func(canonicalize))' --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=DUMP
// DUMP: IR Dump After FlattenNodes: ca-flatten-nodes
// DUMP: torch.aten.neg
// DUMP: IR Dump After Canonicalizer

// Upstream options pass through.
// RUN: ca-opt %s --canonicalize=max-iterations=2 | FileCheck %s --check-prefix=PRETTY

// --list-passes and --help describe our passes and their options.
// RUN: ca-opt --list-passes | FileCheck %s --check-prefix=LIST
// RUN: ca-opt --help | FileCheck %s --check-prefix=LIST
// LIST: --ca-flatten-nodes  Inline the body of every ca.node into its parent block
// LIST-NEXT: keep-provenance=true  (bool)

func.func @f(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %r = "ca.node"(%g) ({
  ^bb0(%a: !torch.vtensor<[4],f32>):
    %n = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
    "ca.yield"(%n) : (!torch.vtensor<[4],f32>) -> ()
  }) {node = "NegBackward0", index = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %r : !torch.vtensor<[4],f32>
}
