"""Builders for `ca` ops, at the current insertion point and location.

Example:

    with ir.InsertionPoint(func_block):
        node, body = build.node("MulBackward0", 0, [g, x], [g.type])
        with ir.InsertionPoint(body):
            build.yield_([body.arguments[0]])
"""

from typing import Optional, Sequence

from torch_mlir import ir


def _i64(value: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def _create(name, operands=(), result_types=(), attributes=None, regions=0) -> ir.Operation:
    return ir.Operation.create(name, results=list(result_types), operands=list(operands),
                               attributes=attributes or {}, regions=regions)


def node(name: str, index: int, inputs: Sequence[ir.Value], result_types: Sequence[ir.Type],
         aot: Optional[int] = None) -> tuple:
    """Creates a `ca.node` and its body block (arguments typed like `inputs`)."""
    attrs = {"node": ir.StringAttr.get(name), "index": _i64(index)}
    if aot is not None:
        attrs["aot"] = _i64(aot)
    op = _create("ca.node", inputs, result_types, attrs, regions=1)
    block = op.regions[0].blocks.append(*[v.type for v in inputs])
    return op, block


def yield_(values: Sequence[ir.Value]) -> ir.Operation:
    """Creates the `ca.yield` ending a `ca.node` body; `values` become the node's results."""
    return _create("ca.yield", values)


def hook(kind: str, hook_id: int, args: Sequence[ir.Value], result_types: Sequence[ir.Type],
         body: Optional[str] = None, none_at: Sequence[int] = (),
         none_at_outputs: Sequence[int] = (), data_id: Optional[int] = None,
         saved: Optional[int] = None, saved_none_at: Sequence[int] = (),
         outputs: Optional[Sequence[int]] = None) -> ir.Operation:
    """Creates a `ca.hook` of `kind` (e.g. `"tensor_pre_hook"`) calling hook `hook_id` on
    `args`; `body` names the `func.func` with its traced body, when there is one;
    `none_at` / `none_at_outputs` are the positions where the hook's gradient lists hold None
    (attributes only when not empty); `data_id` is an unpack hook's packed-data position;
    `saved`, `saved_none_at` and `outputs` describe a `custom_backward` host call."""
    attrs = {"kind": ir.StringAttr.get(kind), "hook_id": _i64(hook_id)}
    if body is not None:
        attrs["body"] = ir.FlatSymbolRefAttr.get(body)
    if none_at:
        attrs["none_at"] = ir.ArrayAttr.get([_i64(i) for i in none_at])
    if none_at_outputs:
        attrs["none_at_outputs"] = ir.ArrayAttr.get([_i64(i) for i in none_at_outputs])
    if data_id is not None:
        attrs["data_id"] = _i64(data_id)
    if saved is not None:
        attrs["saved"] = _i64(saved)
    if saved_none_at:
        attrs["saved_none_at"] = ir.ArrayAttr.get([_i64(i) for i in saved_none_at])
    if outputs is not None:
        attrs["outputs"] = ir.ArrayAttr.get([_i64(i) for i in outputs])
    return _create("ca.hook", args, result_types, attrs)


def accumulate_grad(param: ir.Value, grad: ir.Value,
                    param_index: Optional[int] = None) -> ir.Operation:
    """Creates a `ca.accumulate_grad` adding `grad` into `param.grad`; `param_index`, the
    parameter's position among the backward's inputs, is only for logs."""
    attrs = {} if param_index is None else {"param_index": _i64(param_index)}
    return _create("ca.accumulate_grad", [param, grad], [], attrs)


def size(index: int, result_type: ir.Type, *, value: Optional[int] = None,
         source: Optional[ir.Value] = None) -> ir.Operation:
    """A static size (`value`) or a symbolic one (`source`); exactly one should be given."""
    attrs = {"index": _i64(index)}
    if value is not None:
        attrs["value"] = _i64(value)
    return _create("ca.size", [] if source is None else [source], [result_type], attrs)


def call_python(callee: str, ident: int, args: Sequence[ir.Value],
                result_types: Sequence[ir.Type]) -> ir.Operation:
    """Creates a `ca.call_python` of the callable registered under `ident`; `callee` (e.g.
    `"aten::my_op"`) only names it for logs and errors."""
    attrs = {"callee": ir.StringAttr.get(callee), "id": _i64(ident)}
    return _create("ca.call_python", args, result_types, attrs)
