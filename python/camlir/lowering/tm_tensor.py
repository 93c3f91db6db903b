"""`tm_tensor.scatter` as `scf.for` loops over tensors.

torch-mlir lowers scatter-with-accumulation (max-pool backward, `index_put` with
`accumulate=True` from embedding backward, `scatter_add`) to its own `tm_tensor.scatter`,
because linalg cannot express writes where several updates may hit one element. Its
`tm-tensor-to-loops` pass only handles buffers, and camlir's JIT bufferizes with upstream
one-shot bufferization, which does not know `tm_tensor`. So the scatter is rewritten here,
still on tensors, into a loop nest carrying the destination tensor:

    for i in updates.dim(0), j.. in updates' other dims:     (scf.for, iter_args = dest)
        pos[d] = j.. for the trailing dims of dest (right-aligned with updates' dims 1..)
        pos[dimension_map[k]] (+)= indices[i, k]   for each index column k
        dest[pos] = region(updates[i, j..], dest[pos])       (tensor.extract / tensor.insert)

which bufferizes in place (load/store on the destination buffer). Updates run in order,
so duplicate indices accumulate exactly as the region says. Other tm_tensor ops (scan,
sort, topk, attention) are not produced by any backward camlir has seen; they are left for
the contract check to report.
"""

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import ops_named
from torch_mlir.dialects import arith, scf, tensor


def lower_tm_tensor(module: ir.Module) -> None:
    """Rewrites every `tm_tensor.scatter` in `module` into `scf.for` loops on tensors, in
    place (see the module docstring). Raises ValueError for a scatter whose indices and
    update dims do not cover every destination dim."""
    scatters = ops_named(module, "tm_tensor.scatter")
    with module.context:
        for op in scatters:
            _lower_scatter(op)


def _index(value: int) -> ir.Value:
    return arith.ConstantOp(ir.IndexType.get(), value).result


def _lower_scatter(op: ir.Operation) -> None:
    updates, indices, original = op.operands
    dim_map = list(ir.DenseI64ArrayAttr(op.attributes["dimension_map"]))
    upd_type = ir.RankedTensorType(updates.type)
    orig_rank = ir.RankedTensorType(original.type).rank
    depth = ir.RankedTensorType(indices.type).shape[1]
    with ir.InsertionPoint(op), op.location:
        zero, one = _index(0), _index(1)
        bounds = [_index(s) if not ir.ShapedType.is_dynamic_size(s) else tensor.DimOp(updates, _index(d)).result
                  for d, s in enumerate(upd_type.shape)]
    loops, carried = [], original
    for bound in bounds:
        ip = ir.InsertionPoint(op) if not loops else ir.InsertionPoint(loops[-1].body)
        with ip, op.location:
            loop = scf.ForOp(zero, bound, one, [carried])
        loops.append(loop)
        carried = loop.inner_iter_args[0]
    for outer, inner in zip(loops, loops[1:]):
        with ir.InsertionPoint(outer.body), op.location:
            scf.YieldOp(inner.results)
    ivs = [loop.induction_variable for loop in loops]
    body = loops[-1].body
    with ir.InsertionPoint(body), op.location:
        update = tensor.ExtractOp(updates, ivs).result
        pos = [None] * orig_rank
        offset = orig_rank - (len(ivs) - 1)
        for k, iv in enumerate(ivs[1:]):
            pos[offset + k] = iv
        for k in range(depth):
            idx = tensor.ExtractOp(indices, [ivs[0], _index(k)]).result
            idx = arith.IndexCastOp(ir.IndexType.get(), idx).result
            d = dim_map[k]
            pos[d] = idx if pos[d] is None else arith.AddIOp(idx, pos[d]).result
        if any(p is None for p in pos):
            raise ValueError(f"tm_tensor.scatter does not cover every destination dim: {op}")
        current = tensor.ExtractOp(carried, pos).result
    region = op.regions[0].blocks[0]
    region.arguments[0].replace_all_uses_with(update)
    region.arguments[1].replace_all_uses_with(current)
    ops = [o.operation for o in region.operations]
    terminator = ops[-1]
    last = current.owner
    for inner_op in ops[:-1]:  # the combining ops (e.g. arith.addf), after the loads
        inner_op.move_after(last)
        last = inner_op
    with ir.InsertionPoint(body), op.location:
        new = tensor.InsertOp(terminator.operands[0], carried, pos).result
        scf.YieldOp([new])
    op.results[0].replace_all_uses_with(loops[0].results[0])
    op.erase()
