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
    (`_mlir_ciface_<name>`, taking one memref descriptor per argument), and boolean tensors
    cross the boundary as bytes: an `i1` argument becomes `i8` (`arith.trunci` inside), an
    `i1` result is returned as `i8` (`arith.extui`). Why: a torch bool is one byte per
    element, and so is a scalar `i1` load, but the vectorizer's `vector<8xi1>` load reads
    8 packed bits: `torch.where` backwards read their mask wrong (found by the fuzzer).
    Scalar arguments (the lifted sizes of a kernel with dynamic dims, `i64`) get no
    attribute.

    Before:
    ```mlir
    func.func private @k(%a: tensor<4xf32>, %m: tensor<4xi1>) -> tensor<4xf32> attributes {ca.kernel} {...}
    ```
    After:
    ```mlir
    func.func @k(%a: tensor<4xf32> {bufferization.writable = false},
                 %m: tensor<4xi8> {bufferization.writable = false}) -> tensor<4xf32>
        attributes {ca.kernel, llvm.emit_c_interface} {
      %0 = arith.trunci %m : tensor<4xi8> to tensor<4xi1>
      ...
    ```
    """

    argument = "ca-prepare-kernel-abi"
    summary = "Make ca.kernel functions public C-interface functions with read-only arguments"

    def run(self, module: ir.Operation) -> None:
        with module.context, ir.Location.unknown():
            false = ir.BoolAttr.get(False)
            for fn in funcs(module, is_kernel):
                _bools_as_bytes(fn)
                # Scalar arguments (a symbolic capture's lifted sizes, `i64`) get no attribute.
                fn.attributes["arg_attrs"] = ir.ArrayAttr.get(
                    [ir.DictAttr.get({"bufferization.writable": false} if _is_tensor(a.type) else {})
                     for a in fn.regions[0].blocks[0].arguments])
                fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
                fn.attributes["sym_visibility"] = ir.StringAttr.get("public")


def _is_tensor(t: ir.Type) -> bool:
    return str(t).startswith("tensor<")


def _bool_tensor(t: ir.Type) -> bool:
    return str(t).startswith("tensor<") and str(ir.RankedTensorType(t).element_type) == "i1"


def _read_as_byte_in_loop(user, operand_number: int) -> bool:
    """When `user` is a linalg.generic reading the operand as an input, its loop body takes
    the byte and truncates it itself, so no i1 buffer ever exists for it."""
    if user.name != "linalg.generic":
        return False
    n_inputs = len(user.operands) - len(user.results)
    if operand_number >= n_inputs:
        return False
    body = user.regions[0].blocks[0]
    element = body.arguments[operand_number]
    uses = list(element.uses)
    element.set_type(ir.IntegerType.get_signless(8))
    with ir.InsertionPoint(list(body.operations)[0]):
        bit = ir.Operation.create("arith.trunci", results=[ir.IntegerType.get_signless(1)],
                                  operands=[element]).results[0]
    for use in uses:
        use.owner.operands[use.operand_number] = bit
    return True


def _as_bytes(t: ir.Type) -> ir.Type:
    return ir.RankedTensorType.get(ir.RankedTensorType(t).shape, ir.IntegerType.get_signless(8))


def _bools_as_bytes(fn: ir.Operation) -> None:
    block = fn.regions[0].blocks[0]
    first = list(block.operations)[0]
    for arg in block.arguments:
        if not _bool_tensor(arg.type):
            continue
        uses = list(arg.uses)
        bool_type = arg.type
        arg.set_type(_as_bytes(bool_type))
        as_bool = None
        for use in uses:
            if _read_as_byte_in_loop(use.owner, use.operand_number):
                continue
            if as_bool is None:  # any other reader gets the mask as a tensor of i1
                with ir.InsertionPoint(first):
                    as_bool = ir.Operation.create("arith.trunci", results=[bool_type], operands=[arg]).results[0]
            use.owner.operands[use.operand_number] = as_bool
    ret = list(block.operations)[-1].operation
    for i, value in enumerate(list(ret.operands)):
        if _bool_tensor(value.type):
            with ir.InsertionPoint(ret):
                ret.operands[i] = ir.Operation.create("arith.extui", results=[_as_bytes(value.type)],
                                                      operands=[value]).results[0]
    fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [a.type for a in block.arguments], [v.type for v in ret.operands]))
