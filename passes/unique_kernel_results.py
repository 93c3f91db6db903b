"""ca-unique-kernel-results: every kernel result is a value of its own, computed by the kernel."""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import func_name, funcs, function_type, is_kernel, ops_named

from .base import CAPass
from .lower_to_linalg import TWIN_ATTR


@dataclasses.dataclass(frozen=True)
class UniqueKernelResults(CAPass):
    """Drops kernel results that repeat an earlier result or return an argument unchanged,
    and points their users in the host at the earlier result or at the call's operand.

    Why: the cpu runtime gives each kernel result a buffer of its own (out-parameters after
    bufferization). A value returned twice, which CSE and fusion produce when two gradients
    are equal (`(x.sum() + y.sum()).backward()`), made bufferization write one buffer
    through two out-parameters and crashed the process; an argument returned as is needs no
    kernel at all. A kernel's torch twin (`ca-lower-to-linalg{twins=true}`) drops the same
    results. The host side stays right: two accumulations of one tensor see a value
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
        twins = {ir.StringAttr(fn.attributes[TWIN_ATTR]).value: fn for fn in funcs(module)
                 if TWIN_ATTR in fn.attributes}
        with module.context, ir.Location.unknown():
            for name, kernel in kernels.items():
                kept = _uniquify(kernel, calls.get(name, []))
                if kept is not None and name in twins:
                    _keep_results(twins[name], kept)


def _keep_results(fn: ir.Operation, kept: list) -> None:
    """A kernel's torch twin (ca-lower-to-linalg{twins=true}) returns what the kernel now
    returns: the results at `kept`."""
    ret = list(fn.regions[0].blocks[0].operations)[-1].operation
    returned = [ret.operands[i] for i in kept]
    with ir.InsertionPoint(ret), ret.location:
        ir.Operation.create("func.return", operands=returned)
    ret.erase()
    ftype = function_type(fn)
    fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(list(ftype.inputs),
                                                                         [v.type for v in returned]))


def _uniquify(kernel: ir.Operation, calls: list):
    """Drops the kernel's repeated and pass-through results; returns the indices of the
    results it keeps (None when it keeps them all)."""
    block = kernel.regions[0].blocks[0]
    ret = list(block.operations)[-1].operation
    returned = list(ret.operands)
    args = list(block.arguments)
    keep, kept, source = [], [], []  # per result: ("result", kept index) or ("arg", argument index)
    for i, value in enumerate(returned):
        if value in args:
            source.append(("arg", args.index(value)))
        elif value in returned[:i]:
            source.append(source[returned.index(value)])
        else:
            source.append(("result", len(keep)))
            keep.append(value)
            kept.append(i)
    if len(keep) == len(returned):
        return None
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
    return kept
