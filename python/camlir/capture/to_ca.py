"""From a re-traced aten graph to a `ca` module.

1. torch-mlir's FX importer turns the aten graph into torch-dialect IR in `func @backward`.
   Provenance travels as MLIR locations: each FX node's stack trace is replaced by a
   synthetic frame naming its autograd node, so an op's location reads
   `loc("AddmmBackward0":2:0)` (`aot0:` prefixed for AOT-compiled regions).
2. The `camlir::` leaves (imported as `torch.operator "torch.camlir.*"`) become
   `ca.hook` and `ca.accumulate_grad`.
3. Consecutive ops with the same provenance are wrapped into one `ca.node` whose operands
   are the values the ops read from outside and whose results are the values read after it.
4. Lifted sizes (the `!torch.int` arguments of a symbolic graph) are read through `ca.size`.
"""

import re

import torch
from torch import fx
from torch_mlir import ir
from torch_mlir.extras.fx_importer import FxImporter

from camlir.dialects.ca import build, verify_or_raise
from camlir.dialects.ca.ir_helpers import find_func, is_inside, live_values

from .leaves import LEAF_OPS

_LOC = re.compile(r'loc\("([^"]+)":(\d+):\d+\)')


class ImportError_(RuntimeError):
    """The re-traced graph could not be brought into the `ca` dialect."""


def stamp_locations(graph: fx.Graph) -> None:
    """Replaces each node's stack trace with a synthetic frame naming its autograd node.

    A node tagged `ca_node="AddmmBackward0", ca_index=2` gets
    `File "AddmmBackward0", line 2, in ca` (`aot0:AddmmBackward0` in an AOT region), which
    the FX importer turns into `loc("AddmmBackward0":2:0)`; untagged nodes lose theirs.
    Modifies `graph` in place.
    """
    for n in graph.nodes:
        custom = n.meta.get("custom") or {}
        if "ca_node" in custom:
            prefix = f"aot{custom['ca_aot']}:" if "ca_aot" in custom else ""
            n.meta["stack_trace"] = f'  File "{prefix}{custom["ca_node"]}", line {custom["ca_index"]}, in ca\n'
        else:
            n.meta.pop("stack_trace", None)


def import_graph(graph: fx.Graph, context: ir.Context, func_name: str = "backward") -> ir.Module:
    """Imports a re-traced aten graph into a verified `ca` module.

    `import_graph(retraced.graph.graph, make_context())` -> a module with
    `func.func @backward` whose body is `ca.node`s of torch-dialect ops, `ca.hook`s,
    `ca.accumulate_grad`s and `ca.size`s. Stamps `graph`'s stack traces
    (`stamp_locations`). Raises `ImportError_` when the FX importer fails (naming the op
    and its autograd node) or the result does not verify.
    """
    stamp_locations(graph)
    importer = FxImporter(context=context)
    try:
        importer.import_stateless_graph(graph, func_name=func_name)
    except Exception as exc:
        raise ImportError_(_describe_import_failure(exc)) from exc
    module = importer.module
    to_ca(module, func_name)
    try:
        module.operation.verify()
    except ir.MLIRError as exc:
        raise ImportError_(f"the captured module does not verify: {exc}") from exc
    verify_or_raise(module.operation)
    return module


def _describe_import_failure(exc: BaseException) -> str:
    """Names the FX node the importer was working on when it failed (found in the
    traceback: the importer raises bare assertions for things it cannot type)."""
    node = None
    tb = exc.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("node")
        if isinstance(candidate, fx.Node):
            node = candidate
        tb = tb.tb_next
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if node is None:
        return f"the FX importer failed: {detail}"
    custom = node.meta.get("custom") or {}
    origin = f" (in autograd node {custom['ca_node']}#{custom['ca_index']})" if "ca_node" in custom else ""
    val = node.meta.get("val")
    layout = getattr(val, "layout", None)
    extra = f"; its result has layout {layout}" if layout is not None and layout != torch.strided else ""
    return f"op {node.target}{origin} could not be imported into MLIR: {detail}{extra}"


def _provenance(op: ir.Operation):
    m = _LOC.search(str(op.location))
    if not m:
        return None
    name, index = m.group(1), int(m.group(2))
    aot = None
    if ":" in name and name.startswith("aot"):
        prefix, name = name.split(":", 1)
        aot = int(prefix[3:])
    return name, index, aot


