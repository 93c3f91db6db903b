"""Test-only runner for lowered kernels: bufferize, lower to LLVM, run with MLIR's JIT.

Just enough to check the numbers of what `lower_to_linalg` produces (static shapes, one
function at a time, naive loops); camlir's real CPU backend is elsewhere.
"""

import ctypes

import numpy as np
from torch_mlir import ir
from torch_mlir.dialects import linalg
from torch_mlir.execution_engine import ExecutionEngine
from torch_mlir.passmanager import PassManager
from torch_mlir.runtime import get_ranked_memref_descriptor

_BUFFERIZE = ",".join([
    "one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map}",
    "buffer-results-to-out-params{modify-public-functions=true}",
    "canonicalize", "cse",
])
_TO_LLVM = ",".join([
    "func.func(convert-linalg-to-loops)",
    "expand-strided-metadata", "lower-affine", "convert-scf-to-cf", "convert-math-to-libm",
    "convert-to-llvm", "reconcile-unrealized-casts",
])


def _copies_as_linalg(module: ir.Module) -> None:
    """memref.copy -> linalg.copy: a strided memref.copy lowers to a call of `memrefCopy`,
    which the wheel's JIT does not provide; linalg.copy becomes loops."""
    copies = []
    module.operation.walk(lambda op: (copies.append(op.operation) if op.operation.name == "memref.copy" else None)
                          or ir.WalkResult.ADVANCE)
    for op in copies:
        with ir.InsertionPoint(op), op.location:
            linalg.copy(op.operands[0], outs=[op.operands[1]])
        op.erase()


def run_kernel(module: ir.Module, name: str, inputs: list, result_shapes: list) -> list:
    """Runs func `name` of a lowered module on numpy `inputs`; returns numpy results (their
    shapes and dtypes given as (shape, dtype) pairs)."""
    with module.context:
        for op in module.body.operations:
            if ir.StringAttr(op.operation.attributes["sym_name"]).value == name:
                op.operation.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        PassManager.parse(f"builtin.module({_BUFFERIZE})").run(module.operation)
        _copies_as_linalg(module)
        PassManager.parse(f"builtin.module({_TO_LLVM})").run(module.operation)
    engine = ExecutionEngine(module, opt_level=0)
    keep = [np.ascontiguousarray(x) for x in inputs]
    outs = [np.zeros(shape, dtype=dtype) for shape, dtype in result_shapes]
    descriptors = [get_ranked_memref_descriptor(a) for a in keep + outs]
    engine.invoke(name, *[ctypes.pointer(ctypes.pointer(d)) for d in descriptors])
    return outs  # written in place through the out-parameters
