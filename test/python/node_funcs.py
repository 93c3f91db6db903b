"""Test-only stand-in for the outlining pass: each `ca.node` body of a captured module
becomes a standalone torch-dialect `func.func`, so the lowering to linalg can be exercised
on every backward of the zoo before the real pass exists.

A node's function takes the node's block arguments and returns its `ca.yield` operands;
its body is the node's ops, moved (the parsed module is a private copy). Nodes calling an
op of `EXTERN_OPS` are left out and reported: they stay outside the JIT kernels.
"""

from torch_mlir import ir
from torch_mlir.dialects import func

from camlir import make_context
from camlir.lowering import EXTERN_OPS, aten_name


def node_ops(node: ir.Operation) -> list:
    """The aten op names (`aten.mm`) called inside one `ca.node`."""
    names = []

    def visit(op):
        name = aten_name(op.operation)
        if name is not None:
            names.append(name)
        return ir.WalkResult.ADVANCE

    node.walk(visit)
    return names


def outline_nodes(module_text: str):
    """Returns (module of one func per node, {func name: node label}, [(label, extern ops)])."""
    context = make_context()
    module = ir.Module.parse(module_text, context)
    out = ir.Module.create(loc=ir.Location.unknown(context))
    labels, skipped = {}, []
    nodes = []
    for top in module.body.operations:
        top.operation.walk(lambda op: (nodes.append(op.operation) if op.operation.name == "ca.node" else None)
                           or ir.WalkResult.ADVANCE)
    with context, ir.Location.unknown():
        for i, node in enumerate(nodes):
            label = f"{ir.StringAttr(node.attributes['node']).value}#{ir.IntegerAttr(node.attributes['index']).value}"
            externs = sorted({n for n in node_ops(node) if n in EXTERN_OPS})
            if externs:
                skipped.append((label, externs))
                continue
            name = f"node{i}"
            labels[name] = label
            _outline(node, name, out)
    return out, labels, skipped


def _outline(node: ir.Operation, name: str, out: ir.Module) -> None:
    body = node.regions[0].blocks[0]
    ops = [op.operation for op in body.operations]
    yield_op = ops[-1]
    assert yield_op.name == "ca.yield"
    results = list(yield_op.operands)
    with ir.InsertionPoint(out.body):
        fn = func.FuncOp(name, ([a.type for a in body.arguments], [v.type for v in results]),
                         visibility="public")
    entry = fn.add_entry_block()
    with ir.InsertionPoint(entry):
        ret = func.ReturnOp(results)
    for op in ops[:-1]:
        op.move_before(ret.operation)
    for old, new in zip(body.arguments, entry.arguments):
        old.replace_all_uses_with(new)  # also a yielded argument, now returned
