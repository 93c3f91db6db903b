"""ca-inline-hooks: replace a hook call by the hook's traced body."""

import dataclasses
import re

from torch_mlir import ir

from camlir.dialects.ca import build

from camlir.dialects.ca.ir_helpers import top_level_ops

from .base import CAPass, PassFailure


@dataclasses.dataclass(frozen=True)
class InlineHooks(CAPass):
    """Replaces every `ca.hook` that has a `body` by the ops of that body.

    The driver traces the Python hooks that are safe to trace (on fake tensors, at compile
    time; see docs/hooks.md) into private `func.func @hook_<id>` symbols and sets the hook's
    `body` attribute. This pass clones the body at the hook: the body's arguments become the
    hook's operands and the hook's results the operands of the body's `func.return`. Hooks
    without `body` stay calls into Python, in place, so they still run in order with the
    gradients and accumulations around them; `post_acc_grad_hook`s never get a body. Body
    functions no longer referenced afterwards are erased when private (public symbols may be
    used from outside the module).

    The inlined ops are wrapped in a `ca.node` with `node = "hook"` and `index = <hook_id>`
    (for these nodes `index` is the hook id, not a position). This keeps the module in the
    shape the importer produces (every torch-dialect op of `@backward` inside a `ca.node`,
    isolated from above: the `ca` verifier checks that, and per-node lowering and logs rely
    on it), and `ca-flatten-nodes` later gives the ops the provenance `hook#<id>`. With
    `wrap-in-node=false` the ops go straight into the hook's block with that provenance
    (`ca.provenance = "hook#<id>"`), as if flattened. A body that only returns its argument
    (a hook returning None) leaves no node: the hook's result is its operand.

    A body whose signature is not exactly the hook's operand and result types is an error
    naming the hook (the `ca` verifier already rejects incompatible types; this also rejects
    compatible ones such as `[?]` for `[4]`, since the cloned ops' types would not fit).

    Before:
    ```mlir
    func.func private @hook_0(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
      %half = torch.constant.float 5.000000e-01
      %r = torch.aten.mul.Scalar %g, %half : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
      return %r : !torch.vtensor<[4],f32>
    }
    func.func @backward(%p: !torch.vtensor<[4],f32>, %g: !torch.vtensor<[4],f32>) {
      %h = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_0}
        : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
      "ca.accumulate_grad"(%p, %h) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
      return
    }
    ```
    After:
    ```mlir
    func.func @backward(%p: !torch.vtensor<[4],f32>, %g: !torch.vtensor<[4],f32>) {
      %h = "ca.node"(%g) ({
      ^bb0(%a: !torch.vtensor<[4],f32>):
        %half = torch.constant.float 5.000000e-01
        %r = torch.aten.mul.Scalar %a, %half : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
        "ca.yield"(%r) : (!torch.vtensor<[4],f32>) -> ()
      }) {node = "hook", index = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
      "ca.accumulate_grad"(%p, %h) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
      return
    }
    ```
    """

    argument = "ca-inline-hooks"
    summary = "Inline the traced body of every ca.hook that has one"

    wrap_in_node: bool = True

    def run(self, module: ir.Operation) -> None:
        hooks = []

        def collect(op):
            if op.operation.name == "ca.hook" and "body" in op.operation.attributes:
                hooks.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.walk(collect, ir.WalkOrder.PRE_ORDER)
        if not hooks:
            return
        symbols = _symbols(module)
        used = {}
        with module.context:
            for hook in hooks:
                name = ir.FlatSymbolRefAttr(hook.attributes["body"]).value
                fn = symbols.get(name)
                self._inline(hook, name, fn)
                used[name] = fn
            for name, fn in used.items():
                if _is_private(fn) and not _referenced(module, name):
                    fn.erase()

    def _inline(self, hook: ir.Operation, name: str, fn) -> None:
        hook_id = ir.IntegerAttr(hook.attributes["hook_id"]).value
        what = f"hook {hook_id} (body @{name})"
        if fn is None or fn.name != "func.func":
            raise PassFailure(f"{what}: no func.func named @{name} in the module", hook)
        blocks = list(fn.regions[0].blocks)
        if len(blocks) != 1:
            kind = "is a declaration" if not blocks else f"has {len(blocks)} blocks"
            raise PassFailure(f"{what} {kind}; only a single-block function can be inlined", hook)
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        ins, outs = [v.type for v in hook.operands], [r.type for r in hook.results]
        if list(ftype.inputs) != ins or list(ftype.results) != outs:
            raise PassFailure(f"{what}: body signature {ftype} differs from the hook's "
                              f"{ir.FunctionType.get(ins, outs)}", hook)
        ops = [op.operation for op in blocks[0].operations]
        if not ops or ops[-1].name != "func.return":
            raise PassFailure(f"{what}: body does not end with func.return", hook)
        body_ops, returned = ops[:-1], list(ops[-1].operands)
        if not body_ops:  # the hook hands its gradients back unchanged
            mapping = dict(zip(blocks[0].arguments, hook.operands))
            _replace_results(hook, [mapping.get(v, v) for v in returned])
            hook.erase()
            return
        with hook.location:
            if self.wrap_in_node:
                with ir.InsertionPoint(hook):
                    node, block = build.node("hook", hook_id, list(hook.operands), outs)
                mapping = dict(zip(blocks[0].arguments, block.arguments))
                with ir.InsertionPoint(block):
                    _clone_ops(body_ops, mapping, tag=None)
                    build.yield_([mapping.get(v, v) for v in returned])
                _replace_results(hook, list(node.results))
            else:
                mapping = dict(zip(blocks[0].arguments, hook.operands))
                with ir.InsertionPoint(hook):
                    _clone_ops(body_ops, mapping, tag=f"hook#{hook_id}")
                _replace_results(hook, [mapping.get(v, v) for v in returned])
        hook.erase()


