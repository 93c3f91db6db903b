"""ca-host-result-layouts: a host op's result that torch lays out permuted reaches kernels as it is."""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import find_func, func_name, funcs, is_kernel

from .base import CAPass, PassFailure
from .specialize_layouts import _constant_int, _permute_argument

# Host ops whose results torch always lays out in another dimension order than their
# logical one, whatever their inputs' layouts: op name -> {result index: p}, where
# `result.permute(p)` is contiguous. The CPU flash-attention backward allocates its three
# gradients (batch, heads, seq, dim) as (batch, seq, heads, dim) (`empty_permuted(...,
# (0, 2, 1, 3))` in torch's kernel and its meta function); the forward (recomputed in a
# checkpointed backward) its (B, H, L) logsumexp as (B, L, H) (its output follows the
# query's layout, so it is not listed). test_host_result_layouts.py
# checks every entry against the real op, so a torch that changes one fails a test, and
# the kernel boundary copies a result that arrives in another layout anyway (a layout
# costs time when it is wrong, never correctness).
KNOWN_RESULT_LAYOUTS = {
    "torch.aten._scaled_dot_product_flash_attention_for_cpu": {1: (0, 2, 1)},
    "torch.aten._scaled_dot_product_flash_attention_for_cpu_backward": {0: (0, 2, 1, 3), 1: (0, 2, 1, 3),
                                                                          2: (0, 2, 1, 3)},
}


def op_key(op: ir.Operation) -> str:
    """The table's name for `op`: a `torch.operator`'s own name, else the op name."""
    if op.name == "torch.operator":
        return ir.StringAttr(op.attributes["name"]).value
    return op.name


@dataclasses.dataclass(frozen=True)
class HostResultLayouts(CAPass):
    """Passes a host op's result to the kernels that read it in the layout torch gives it.

    A kernel takes contiguous buffers, so the runtime copies any operand that is not
    (`contiguous()` at the kernel boundary). Some host ops return tensors whose memory order
    is a permutation of their logical one: the CPU flash-attention backward returns its three
    (B, H, L, D) gradients laid out as (B, L, H, D) (strides (L*H*D, D, H*D, 1)), and the
    kernel after it copied all three (6 x 256 KB a backward in the bench Transformer, ~0.3 ms
    of 23). For a result listed in `KNOWN_RESULT_LAYOUTS` with permutation `p`, read by a
    kernel that is called once, the host makes the view `permute(result, p)` (contiguous,
    no copy), the kernel takes that and permutes it back itself, which the lowering folds into
    the loops' indexing maps and the GEMMs' transpose flags, as for a permuted program
    argument (ca-specialize-layouts). Other readers of the result keep the result itself.
    Runs on the host function after ca-outline-kernels and ca-sink-views.

    Before:
    ```mlir
    func.func @backward(%g: !torch.vtensor<[2,4,8,16],f32>, ...) {
      %r:3 = torch.operator "torch.aten._scaled_dot_product_flash_attention_for_cpu_backward"(...) {ca.host}
          : (...) -> (!torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>, !torch.vtensor<[2,4,8,16],f32>)
      %k = call @backward_kernel_0(%r#0) : (!torch.vtensor<[2,4,8,16],f32>) -> !torch.vtensor<[2,4,8,16],f32>
    }
    func.func private @backward_kernel_0(%a: !torch.vtensor<[2,4,8,16],f32>) -> ... attributes {ca.kernel} {
      %0 = torch.aten.neg %a ...
    ```
    After:
    ```mlir
    func.func @backward(%g: !torch.vtensor<[2,4,8,16],f32>, ...) {
      %r:3 = torch.operator "torch.aten._scaled_dot_product_flash_attention_for_cpu_backward"(...) {ca.host} ...
      %p = torch.aten.permute %r#0, [0, 2, 1, 3] {ca.host} : ... -> !torch.vtensor<[2,8,4,16],f32>
      %k = call @backward_kernel_0(%p) : (!torch.vtensor<[2,8,4,16],f32>) -> !torch.vtensor<[2,4,8,16],f32>
    }
    func.func private @backward_kernel_0(%a: !torch.vtensor<[2,8,4,16],f32>) -> ... attributes {ca.kernel} {
      %b = torch.aten.permute %a, [0, 2, 1, 3] : ... -> !torch.vtensor<[2,4,8,16],f32>
      %0 = torch.aten.neg %b ...
    ```
    """

    argument = "ca-host-result-layouts"
    summary = "Hand kernels a host op's permuted result as its contiguous permutation, not a copy"

    function: str = "backward"

    def run(self, module: ir.Operation) -> None:
        host = find_func(module, self.function)
        if host is None:
            raise PassFailure(f"no function @{self.function}", module)
        kernels = {func_name(fn): fn for fn in funcs(module, is_kernel)}
        block = host.regions[0].blocks[0]
        calls = {}
        for op in block.operations:
            op = op.operation
            if op.name == "func.call":
                name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
                calls[name] = calls.get(name, 0) + 1
        with module.context, host.location:
            for op in list(block.operations):
                op = op.operation
                layouts = KNOWN_RESULT_LAYOUTS.get(op_key(op)) if "ca.host" in op.attributes else None
                if not layouts:
                    continue
                anchor = _next_op(op)  # the views go between the op and what followed it, in result order
                for index, perm in sorted(layouts.items()):
                    if index < len(op.results):
                        _hand_over(anchor, op.results[index], perm, kernels, calls)


def _hand_over(anchor: ir.Operation, result: ir.Value, perm: tuple, kernels: dict, calls: dict) -> None:
    """Kernel calls (of kernels called once) that read `result` read `permute(result, perm)`."""
    dims = _dims(result.type)
    if dims is None or len(dims) != len(perm):
        return
    reads = []
    for use in result.uses:
        owner = use.owner.operation if hasattr(use.owner, "operation") else use.owner
        if owner.name != "func.call":
            continue
        name = ir.FlatSymbolRefAttr(owner.attributes["callee"]).value
        if name in kernels and calls.get(name) == 1:
            reads.append((owner, use.operand_number, kernels[name]))
    if not reads:
        return
    elem = str(result.type)[len("!torch.vtensor<["):-1].split("],")[1]
    permuted_type = ir.Type.parse(f"!torch.vtensor<[{','.join(dims[d] for d in perm)}],{elem}>")
    host_attr = {"ca.host": ir.UnitAttr.get()}
    with ir.InsertionPoint(anchor):
        ints = [_constant_int(d) for d in perm]
        lst = ir.Operation.create("torch.prim.ListConstruct", results=[ir.Type.parse("!torch.list<int>")],
                                  operands=ints).results[0]
        view = ir.Operation.create("torch.aten.permute", results=[permuted_type], operands=[result, lst],
                                   attributes=host_attr).results[0]
    for call, operand, kernel in reads:
        call.operands[operand] = view
        block = kernel.regions[0].blocks[0]
        _permute_argument(block.arguments[operand], perm, block, kernel)
        kernel.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [a.type for a in block.arguments], list(ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value).results)))


def _dims(t: ir.Type):
    text = str(t)
    if not text.startswith("!torch.vtensor<[") or "]," not in text:
        return None
    dims = text[len("!torch.vtensor<["):].split("]")[0].split(",")
    return None if "?" in dims or dims == [""] else dims


def _next_op(op: ir.Operation) -> ir.Operation:
    """The op after `op` in its block (a host op is never the block's terminator)."""
    found = False
    for o in op.block.operations:
        if found:
            return o.operation
        found = o.operation == op
    raise PassFailure("a host op is the last op of its block", op)
