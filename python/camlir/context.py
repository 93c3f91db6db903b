"""The one place that makes an MLIR context with everything camlir parses and prints.

Upstream MLIR dialects come registered with the wheel's context; the torch dialect and our
`ca` dialect are added here. `ca-opt`, the passes and the driver all go through this.
"""

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_dialect

from camlir.dialects.ca import load_into


def make_context() -> ir.Context:
    ctx = ir.Context()
    torch_dialect.register_dialect(ctx)
    load_into(ctx)
    return ctx
