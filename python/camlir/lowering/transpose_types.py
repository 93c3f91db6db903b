"""Static sizes a transpose's result type claims, made visible on its input.

A symbolic re-trace can type a value `[?,48]` where it is produced and `[48,16]` where it is
transposed later (the trace learnt `? == 16` in between, from a guard). torch-mlir's
transpose/permute lowering takes the result type as given and emits a `linalg.transpose`
whose verifier rejects a dynamic input dim mapped to a static result dim. Casting the
input first (`torch.tensor_static_info_cast`, a `tensor.cast` after lowering, checked at
run time like any cast) states nothing the IR did not already claim.
"""

import re
from typing import Optional

from torch_mlir import ir

_VTENSOR = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],(.+)>$")


def _sizes(type_: ir.Type):
    m = _VTENSOR.match(str(type_))
    if not m:
        return None, None
    sizes = [None if s == "?" else int(s) for s in m.group(1).split(",")] if m.group(1) else []
    return sizes, m.group(2)


def _const_int(value: ir.Value) -> Optional[int]:
    owner = value.owner
    if isinstance(owner, ir.OpView) and owner.operation.name == "torch.constant.int":
        return ir.IntegerAttr(owner.operation.attributes["value"]).value
    return None


def _permutation(op: ir.Operation, rank: int) -> Optional[list]:
    """perm with result dim i = input dim perm[i], or None when not constant."""
    name = op.name
    if name in ("torch.aten.t", "torch.aten.numpy_T"):
        return list(reversed(range(rank)))
    if name == "torch.aten.transpose.int":
        a, b = (_const_int(v) for v in op.operands[1:3])
        if a is None or b is None:
            return None
        perm = list(range(rank))
        a, b = a % rank, b % rank
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    if name == "torch.aten.permute":
        owner = op.operands[1].owner
        if not (isinstance(owner, ir.OpView) and owner.operation.name == "torch.prim.ListConstruct"):
            return None
        dims = [_const_int(v) for v in owner.operation.operands]
        return None if any(d is None for d in dims) else [d % rank for d in dims]
    return None


def refine_transpose_inputs(module: ir.Module) -> None:
    ops = []
    module.operation.walk(lambda op: (ops.append(op.operation) if op.operation.name in (
        "torch.aten.t", "torch.aten.numpy_T", "torch.aten.transpose.int", "torch.aten.permute")
        else None) or ir.WalkResult.ADVANCE)
    for op in ops:
        source = op.operands[0]
        in_sizes, dtype = _sizes(source.type)
        out_sizes, _ = _sizes(op.results[0].type)
        if in_sizes is None or out_sizes is None or len(in_sizes) != len(out_sizes) or not in_sizes:
            continue
        perm = _permutation(op, len(in_sizes))
        if perm is None:
            continue
        refined = list(in_sizes)
        for i, d in enumerate(perm):
            if refined[d] is None and out_sizes[i] is not None:
                refined[d] = out_sizes[i]
        if refined == in_sizes:
            continue
        dims = ",".join("?" if s is None else str(s) for s in refined)
        with module.context, op.location, ir.InsertionPoint(op):
            cast = ir.Operation.create("torch.tensor_static_info_cast", operands=[source],
                                       results=[ir.Type.parse(f"!torch.vtensor<[{dims}],{dtype}>")])
        op.operands[0] = cast.results[0]
