"""ca-index-as-input: a loop index read in a generic's body becomes an input (a constant
0, 1, 2, ... tensor), so the loop can be vectorized.

Why: the loops stage's super-vectorizer refuses a loop whose body uses its induction
variable, and `linalg.index` becomes exactly that. A cross-entropy backward's NLL gradient
(a one-hot matrix: `target[i] == j ? -grad / total_weight : 0`, 512 x 1000 in the bench
Transformer) was the one scalar loop nest of BERT's and the Transformer's kernels (0 vector
ops in the loops stage, against 53 in its neighbour), 0.21 ms of the Transformer's backward.
A load of `iota[j]` is an ordinary read the vectorizer handles.
"""

import array
import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import arith

from camlir.dialects.ca.ir_helpers import funcs, is_kernel, ops_named

from .base import CAPass
from .lazy_dialects import linalg
from .sibling_loops import loop_ranges

_MAX_SIZE = 1 << 16  # the longest loop given a constant iota (8 bytes an element)


@dataclasses.dataclass(frozen=True)
class IndexAsInput(CAPass):
    """In the `ca.kernel` functions, every `linalg.generic` on tensors whose body reads
    `linalg.index d` of a loop with a static size `n <= 65536` gets one more input per such
    `d`: a constant `tensor<n x i64>` holding 0 .. n-1, read through `(d0, ..., dk) -> (d)`;
    the body reads it instead (`arith.index_cast` to `index`, what `linalg.index` gave).
    Same values; the loop no longer uses its induction variable, so it vectorizes.

    Before:
    ```mlir
    %r = linalg.generic {indexing_maps = [#row, #id], iterator_types = ["parallel", "parallel"]}
        ins(%t : tensor<4xi64>) outs(%e : tensor<4x3xf32>) {
    ^bb0(%in: i64, %out: f32):
      %i = arith.index_cast %in : i64 to index
      %j = linalg.index 1 : index
      %eq = arith.cmpi eq, %i, %j : index
      %v = arith.select %eq, %one, %zero : f32
      linalg.yield %v : f32
    } -> tensor<4x3xf32>
    ```
    After:
    ```mlir
    %iota = arith.constant dense<[0, 1, 2]> : tensor<3xi64>
    %r = linalg.generic {indexing_maps = [#row, #col, #id], iterator_types = ["parallel", "parallel"]}
        ins(%t, %iota : tensor<4xi64>, tensor<3xi64>) outs(%e : tensor<4x3xf32>) {
    ^bb0(%in: i64, %k: i64, %out: f32):
      %i = arith.index_cast %in : i64 to index
      %j = arith.index_cast %k : i64 to index
      ...
    ```
    """

    argument = "ca-index-as-input"
    summary = "Loop indices read in generic bodies as constant iota inputs (vectorizable)"

    def run(self, module: ir.Operation) -> None:
        index_as_input(module)


def index_as_input(module: ir.Operation) -> int:
    """Rewrites every such generic in the kernels of `module`; returns how many."""
    count = 0
    for fn in funcs(module, is_kernel):
        for g in list(ops_named(fn, "linalg.generic")):
            if _rewrite(g):
                count += 1
    return count


def _rewrite(g) -> bool:
    block = g.regions[0].blocks[0]
    indices = [op.operation for op in block.operations if op.operation.name == "linalg.index"]
    if not indices or any(len(op.operation.regions) for op in block.operations):
        return False
    n_out = len(g.results)
    if n_out == 0 or any(not isinstance(r.type, ir.RankedTensorType) for r in g.results):
        return False  # on buffers, or nothing to rebuild from
    ranges = loop_ranges(g)
    if ranges is None:
        return False
    dims = sorted({ir.IntegerAttr(op.attributes["dim"]).value for op in indices})
    if any(ranges[d] > _MAX_SIZE for d in dims):
        return False
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(g.attributes["indexing_maps"])]
    n_in = len(g.operands) - n_out
    n_dims = maps[0].n_dims
    i64 = ir.IntegerType.get_signless(64)
    with g.context, g.location, ir.InsertionPoint(g):
        iotas = []
        for d in dims:
            kind = ir.RankedTensorType.get([ranges[d]], i64)
            iotas.append(_iota(ranges[d], kind))
        new_maps = (maps[:n_in] + [ir.AffineMap.get(n_dims, 0, [ir.AffineDimExpr.get(d)]) for d in dims]
                    + maps[n_in:])
        ins = list(g.operands[:n_in]) + iotas
        outs = list(g.operands[n_in:])
        new = linalg.GenericOp([r.type for r in g.results], ins, outs,
                               ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in new_maps]),
                               g.attributes["iterator_types"])
        for name in ("ca.provenance",):
            if name in g.attributes:
                new.operation.attributes[name] = g.attributes[name]
        arg_types = [a.type for a in list(block.arguments)[:n_in]] + [i64] * len(dims) + \
                    [a.type for a in list(block.arguments)[n_in:]]
        new_block = new.regions[0].blocks.append(*arg_types)
    old_args = list(block.arguments)
    mapping = {}
    for i in range(n_in):
        mapping[old_args[i]] = new_block.arguments[i]
    for i in range(len(old_args) - n_in):
        mapping[old_args[n_in + i]] = new_block.arguments[n_in + len(dims) + i]
    iota_arg = {d: new_block.arguments[n_in + k] for k, d in enumerate(dims)}
    index_type = ir.IndexType.get(g.context)
    with ir.InsertionPoint(new_block), g.location:
        for op in block.operations:
            op = op.operation
            if op.name == "linalg.index":
                d = ir.IntegerAttr(op.attributes["dim"]).value
                cast = arith.IndexCastOp(index_type, iota_arg[d])
                mapping[op.results[0]] = cast.result
                continue
            clone = op.clone()
            for k, v in enumerate(op.operands):
                clone.operands[k] = _lookup(mapping, v)
            for old_result, new_result in zip(op.results, clone.results):
                mapping[old_result] = new_result
    for old_result, new_result in zip(g.results, new.results):
        old_result.replace_all_uses_with(new_result)
    g.erase()
    return True


def _lookup(mapping: dict, value):
    hit = mapping.get(value)
    return hit if hit is not None else value  # defined outside the body


def _iota(n: int, kind) -> ir.Value:
    data = array.array("q", range(n))
    return arith.ConstantOp(kind, ir.DenseElementsAttr.get(data, type=kind)).result
