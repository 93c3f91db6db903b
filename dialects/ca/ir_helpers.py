"""Small queries over MLIR IR that the passes, the importer and the backends all need.

    fn = find_func(module, "backward")             # a func.func by symbol name, or None
    calls = ops_named(fn, "func.call")             # every func.call nested in fn, in order
    torch_op_name(op)                              # "aten.mm" for torch.aten.mm and for
                                                   # torch.operator "torch.aten.mm"
    ins, outs = live_values(ops)                   # what a run of ops reads from outside
                                                   # and what outside reads from it

They take `ir.Module`s and `ir.Operation`s alike (a module is looked at through its body).
"""

from typing import Callable, Optional

from torch_mlir import ir


def _operation(root) -> ir.Operation:
    return root.operation if hasattr(root, "operation") else root


def top_level_ops(root) -> list:
    """The operations directly in the body of a module (`ir.Module` or `builtin.module` op)."""
    return [op.operation for op in _operation(root).regions[0].blocks[0].operations]


def func_name(fn: ir.Operation) -> str:
    """The symbol name of a `func.func`, without the `@`: `"backward"`."""
    return ir.StringAttr(fn.attributes["sym_name"]).value


def find_func(root, name: str) -> Optional[ir.Operation]:
    """The top-level `func.func @name` of a module, or None."""
    for op in top_level_ops(root):
        if op.name == "func.func" and func_name(op) == name:
            return op
    return None


def require_func(root, name: str) -> ir.Operation:
    """Like `find_func`, but a missing function is a ValueError that names it."""
    fn = find_func(root, name)
    if fn is None:
        raise ValueError(f"no function @{name} in the module")
    return fn


def funcs(root, predicate: Callable[[ir.Operation], bool] = lambda fn: True) -> list:
    """The top-level `func.func`s of a module for which `predicate(fn)` holds."""
    return [op for op in top_level_ops(root) if op.name == "func.func" and predicate(op)]


def is_kernel(fn: ir.Operation) -> bool:
    """Whether `fn` is a compute kernel (it carries the `ca.kernel` attribute, set on the
    functions `ca-outline-kernels` outlines), as opposed to the host function or a hook body."""
    return "ca.kernel" in fn.attributes


def function_type(fn: ir.Operation) -> ir.FunctionType:
    """The `ir.FunctionType` of a `func.func` (its `.inputs` and `.results` type lists)."""
    return ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)


def ops_matching(root, predicate: Callable[[ir.Operation], bool]) -> list:
    """Every operation nested in `root` (itself included) for which `predicate` holds, in
    pre-order. The list is built before anything is changed, so callers may erase."""
    found = []

    def visit(op):
        if predicate(op.operation):
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    _operation(root).walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def ops_named(root, *names: str) -> list:
    """Every operation nested in `root` whose name is one of `names`, in pre-order."""
    wanted = set(names)
    return ops_matching(root, lambda op: op.name in wanted)


def torch_op_name(op: ir.Operation) -> str:
    """`aten.mm` for `torch.aten.mm` and for `torch.operator "torch.aten.mm"` (how the
    importer writes ops the torch dialect does not define); other ops lose a `torch.` prefix
    only (`prim.ListConstruct`), non-torch ops keep their name (`ca.hook`)."""
    name = op.name
    if name == "torch.operator":
        name = ir.StringAttr(op.attributes["name"]).value
    return name.removeprefix("torch.")


def aten_name(op: ir.Operation) -> Optional[str]:
    """`torch_op_name(op)` for aten and prims ops; None for every other op."""
    name = torch_op_name(op)
    return name if name.startswith(("aten.", "prims.")) else None


def is_inside(op: ir.Operation, ancestor: ir.Operation) -> bool:
    """True when `op` is nested (strictly) in `ancestor`'s regions."""
    op = op.parent
    while op is not None:
        if op == ancestor:
            return True
        op = op.parent
    return False


def next_op(op: ir.Operation):
    """The op after `op` in its block, or None for the last one. (An insertion point after
    `op` holds it; listing the block instead cost 21 ms a call on MobileNetV3's host
    function, 2.2 s of its first backward.)"""
    after = ir.InsertionPoint.after(op).ref_operation
    return after.operation if after is not None else None


def defining_op(value: ir.Value) -> Optional[ir.Operation]:
    """The operation that defines `value`, or None for a block argument."""
    owner = value.owner
    return owner.operation if isinstance(owner, ir.OpView) else None


_VIEW_OPS = ("memref.expand_shape", "memref.collapse_shape", "memref.subview", "memref.reinterpret_cast",
             "memref.cast", "memref.transpose", "memref.view")


def memref_root(value: ir.Value) -> ir.Value:
    """The buffer a memref value looks into, through view-like ops (`memref.subview`,
    `expand_shape`, `transpose`, ...): two values with one root may alias."""
    while isinstance(value.owner, ir.OpView) and value.owner.operation.name in _VIEW_OPS:
        value = value.owner.operation.operands[0]
    return value


def live_values(ops: list, keep_outside: Callable[[ir.Value], bool] = lambda v: False) -> tuple:
    """(inputs, outputs) of a run of ops in one block: the values the run (ops nested in its
    regions included) reads that are defined outside it, in first-use order, leaving out
    those for which `keep_outside(v)` holds (values the caller rematerializes instead, such
    as constants); and the results of the run that something outside it reads."""
    members = set()
    for op in ops:
        members.update(ops_matching(op, lambda o: True))
    inputs, outputs = [], []
    for op in ops:
        for inner in ops_matching(op, lambda o: True):
            for v in inner.operands:
                owner = v.owner
                inside = (owner.operation in members if isinstance(owner, ir.OpView)
                          else owner.owner in members)  # a block argument of a nested region
                if not inside and not keep_outside(v) and v not in inputs:
                    inputs.append(v)
        for r in op.results:
            if any(u.owner not in members for u in r.uses) and r not in outputs:
                outputs.append(r)
    return inputs, outputs
