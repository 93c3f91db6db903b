"""ca-unique-kernel-results: every kernel result is a value of its own, computed by the kernel."""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import func_name, funcs, function_type, is_kernel, ops_named

from .base import CAPass


@dataclasses.dataclass(frozen=True)
class UniqueKernelResults(CAPass):
    """Drops kernel results that repeat an earlier result or return an argument unchanged,
    and points their users in the host at the earlier result or at the call's operand.

    Why: the cpu runtime gives each kernel result a buffer of its own (out-parameters after
    bufferization). A value returned twice, which CSE and fusion produce when two gradients
    are equal (`(x.sum() + y.sum()).backward()`), made bufferization write one buffer
    through two out-parameters and crashed the process; an argument returned as is needs no
    kernel at all. The host side stays right: two accumulations of one tensor see a value
    with two uses, so neither steals it, and each `.grad` gets its own copy, as in eager.

    Before:
    ```mlir
    %r:2 = call @k(%g) : (tensor<f32>) -> (tensor<4xf32>, tensor<4xf32>)
    "ca.accumulate_grad"(%x, %r#1) ...
    func.func private @k(%a: tensor<f32>) -> (tensor<4xf32>, tensor<4xf32>) attributes {ca.kernel} {
      %0 = linalg.generic ...
      return %0, %0 : tensor<4xf32>, tensor<4xf32>
    }
    ```
    After:
    ```mlir
    %r = call @k(%g) : (tensor<f32>) -> tensor<4xf32>
    "ca.accumulate_grad"(%x, %r) ...
    func.func private @k(%a: tensor<f32>) -> tensor<4xf32> attributes {ca.kernel} {
      %0 = linalg.generic ...
      return %0 : tensor<4xf32>
    }
    ```
    """

    argument = "ca-unique-kernel-results"
    summary = "Drop repeated and pass-through kernel results; the host reads the kept ones"

    def run(self, module: ir.Operation) -> None:
        kernels = {func_name(fn): fn for fn in funcs(module, is_kernel)}
        calls = {}
        for fn in funcs(module, lambda fn: not is_kernel(fn)):
            for call in ops_named(fn, "func.call"):
                calls.setdefault(ir.FlatSymbolRefAttr(call.attributes["callee"]).value, []).append(call)
        with module.context, ir.Location.unknown():
            for name, kernel in kernels.items():
                _uniquify(kernel, calls.get(name, []))


def _uniquify(kernel: ir.Operation, calls: list) -> None:
    block = kernel.regions[0].blocks[0]
    ret = list(block.operations)[-1].operation
    returned = list(ret.operands)
    args = list(block.arguments)
    keep, source = [], []  # per result: ("result", kept index) or ("arg", argument index)
    for i, value in enumerate(returned):
        if value in args:
            source.append(("arg", args.index(value)))
        elif value in returned[:i]:
            source.append(source[returned.index(value)])
        else:
            source.append(("result", len(keep)))
            keep.append(value)
    if len(keep) == len(returned):
        return
    for call in calls:
        with ir.InsertionPoint(call), call.location:
            new = ir.Operation.create("func.call", results=[v.type for v in keep], operands=list(call.operands),
                                      attributes={"callee": call.attributes["callee"]})
        for old, (kind, index) in zip(call.results, source):
            old.replace_all_uses_with(new.results[index] if kind == "result" else call.operands[index])
        call.erase()
    with ir.InsertionPoint(ret), ret.location:
        ir.Operation.create("func.return", operands=keep)
    ret.erase()
    ftype = function_type(kernel)
    kernel.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(list(ftype.inputs), [v.type for v in keep]))
