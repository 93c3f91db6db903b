"""ca-lower-to-linalg: lower the `ca.kernel` functions from the torch dialect to linalg."""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import (find_func, func_name, function_type, funcs, is_kernel,
                                           next_op, ops_matching, ops_named, torch_op_name)

from .base import CAPass, PassFailure
from .outline_kernels import HOST_ATTR, is_cloneable, outline_runs


# With `twins=true`, each kernel's torch-dialect original stays in the module as a private
# function `@<kernel>__torch` with `ca.torch_twin = "<kernel>"`: the cpu runtime can run a
# kernel's ops through torch instead, where that measures faster (backends/cpu/choice.py).
TWIN_ATTR = "ca.torch_twin"
TWIN_SUFFIX = "__torch"


@dataclasses.dataclass(frozen=True)
class LowerToLinalg(CAPass):
    """Lowers every `ca.kernel` function to linalg on builtin tensors (torch-mlir's
    conversions, see `camlir.lowering.torch_to_linalg`), leaving the host function alone.

    Host call sites keep their torch-dialect values and convert at the call:
    `torch_c.to_builtin_tensor` on the way in, `torch_c.from_builtin_tensor` on the way
    out. The runtime treats these casts as identities: they only change the static type.
    Kernels are lowered in a scratch module, because torch-mlir's pipelines are module
    passes that would otherwise also try to legalize the host's `ca` ops.

    An op the lowering cannot convert (no lowering in torch-mlir, or a leftover such as
    `tm_tensor.scan` that camlir cannot take further) moves to the host, where the runtime
    calls it through torch: its kernel is inlined back at its call site, the op is marked
    `ca.host`, the rest is outlined again around it, and the new kernels are lowered. Each
    such move is recorded in the module attribute `ca.host_ops` (op names, for logs). The
    failing op is found from the locations of the lowering's diagnostics, not their text.

    Option `twins` (default false): keep each kernel's torch-dialect original as a private
    function `@<kernel>__torch` marked `ca.torch_twin = "<kernel>"`, for the cpu runtime's
    measured choice between the native kernel and the same ops run through torch.

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

    function: str = "backward"
    twins: bool = False

    def run(self, module: ir.Operation) -> None:
        host = find_func(module, self.function)
        pending = funcs(module, is_kernel)
        moved = []
        while pending:
            failure = _lower_kernels(module, pending, self.twins)
            if failure is not None and not failure[1] and len(pending) > 1:
                # The diagnostics did not point at an op: find the kernel by lowering them
                # one at a time (those that lower are done).
                failure = None
                for k in list(pending):
                    pending.remove(k)
                    failure = _lower_kernels(module, [k], self.twins)
                    if failure is not None:
                        break
            if failure is None:
                break
            kernel, culprits, error = failure
            if host is None:
                raise PassFailure(str(error).splitlines()[0], kernel)
            if not culprits:  # no op identified: the whole kernel runs through torch
                culprits = [op.operation for op in kernel.regions[0].blocks[0].operations
                            if op.operation.name != "func.return" and not is_cloneable(op.operation)]
            moved += [torch_op_name(op) for op in culprits]
            pending = [k for k in pending if k != kernel] + _move_to_host(module, host, kernel, culprits)
        if moved:
            with module.context:
                previous = [ir.StringAttr(a).value for a in ir.ArrayAttr(module.attributes["ca.host_ops"])] \
                    if "ca.host_ops" in module.attributes else []
                module.attributes["ca.host_ops"] = ir.ArrayAttr.get(
                    [ir.StringAttr.get(n) for n in previous + moved])
        _cast_call_sites(module, {func_name(k) for k in funcs(module, is_kernel)})


def _lower_kernels(module: ir.Operation, kernels: list, twins: bool = False):
    """Lowers `kernels` in a scratch module and swaps them in (with `twins`, each torch-dialect
    original stays as its twin, see `TWIN_ATTR`). On failure nothing is swapped and the
    result is (kernel, ops of that kernel that did not convert, the error)."""
    from camlir.lowering.torch_to_linalg import LoweringError, lower_to_linalg

    with module.context, ir.Location.unknown():
        scratch = ir.Module.create()
        originals = [scratch.operation]  # position n of the scratch's pre-order walk
        for k in kernels:
            clone = k.clone(ir.InsertionPoint(scratch.body))
            clone.attributes["sym_visibility"] = ir.StringAttr.get("public")
            originals += ops_matching(k, lambda op: True)
        try:
            lower_to_linalg(scratch)
        except LoweringError as exc:
            culprits = [originals[n] for n in exc.sources if n < len(originals)]
            culprits = [op for op in culprits if op.name not in ("func.func", "func.return", "builtin.module")]
            owner = culprits[0].parent if culprits else kernels[0]
            return owner, [op for op in culprits if op.parent == owner], exc
        lowered = {func_name(fn): fn for fn in funcs(scratch)}
        for k in kernels:
            new = lowered[func_name(k)]
            new.attributes["sym_visibility"] = ir.StringAttr.get("private")
            new.attributes["ca.kernel"] = ir.UnitAttr.get()
            new.move_before(k)
            if twins:
                name = func_name(k)
                k.attributes["sym_name"] = ir.StringAttr.get(name + TWIN_SUFFIX)
                del k.attributes["ca.kernel"]
                k.attributes[TWIN_ATTR] = ir.StringAttr.get(name)
            else:
                k.erase()
    return None


def _move_to_host(module: ir.Operation, host: ir.Operation, kernel: ir.Operation, culprits: list) -> list:
    """Inlines `kernel` at its call in `host`, marks the copies of `culprits` `ca.host`, and
    outlines what is left around them; returns the new kernels."""
    name = func_name(kernel)
    calls = [c for c in ops_named(host, "func.call")
             if ir.FlatSymbolRefAttr(c.attributes["callee"]).value == name]
    if len(calls) != 1:
        raise PassFailure(f"kernel @{name} has {len(calls)} call sites; cannot move its ops to the host", kernel)
    call = calls[0]
    body = kernel.regions[0].blocks[0]
    mapping = {arg: v for arg, v in zip(body.arguments, call.operands)}
    marked = set(culprits)
    with module.context, ir.InsertionPoint(call):
        for op in body.operations:
            op = op.operation
            if op.name == "func.return":
                for result, value in zip(call.results, op.operands):
                    result.replace_all_uses_with(mapping.get(value, value))
                continue
            new = op.clone()
            for i, v in enumerate(new.operands):
                if v in mapping:
                    new.operands[i] = mapping[v]
            for old_r, new_r in zip(op.results, new.results):
                mapping[old_r] = new_r
            if op in marked:
                new.attributes[HOST_ATTR] = ir.UnitAttr.get()
    call.erase()
    kernel.erase()
    return outline_runs(module, host)


def _cast_call_sites(module: ir.Operation, kernel_names: set) -> None:
    by_name = {func_name(fn): fn for fn in funcs(module)}
    calls = [c for fn in funcs(module, lambda fn: not is_kernel(fn)) for c in ops_named(fn, "func.call")]
    for call in calls:
        callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        if callee not in kernel_names:
            continue
        ftype = function_type(by_name[callee])
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
