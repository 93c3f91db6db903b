# RUN: %python %s | FileCheck %s
# RUN: %python %s | ca-opt | FileCheck %s
# The captured backward of nn.Linear with a tensor hook on the input: one ca.node per
# autograd node, the hook as ca.hook (traced by the cpu backend into the body @hook_0),
# accumulation as ca.accumulate_grad. Printed as the trace-hooks stage wrote it to
# CAMLIR_DUMP_DIR; the file re-parses and verifies with ca-opt.

import os
import pathlib
import tempfile

import torch

with tempfile.TemporaryDirectory() as dump_dir:
    os.environ["CAMLIR_DUMP_DIR"] = dump_dir
    import camlir

    torch.manual_seed(0)
    model = torch.nn.Linear(10, 10)
    x = torch.randn(4, 10, requires_grad=True)
    x.register_hook(lambda g: g * 10)
    camlir.compile_backward(model(x).sum())
    [dumped] = pathlib.Path(dump_dir, "graph1").glob("*-trace-hooks.mlir")
    print(dumped.read_text())


# CHECK-LABEL: func.func @backward
# CHECK-SAME: (%[[ROOT:.*]]: !torch.vtensor<[],f32>, %{{.*}}: !torch.vtensor<[4,10],f32>
# CHECK: "ca.node"(%[[ROOT]])
# CHECK: torch.aten.expand
# CHECK: {index = 1 : i64, node = "SumBackward0"}
# CHECK: "ca.node"
# CHECK: torch.aten.mm
# CHECK: node = "AddmmBackward0"
# CHECK: "ca.hook"(%{{.*}}) {body = @hook_0, hook_id = 0 : i64, kind = "tensor_pre_hook"} : (!torch.vtensor<[4,10],f32>) -> !torch.vtensor<[4,10],f32>
# CHECK: "ca.accumulate_grad"
# CHECK: node = "TBackward0"
# CHECK: "ca.accumulate_grad"
# CHECK: return
# CHECK: func.func private @hook_0
# CHECK: torch.aten.mul