def to_ca(module: ir.Module, func_name: str) -> None:
    """Rewrites the torch-dialect function `@func_name` of `module` into `ca` form, in place:
    leaves become `ca.hook`/`ca.accumulate_grad`, ops are grouped into `ca.node`s by
    provenance, lifted sizes are read through `ca.size`. Raises `ImportError_` when the
    function is missing or a leaf is not in the shape the importer produces."""
    fn = find_func(module, func_name)
    if fn is None:
        raise ImportError_(f"no function @{func_name} in the imported module")
    block = fn.regions[0].blocks[0]
    with module.context, ir.Location.unknown():
        _convert_leaves(block)
        _group_nodes(block)
        _lift_sizes(block)


def _constant_int(value: ir.Value) -> int:
    owner = value.owner
    if not isinstance(owner, ir.OpView) or owner.operation.name != "torch.constant.int":
        raise ImportError_(f"expected a constant hook index, got {value}")
    return ir.IntegerAttr(owner.operation.attributes["value"]).value


def _list_elements(value: ir.Value) -> list:
    owner = value.owner
    if not isinstance(owner, ir.OpView) or owner.operation.name != "torch.prim.ListConstruct":
        raise ImportError_(f"expected a list, got {value}")
    return list(owner.operation.operands)


def _unpack_results(list_value: ir.Value) -> list:
    """The `torch.prim.ListUnpack` ops reading a hook's list result (none when nothing reads
    it, e.g. a post hook on AccumulateGrad, whose grad_inputs list is empty)."""
    unpacks = [u.owner for u in list_value.uses]
    if any(u.name != "torch.prim.ListUnpack" for u in unpacks):
        raise ImportError_("a hook's list result is used other than by torch.prim.ListUnpack")
    return unpacks


def _convert_leaves(block: ir.Block) -> None:
    for op in list(block.operations):
        op = op.operation
        if op.name != "torch.operator":
            continue
        target = ir.StringAttr(op.attributes["name"]).value.removeprefix("torch.")
        if target == "camlir.accumulate_grad":
            param, _old_grad, grad, _has_post_hooks = op.operands
            with ir.InsertionPoint(op), op.location:
                build.accumulate_grad(param, grad)
            op.erase()
        elif target in LEAF_OPS:
            _convert_hook(op, LEAF_OPS[target])


def _convert_hook(op: ir.Operation, kind: str) -> None:
    operands = list(op.operands)
    hook_id = _constant_int(operands[0])
    with ir.InsertionPoint(op), op.location:
        if kind == "unpack_hook":
            new = build.hook(kind, hook_id, [], [r.type for r in op.results], data_id=_constant_int(operands[1]))
            op.results[0].replace_all_uses_with(new.results[0])
            op.erase()
            return
        if kind in ("tensor_pre_hook", "cpp_tensor_pre_hook", "post_acc_grad_hook"):
            new = build.hook(kind, hook_id, [operands[1]], [r.type for r in op.results])
            for old, res in zip(op.results, new.results):
                old.replace_all_uses_with(res)
            op.erase()
            return
        if kind == "custom_backward":
            _convert_custom_backward(op, hook_id, operands)
            return
        args = _list_elements(operands[1])
        if kind == "post_hook":
            args += _list_elements(operands[2])
            none_at = [_constant_int(v) for v in _list_elements(operands[3])]
            none_at_outputs = [_constant_int(v) for v in _list_elements(operands[4])]
        else:
            none_at = [_constant_int(v) for v in _list_elements(operands[2])]
            none_at_outputs = []
        unpacks = _unpack_results(op.results[0])
        result_types = [r.type for r in unpacks[0].results] if unpacks else []
        new = build.hook(kind, hook_id, args, result_types, none_at=none_at, none_at_outputs=none_at_outputs)
    for unpack in unpacks:
        for old, res in zip(unpack.results, new.results):
            old.replace_all_uses_with(res)
        unpack.erase()
    op.erase()


def _convert_custom_backward(op: ir.Operation, hook_id: int, operands: list) -> None:
    """`camlir.custom_backward(id, saved, saved_none_at, grads, none_at, outputs, sizes,
    ranks, dtypes)` -> `ca.hook` of kind `custom_backward`; the result types carry the
    sizes and dtypes, so only the positions stay attributes."""
    saved = _list_elements(operands[1])
    grads = _list_elements(operands[3])
    ints = [[_constant_int(v) for v in _list_elements(operands[i])] for i in (2, 4, 5)]
    saved_none_at, none_at, outputs = ints
    unpacks = _unpack_results(op.results[0])
    result_types = [r.type for r in unpacks[0].results] if unpacks else []
    if unpacks and len(result_types) != len(outputs):
        raise ImportError_(f"custom_backward of hook {hook_id} returns {len(result_types)} values for "
                           f"{len(outputs)} output positions")
    if not unpacks and outputs:  # nothing reads its gradients: the call still runs, for its effects
        raise ImportError_(f"custom_backward of hook {hook_id}: its results are not unpacked")
    new = build.hook("custom_backward", hook_id, saved + grads, result_types, none_at=none_at,
                     saved=len(saved), saved_none_at=saved_none_at, outputs=outputs)
    for unpack in unpacks:
        for old, res in zip(unpack.results, new.results):
            old.replace_all_uses_with(res)
        unpack.erase()
    op.erase()


