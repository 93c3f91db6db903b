"""Static sizes the imported types claim but torch-mlir cannot derive.

A symbolic re-trace makes every dim of every non-parameter input dynamic, and learns some
of them back from guards while tracing. So a kernel can read `[?,?]` arguments and claim
`[?,10]` or `[48,16]` results. The torch dialect accepts that, but two steps of torch-mlir
do not:
- its decompositions replace an op by ops typed from the operands, so a returned value
  becomes `[?,?]` while the function still returns `[?,10]` (the verifier rejects it);
- its transpose/permute lowering emits a `linalg.transpose` from a dynamic input dim to a
  static result dim (the verifier rejects it).

Workarounds, both stating nothing the IR did not already claim:
- `refine_transpose_inputs`: cast a transpose's input to the sizes its result type claims
  (`torch.tensor_static_info_cast`, a `tensor.cast` after lowering).
- `pin_results`: in functions of a symbolic trace (size or dynamic-dim arguments), each
  result is returned through an identity op typed as declared, which torch-mlir keeps until
  the decompositions are done.
"""

import re
from typing import Optional

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import function_type, funcs, ops_named

_VTENSOR = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],(.+)>$")
_TRANSPOSES = ("torch.aten.t", "torch.aten.numpy_T", "torch.aten.transpose.int", "torch.aten.permute")


def _sizes(type_: ir.Type):
    """([sizes, None for ?], dtype text) of a ranked `!torch.vtensor`, else (None, None)."""
    m = _VTENSOR.match(str(type_))
    if not m:
        return None, None
    sizes = [None if s == "?" else int(s) for s in m.group(1).split(",")] if m.group(1) else []
    return sizes, m.group(2)


def _vtensor(sizes, dtype) -> ir.Type:
    return ir.Type.parse(f"!torch.vtensor<[{','.join('?' if s is None else str(s) for s in sizes)}],{dtype}>")


def _static_info_cast(value: ir.Value, to: ir.Type) -> ir.Value:
    return ir.Operation.create("torch.tensor_static_info_cast", operands=[value], results=[to]).results[0]


def _return_op(fn: ir.Operation) -> ir.Operation:
    return list(fn.regions[0].blocks[0].operations)[-1].operation


def _is_symbolic(type_: ir.Type) -> bool:
    """A size argument, or a tensor with a dynamic dim: what a symbolic trace produces."""
    return str(type_) == "!torch.int" or None in (_sizes(type_)[0] or [])


def pin_results(module: ir.Module) -> None:
    """In functions with a size argument or a dynamic argument dim, returns each result through an
    `aten.contiguous` typed as the function declares: torch-mlir's decompositions may then
    retype the ops before it, never the value returned. Chosen by trying: RefinePublicReturn
    looks through casts, and `clone`/`alias`/`detach` are folded before the decompositions
    run, while `contiguous` stays until it lowers to nothing (a `tensor.cast` at most)."""
    with module.context:
        for fn in funcs(module):
            ftype = function_type(fn)
            if not any(_is_symbolic(t) for t in ftype.inputs):
                continue
            ret = _return_op(fn)
            for i, declared in enumerate(ftype.results):
                if _sizes(declared)[0] is None:
                    continue  # not a tensor
                with ret.location, ir.InsertionPoint(ret):
                    fmt = ir.Operation.create("torch.constant.int", results=[ir.Type.parse("!torch.int")],
                                              attributes={"value": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)})
                    pin = ir.Operation.create("torch.aten.contiguous", operands=[ret.operands[i], fmt.results[0]],
                                              results=[declared])
                ret.operands[i] = pin.results[0]


def _const_int(value: ir.Value) -> Optional[int]:
    owner = value.owner
    if isinstance(owner, ir.OpView) and owner.operation.name == "torch.constant.int":
        return ir.IntegerAttr(owner.operation.attributes["value"]).value
    return None


