"""The one place that makes an MLIR context with everything camlir parses and prints.

Upstream MLIR dialects come registered with the wheel's context; the torch dialect and our
`ca` dialect are added here. `ca-opt`, the passes and the driver all go through this.

`torch_c` (torch-mlir's casts between torch and builtin tensors, which the host function
holds after the linalg stage) has no Python registration hook in the wheel: it is loaded
as a dependent dialect of a torch-mlir conversion, run once on an empty module (0.3 ms),
so that every stage's dump parses again in `ca-opt`.
"""

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_dialect
from torch_mlir.passmanager import PassManager

from camlir.dialects.ca import load_into


def make_context() -> ir.Context:
    """A new MLIR context with upstream, torch, torch_c and `ca` dialects loaded. No
    arguments. `ir.Module.parse(text, make_context())` then reads any camlir IR or stage dump.

        from torch_mlir import ir
        module = ir.Module.parse(open("dump/graph1/00-import.mlir").read(), camlir.make_context())
    """
    ctx = ir.Context()
    torch_dialect.register_dialect(ctx)
    load_into(ctx)
    with ctx, ir.Location.unknown():
        PassManager.parse("builtin.module(func.func(convert-torch-to-linalg))").run(
            ir.Module.create().operation)
    return ctx