def _sink_accumulations(block: ir.Block) -> None:
    """Moves an accumulation below the rest of the node whose result it accumulates.

    The engine sometimes accumulates one output of a node before the rest of that node's
    ops run (seen with AOT regions), which would split the node in two. An accumulation has
    no results and no pure op reads `.grad`, so running it after the rest of the node
    changes nothing observable. Accumulations keep their order among themselves and never
    move past a hook or another node.
    """
    ops = [op.operation for op in block.operations]
    for i in reversed(range(len(ops))):
        if ops[i].name != "ca.accumulate_grad":
            continue
        j = i - 1
        while j >= 0 and (ops[j].name == "ca.accumulate_grad" or _is_constant(ops[j])):
            j -= 1
        owner = _provenance(ops[j]) if j >= 0 and _is_compute(ops[j]) else None
        if owner is None:
            continue
        k = i + 1
        while k < len(ops) and _is_compute(ops[k]) and (_is_constant(ops[k]) or _provenance(ops[k]) == owner):
            k += 1
        while k > i + 1 and _is_constant(ops[k - 1]):
            k -= 1  # constants after the node's last op belong to what follows
        if k > i + 1:
            ops[i].move_after(ops[k - 1])
            ops.insert(k - 1, ops.pop(i))


def _is_constant(op: ir.Operation) -> bool:
    return op.name.startswith("torch.constant.")


def _is_compute(op: ir.Operation) -> bool:
    """A torch-dialect op of a node's body (not a `ca` op, not the terminator)."""
    return not op.name.startswith("ca.") and op.name != "func.return"


def _erase_dead_constants(block: ir.Block) -> None:
    # E.g. the flags of the accumulation leaves, unused once they became ca.accumulate_grad.
    for op in list(block.operations):
        op = op.operation
        if _is_constant(op) and not any(True for r in op.results for _ in r.uses):
            op.erase()


def _group_nodes(block: ir.Block) -> None:
    _erase_dead_constants(block)
    _sink_accumulations(block)
    groups, current, key = [], [], None
    for op in block.operations:
        op = op.operation
        prov = None if op.name.startswith("ca.") or op.name == "func.return" else _provenance(op)
        if prov is None and op.name.startswith("torch.constant.") and current:
            current.append(op)  # constants without provenance join the node using them next
            continue
        if prov != key and current:
            groups.append((key, current))
            current = []
        key = prov
        if prov is not None:
            current.append(op)
    if current:
        groups.append((key, current))
    for (name, index, aot), ops in groups:
        if not all(_is_constant(op) for op in ops):
            _wrap(block, name, index, aot, ops)


def _wrap(block: ir.Block, name: str, index: int, aot, ops: list) -> None:
    inputs, outputs = live_values(ops)
    cloned = {}
    # Constants defined outside are copied in rather than passed as operands.
    const_inputs = [v for v in inputs if isinstance(v.owner, ir.OpView)
                    and v.owner.operation.name.startswith("torch.constant.")]
    inputs = [v for v in inputs if v not in const_inputs]
    with ir.InsertionPoint(ops[0]), ops[0].location:
        node, body = build.node(name, index, inputs, [v.type for v in outputs], aot=aot)
    with ir.InsertionPoint(body):
        for v in const_inputs:
            cloned[v] = v.owner.operation.clone().results[0]
        yield_op = build.yield_(outputs)
    for op in ops:
        op.move_before(yield_op)
    replacements = dict(zip(inputs, body.arguments))
    replacements.update(cloned)
    for v, new in replacements.items():
        for use in list(v.uses):
            if is_inside(use.owner, node):
                use.owner.operands[use.operand_number] = new
    for v, res in zip(outputs, node.results):
        for use in list(v.uses):
            if not is_inside(use.owner, node):
                use.owner.operands[use.operand_number] = res


def _lift_sizes(block: ir.Block) -> None:
    int_type = str(ir.Type.parse("!torch.int"))
    size_args = [a for a in block.arguments if str(a.type) == int_type]
    if not size_args:
        return
    first = list(block.operations)[0]
    with ir.InsertionPoint(first):
        for i, arg in enumerate(size_args):
            size = build.size(i, arg.type, source=arg)
            for use in list(arg.uses):
                if use.owner != size:
                    use.owner.operands[use.operand_number] = size.results[0]