def _permutation(op: ir.Operation, rank: int) -> Optional[list]:
    """perm with result dim i = input dim perm[i], or None when not constant."""
    if op.name in ("torch.aten.t", "torch.aten.numpy_T"):
        return list(reversed(range(rank)))
    if op.name == "torch.aten.transpose.int":
        a, b = (_const_int(v) for v in op.operands[1:3])
        if a is None or b is None:
            return None
        perm = list(range(rank))
        perm[a % rank], perm[b % rank] = perm[b % rank], perm[a % rank]
        return perm
    owner = op.operands[1].owner  # torch.aten.permute
    if not (isinstance(owner, ir.OpView) and owner.operation.name == "torch.prim.ListConstruct"):
        return None
    dims = [_const_int(v) for v in owner.operation.operands]
    return None if any(d is None for d in dims) else [d % rank for d in dims]


def refine_transpose_inputs(module: ir.Module) -> None:
    """Before each transpose/permute with a constant permutation, casts its input to the
    static sizes its result type claims for the same dims, in place.

    `torch.aten.t(%x : [?,?]) -> [10,?]` gets `%x` through a
    `torch.tensor_static_info_cast` to `[?,10]` first, so that torch-mlir's lowering never
    transposes a dynamic dim into a static one. Inputs with nothing to refine are left alone.
    """
    ops = ops_named(module, *_TRANSPOSES)
    with module.context:
        for op in ops:
            in_sizes, dtype = _sizes(op.operands[0].type)
            out_sizes, _ = _sizes(op.results[0].type)
            if not in_sizes or out_sizes is None or len(in_sizes) != len(out_sizes):
                continue
            perm = _permutation(op, len(in_sizes))
            if perm is None:
                continue
            refined = list(in_sizes)
            for i, d in enumerate(perm):
                if refined[d] is None:
                    refined[d] = out_sizes[i]
            if refined != in_sizes:
                with op.location, ir.InsertionPoint(op):
                    op.operands[0] = _static_info_cast(op.operands[0], _vtensor(refined, dtype))


_VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view")


def flatten_same_rank_views(module: ir.Module) -> None:
    """Sends each same-rank view with a dynamic dim through a 1-d view first, in place.

    torch-mlir lowers a view whose input and result have the same rank, and whose types
    differ, as a `tensor.cast`: `aten.view(%x : [?,?], [%n, 4]) -> [?,4]` becomes a cast of
    `%x`, as if only the dims' static knowledge changed. That holds when the view keeps the
    shape and is wrong when it moves elements between dims: `x` of shape (8, 15) viewed as
    (30, 4) came out (8, 4) and the next op failed its size check (PyTorch's
    test_dynamic_shapes_eager_node: `result.view(s, -1).sum()` whose backward views the
    expanded gradient back). Collapsed to 1-d first (`aten.view(%x, [-1])`), the view is an
    expand from rank 1, which torch-mlir lowers from the number of elements, exactly.

    Left alone: views changing the rank (torch-mlir reshapes those with the sizes given),
    1-d inputs or results, fully static views, and same-type views with at most one dynamic
    dim (the element count then fixes that dim, so the view keeps the shape).
    """
    ops = ops_named(module, *_VIEWS)
    with module.context:
        int_type = ir.Type.parse("!torch.int")
        list_type = ir.Type.parse("!torch.list<int>")
        for op in ops:
            in_sizes, dtype = _sizes(op.operands[0].type)
            out_sizes, _ = _sizes(op.results[0].type)
            if in_sizes is None or out_sizes is None or len(in_sizes) != len(out_sizes) or len(in_sizes) < 2:
                continue
            if None not in in_sizes and None not in out_sizes:
                continue
            if in_sizes == out_sizes and in_sizes.count(None) <= 1:
                continue
            numel = None
            if None not in in_sizes:
                numel = 1
                for s in in_sizes:
                    numel *= s
            with op.location, ir.InsertionPoint(op):
                minus_one = ir.Operation.create(
                    "torch.constant.int", results=[int_type],
                    attributes={"value": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), -1)})
                dims = ir.Operation.create("torch.prim.ListConstruct", operands=[minus_one.results[0]],
                                           results=[list_type])
                flat = ir.Operation.create("torch.aten.view", operands=[op.operands[0], dims.results[0]],
                                           results=[_vtensor([numel], dtype)])
            op.operands[0] = flat.results[0]
