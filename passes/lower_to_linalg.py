"""ca-lower-to-linalg: lower the `ca.kernel` functions from the torch dialect to linalg."""

import dataclasses

from torch_mlir import ir

from .base import CAPass, PassFailure, next_op


@dataclasses.dataclass(frozen=True)
class LowerToLinalg(CAPass):
    """Lowers every `ca.kernel` function to linalg on builtin tensors (torch-mlir's
    conversions, see `camlir.lowering.torch_to_linalg`), leaving the host function alone.

    Host call sites keep their torch-dialect values and convert at the call:
    `torch_c.to_builtin_tensor` on the way in, `torch_c.from_builtin_tensor` on the way
    out. The runtime treats these casts as identities: they only change the static type.
    Kernels are lowered in a scratch module, because torch-mlir's pipelines are module
    passes that would otherwise also try to legalize the host's `ca` ops.

    Before:
    ```mlir
    %0 = call @backward_kernel_0(%g) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
    func.func private @backward_kernel_0(%a: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.kernel} {
      %0 = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
      return %0 : !torch.vtensor<[4],f32>
    }
    ```
    After:
    ```mlir
    %0 = torch_c.to_builtin_tensor %g : !torch.vtensor<[4],f32> -> tensor<4xf32>
    %1 = call @backward_kernel_0(%0) : (tensor<4xf32>) -> tensor<4xf32>
    %2 = torch_c.from_builtin_tensor %1 : tensor<4xf32> -> !torch.vtensor<[4],f32>
    func.func private @backward_kernel_0(%arg0: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel} {
      %0 = tensor.empty() : tensor<4xf32>
      %1 = linalg.generic {...} ins(%arg0 : tensor<4xf32>) outs(%0 : tensor<4xf32>) { arith.negf ... }
      return %1 : tensor<4xf32>
    }
    ```
    """

    argument = "ca-lower-to-linalg"
    summary = "Lower ca.kernel functions from the torch dialect to linalg on tensors"

    def run(self, module: ir.Operation) -> None:
        from camlir.lowering.torch_to_linalg import LoweringError, lower_to_linalg

        top = module.regions[0].blocks[0]
        kernels = [op.operation for op in top.operations
                   if op.operation.name == "func.func" and "ca.kernel" in op.operation.attributes]
        if not kernels:
            return
        with module.context, ir.Location.unknown():
            scratch = ir.Module.create()
            for k in kernels:
                clone = k.clone(ir.InsertionPoint(scratch.body))
                clone.attributes["sym_visibility"] = ir.StringAttr.get("public")
            try:
                lower_to_linalg(scratch)
            except LoweringError as exc:
                raise PassFailure(str(exc).splitlines()[0], kernels[0]) from None
            lowered = {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
                       for op in scratch.body.operations if op.operation.name == "func.func"}
            for k in kernels:
                name = ir.StringAttr(k.attributes["sym_name"]).value
                new = lowered[name]
                new.attributes["sym_visibility"] = ir.StringAttr.get("private")
                new.attributes["ca.kernel"] = ir.UnitAttr.get()
                new.move_before(k)
                k.erase()
            _cast_call_sites(top, set(lowered))


def _function_type(fn: ir.Operation) -> ir.FunctionType:
    return ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)


def _cast_call_sites(top: ir.Block, kernel_names: set) -> None:
    funcs = {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
             for op in top.operations if op.operation.name == "func.func"}
    calls = []
    for fn in funcs.values():
        if "ca.kernel" in fn.attributes:
            continue
        fn.walk(lambda o: (calls.append(o.operation) if o.operation.name == "func.call" else None)
                or ir.WalkResult.ADVANCE)
    for call in calls:
        callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        if callee not in kernel_names:
            continue
        ftype = _function_type(funcs[callee])
        with ir.InsertionPoint(call), call.location:
            for i, (value, want) in enumerate(zip(list(call.operands), ftype.inputs)):
                if value.type != want:
                    call.operands[i] = _cast(_to_builtin_name(value.type), value, want)
        after = next_op(call)
        with ir.InsertionPoint(after), call.location:
            for result, want in zip(call.results, ftype.results):
                old_type = result.type
                if old_type == want:
                    continue
                uses = list(result.uses)
                result.set_type(want)
                back = _cast("torch_c.from_builtin_tensor", result, old_type)
                for use in uses:
                    use.owner.operands[use.operand_number] = back


def _to_builtin_name(t: ir.Type) -> str:
    text = str(t)
    if text == "!torch.int":
        return "torch_c.to_i64"
    if text == "!torch.float":
        return "torch_c.to_f64"
    if text == "!torch.bool":
        return "torch_c.to_i1"
    return "torch_c.to_builtin_tensor"


def _cast(name: str, value: ir.Value, to: ir.Type) -> ir.Value:
    return ir.Operation.create(name, results=[to], operands=[value]).results[0]