def _clone_ops(ops, mapping: dict, tag) -> None:
    """Clones `ops` at the current insertion point, rewriting uses through `mapping`
    (which grows with each clone's results)."""
    for op in ops:
        new = op.clone()
        new.walk(lambda inner: _remap(inner.operation, mapping), ir.WalkOrder.PRE_ORDER)
        for old, res in zip(op.results, new.results):
            mapping[old] = res
        if tag is not None:
            new.attributes["ca.provenance"] = ir.StringAttr.get(tag)


def _remap(op: ir.Operation, mapping: dict):
    for i, v in enumerate(op.operands):
        if v in mapping:
            op.operands[i] = mapping[v]
    return ir.WalkResult.ADVANCE


def _replace_results(hook: ir.Operation, values) -> None:
    for res, value in zip(hook.results, values):
        res.replace_all_uses_with(value)


def _symbols(module: ir.Operation) -> dict:
    return {ir.StringAttr(op.attributes["sym_name"]).value: op
            for op in top_level_ops(module) if "sym_name" in op.attributes}


def _is_private(fn: ir.Operation) -> bool:
    attrs = fn.attributes
    return "sym_visibility" in attrs and ir.StringAttr(attrs["sym_visibility"]).value == "private"


def _referenced(module: ir.Operation, name: str) -> bool:
    """Whether any attribute in the module still refers to the symbol @name."""
    pattern = re.compile(r'@"?' + re.escape(name) + r'(?![\w$.-])')
    found = []

    def visit(op):
        attrs = op.operation.attributes
        for key in attrs:
            attr = attrs[key]
            if isinstance(attr, ir.StringAttr):
                continue
            if isinstance(attr, ir.FlatSymbolRefAttr):
                hit = ir.FlatSymbolRefAttr(attr).value == name
            else:
                hit = bool(pattern.search(str(attr)))
            if hit:
                found.append(op)
                return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.walk(visit, ir.WalkOrder.PRE_ORDER)
    return bool(found)
