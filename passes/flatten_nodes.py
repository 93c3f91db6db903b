"""ca-flatten-nodes: dissolve `ca.node` regions into straight-line code."""

import dataclasses

from torch_mlir import ir

from .base import CAPass, PassFailure


@dataclasses.dataclass(frozen=True)
class FlattenNodes(CAPass):
    """Replaces every `ca.node` by the ops of its body.

    Node boundaries help capture, logging and per-node lowering; code generation wants one
    flat function so producers and consumers of different nodes can be fused. The body's
    block arguments are replaced by the node's operands and the node's results by the
    operands of its `ca.yield`. With `keep-provenance` (the default) every moved op gets a
    `ca.provenance` attribute naming the node it came from (`aot<N>:` prefix for nodes from
    AOT-compiled regions), so later stages can still say which node produced what.

    Before:
    ```mlir
    %r = "ca.node"(%g) ({
    ^bb0(%a: !torch.vtensor<[4],f32>):
      %n = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
      "ca.yield"(%n) : (!torch.vtensor<[4],f32>) -> ()
    }) {node = "NegBackward0", index = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
    ```
    After:
    ```mlir
    %r = torch.aten.neg %g {ca.provenance = "NegBackward0#0"} : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
    ```
    """

    argument = "ca-flatten-nodes"
    summary = "Inline the body of every ca.node into its parent block"

    keep_provenance: bool = True

    def run(self, module: ir.Operation) -> None:
        nodes = []

        def collect(op):
            if op.name == "ca.node":
                nodes.append(op)
            return ir.WalkResult.ADVANCE

        module.walk(collect, ir.WalkOrder.POST_ORDER)  # inner nodes before the outer ones
        for node in nodes:
            self._flatten(node)

    def _flatten(self, node: ir.Operation) -> None:
        block = node.regions[0].blocks[0]
        ops = list(block.operations)
        terminator = ops[-1]
        if terminator.operation.name != "ca.yield":
            raise PassFailure("'ca.node' body does not end with 'ca.yield'", node)
        tag = self._tag(node) if self.keep_provenance else None
        for arg, operand in zip(block.arguments, node.operands):
            arg.replace_all_uses_with(operand)
        for op in ops[:-1]:
            op.operation.move_before(node)
            if tag is not None:
                op.operation.attributes["ca.provenance"] = ir.StringAttr.get(tag)
        for result, value in zip(node.results, terminator.operands):
            result.replace_all_uses_with(value)
        terminator.operation.erase()
        node.erase()

    @staticmethod
    def _tag(node: ir.Operation) -> str:
        attrs = node.attributes
        name = ir.StringAttr(attrs["node"]).value
        index = ir.IntegerAttr(attrs["index"]).value
        prefix = f"aot{ir.IntegerAttr(attrs['aot']).value}:" if "aot" in attrs else ""
        return f"{prefix}{name}#{index}"
