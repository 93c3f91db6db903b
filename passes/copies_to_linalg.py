"""ca-copies-to-linalg: `memref.copy` as a `linalg.copy` loop nest."""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import ops_named

from .base import CAPass
from .lazy_dialects import linalg


@dataclasses.dataclass(frozen=True)
class CopiesToLinalg(CAPass):
    """Rewrites every `memref.copy` into `linalg.copy`. A strided `memref.copy` lowers to a
    call of `memrefCopy` from MLIR's C runner library, which the torch-mlir wheel's JIT does
    not provide; `linalg.copy` becomes plain loops. Bufferization and the BLAS rewrite both
    leave copies behind, so the cpu pipeline runs this after each.

    Before:
    ```mlir
    memref.copy %a, %b : memref<4x4xf32, strided<[1, 4]>> to memref<4x4xf32>
    ```
    After:
    ```mlir
    linalg.copy ins(%a : memref<4x4xf32, strided<[1, 4]>>) outs(%b : memref<4x4xf32>)
    ```
    """

    argument = "ca-copies-to-linalg"
    summary = "Rewrite memref.copy as linalg.copy (the JIT has no memrefCopy)"

    def run(self, module: ir.Operation) -> None:
        for op in ops_named(module, "memref.copy"):
            with op.context, op.location, ir.InsertionPoint(op):
                linalg.copy(op.operands[0], outs=[op.operands[1]])
            op.erase()
