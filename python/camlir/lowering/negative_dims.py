"""Negative `dim` operands made positive before torch-mlir sees them.

torch-mlir's lowering of the scatter family (`aten.scatter.src`, `aten.scatter_add`, ...)
crashes the whole process (a segmentation fault inside the pass, nothing to catch) when
`dim` is negative: `torch.sort`'s backward is `new_zeros(...).scatter(-1, indices, grad)`.
Found by the OpInfo differential run. Here such a constant `dim` becomes `dim + rank`,
which means the same thing.
"""

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import defining_op, ops_matching
from camlir.dialects.ca.types import tensor_sig

# op name prefix -> position of its `dim` operand
_DIM_OPERAND = {"torch.aten.scatter": 1}


def normalize_negative_dims(module: ir.Module) -> int:
    """Rewrites negative constant `dim` operands of the ops above; returns how many."""
    changed = 0
    targets = ops_matching(module, lambda op: any(op.name.startswith(p) for p in _DIM_OPERAND))
    for op in targets:
        index = next(i for p, i in _DIM_OPERAND.items() if op.name.startswith(p))
        dim_op = defining_op(op.operands[index])
        if dim_op is None or dim_op.name != "torch.constant.int":
            continue
        dim = ir.IntegerAttr(dim_op.attributes["value"]).value
        sig = tensor_sig(op.operands[0].type)
        if dim >= 0 or sig is None or sig.shape is None:
            continue
        with op.context, op.location, ir.InsertionPoint(op):
            attr = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim + len(sig.shape))
            positive = ir.Operation.create("torch.constant.int", results=[ir.Type.parse("!torch.int")],
                                           attributes={"value": attr}).results[0]
        op.operands[index] = positive
        changed += 1
    return changed
