"""Strided inputs at the kernel boundary: make the layout explicit in the IR.

Kernels take contiguous buffers (identity layouts: the compiler knows every stride, which
is what lets LLVM vectorize). Inputs of a backward are often not contiguous: saved tensors
such as `W.t()` are transposed views. Copying them would cost as much as a matmul, and
ignoring their strides gives silently wrong gradients (seen in the e2e probe).

So, for each input that is a permutation of a contiguous tensor (any dense layout), the
function is rewritten to take the contiguous tensor and permute it back in the IR:
`%x = torch.aten.permute %base, [q]`. The runtime passes `t.permute(p)`, a view with no
copy; the compiler then folds the permute into its user (a matmul's transpose flag, or an
indexing map of a fused loop). Layouts are part of what a compiled variant assumes: the
kernel boundary re-checks contiguity on every call and copies if a later call differs,
so a changed layout costs time, never correctness.
"""

from typing import Optional

import torch
from torch_mlir import ir


def dense_permutation(t: torch.Tensor) -> Optional[tuple]:
    """`p` such that `t.permute(p)` is contiguous, or None when no permutation does."""
    if t.dim() < 2:
        return None
    p = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))
    if p == tuple(range(t.dim())):
        return None
    return p if t.permute(p).is_contiguous() else None


def _inverse(p) -> list:
    q = [0] * len(p)
    for i, d in enumerate(p):
        q[d] = i
    return q


def specialize_layouts(fn: ir.Operation, args: list) -> list:
    """Rewrites `fn`'s tensor arguments that are non-contiguous permutations; returns the
    permutation to apply to each argument at run time (None: pass as is)."""
    block = fn.regions[0].blocks[0]
    perms = []
    first = list(block.operations)[0]
    for arg, value in zip(block.arguments, args):
        p = dense_permutation(value) if isinstance(value, torch.Tensor) and not value.is_contiguous() else None
        old_type = str(arg.type)
        if p is None or not old_type.startswith("!torch.vtensor<[") or "?" in old_type:
            perms.append(None)
            continue
        dims_text, elem = old_type[len("!torch.vtensor<["):-1].split("],")
        dims = dims_text.split(",")
        new_type = ir.Type.parse(f"!torch.vtensor<[{','.join(dims[d] for d in p)}],{elem}>")
        uses = list(arg.uses)
        arg.set_type(new_type)
        with ir.InsertionPoint(first), ir.Location.unknown():
            ints = [_constant_int(d) for d in _inverse(p)]
            lst = ir.Operation.create("torch.prim.ListConstruct", results=[ir.Type.parse("!torch.list<int>")],
                                      operands=ints).results[0]
            permuted = ir.Operation.create("torch.aten.permute", results=[ir.Type.parse(old_type)],
                                           operands=[arg, lst]).results[0]
        for use in uses:
            use.owner.operands[use.operand_number] = permuted
        perms.append(p)
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    fn.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([a.type for a in block.arguments], list(ftype.results)))
    return perms


def _constant_int(value: int) -> ir.Value:
    attr = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    return ir.Operation.create("torch.constant.int", results=[ir.Type.parse("!torch.int")],
                               attributes={"value": attr}).results[0]
