"""ca-prepare-kernel-abi: the calling convention of compiled kernels, stated in the IR."""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import funcs, is_kernel

from .base import CAPass


@dataclasses.dataclass(frozen=True)
class PrepareKernelABI(CAPass):
    """Marks every `ca.kernel` function for the cpu runtime's calling convention, before
    bufferization: arguments are read-only (`bufferization.writable = false`: inputs are
    the user's saved tensors and gradients, and one-shot bufferization would otherwise
    reuse an input's buffer for a result), the function is public with a C interface
    (`_mlir_ciface_<name>`, taking one memref descriptor per argument).

    Before:
    ```mlir
    func.func private @k(%a: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel} {...}
    ```
    After:
    ```mlir
    func.func @k(%a: tensor<4xf32> {bufferization.writable = false}) -> tensor<4xf32>
        attributes {ca.kernel, llvm.emit_c_interface} {...}
    ```
    """

    argument = "ca-prepare-kernel-abi"
    summary = "Make ca.kernel functions public C-interface functions with read-only arguments"

    def run(self, module: ir.Operation) -> None:
        with module.context:
            false = ir.BoolAttr.get(False)
            for fn in funcs(module, is_kernel):
                n = len(fn.regions[0].blocks[0].arguments)
                fn.attributes["arg_attrs"] = ir.ArrayAttr.get(
                    [ir.DictAttr.get({"bufferization.writable": false}) for _ in range(n)])
                fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
                fn.attributes["sym_visibility"] = ir.StringAttr.get("public")
