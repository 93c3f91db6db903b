"""Friendly builders for `ca` ops (the DSL's generated constructors take raw attributes).

Each builder creates the op at the current insertion point and location, like the builders
of upstream dialects. Example:

    with ir.InsertionPoint(func_block):
        node, body = build.node("MulBackward0", 0, [g, x], [g.type])
        with ir.InsertionPoint(body):
            build.yield_([body.arguments[0]])
"""

from __future__ import annotations

from typing import Optional, Sequence

from torch_mlir import ir

from .ops import AccumulateGradOp, CallPythonOp, HookOp, NodeOp, SizeOp, YieldOp


def _i64(value: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def node(name: str, index: int, inputs: Sequence[ir.Value], result_types: Sequence[ir.Type],
         aot: Optional[int] = None) -> tuple[NodeOp, ir.Block]:
    """Creates a `ca.node` and its body block (arguments typed like `inputs`)."""
    op = NodeOp(ir.StringAttr.get(name), _i64(index), list(inputs), list(result_types))
    if aot is not None:
        op.operation.attributes["aot"] = _i64(aot)
    block = op.operation.regions[0].blocks.append(*[v.type for v in inputs])
    return op, block


def yield_(values: Sequence[ir.Value]) -> YieldOp:
    return YieldOp(list(values))


def hook(kind: str, hook_id: int, args: Sequence[ir.Value], result_types: Sequence[ir.Type],
         body: Optional[str] = None) -> HookOp:
    op = HookOp(ir.StringAttr.get(kind), _i64(hook_id), list(args), list(result_types))
    if body is not None:
        op.operation.attributes["body"] = ir.FlatSymbolRefAttr.get(body)
    return op


def accumulate_grad(param: ir.Value, grad: ir.Value,
                    param_index: Optional[int] = None) -> AccumulateGradOp:
    op = AccumulateGradOp(param, grad)
    if param_index is not None:
        op.operation.attributes["param_index"] = _i64(param_index)
    return op


def size(index: int, result_type: ir.Type, *, value: Optional[int] = None,
         source: Optional[ir.Value] = None) -> SizeOp:
    """A static size (`value`) or a symbolic one (`source`); exactly one must be given."""
    op = SizeOp(_i64(index), result_type, source=source)
    if value is not None:
        op.operation.attributes["value"] = _i64(value)
    return op


def call_python(callee: str, ident: int, args: Sequence[ir.Value],
                result_types: Sequence[ir.Type]) -> CallPythonOp:
    return CallPythonOp(ir.StringAttr.get(callee), _i64(ident), list(args), list(result_types))
