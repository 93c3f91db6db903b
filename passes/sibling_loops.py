"""Sibling loops: two independent `linalg.generic`s over the same iteration space that read
a common tensor become one generic with both results (a step of ca-fuse-elementwise).

Why: producer-consumer fusion leaves siblings apart. A batch norm's backward reduces
`sum(g)` and `sum(g * (x - mean))` over the same (N, H, W): two passes over `g` (and over
what `g` is recomputed from), where one pass can feed both accumulators. Each result keeps
its own body and its own order of additions, so no bit of any result changes.

Before:
```mlir
%s = linalg.generic {maps = [(n,c)->(n,c), (n,c)->(c)], iterators = [reduction, parallel]}
       ins(%g) outs(%z0) { %0 = arith.addf %in, %acc ; yield %0 }
%t = linalg.generic {maps = [(n,c)->(n,c), (n,c)->(n,c), (n,c)->(c)], iterators = [reduction, parallel]}
       ins(%g, %x) outs(%z1) { %0 = arith.mulf %in, %in_1 ; %1 = arith.addf %0, %acc ; yield %1 }
```
After:
```mlir
%s, %t = linalg.generic {maps = [(n,c)->(n,c), (n,c)->(n,c), (n,c)->(c), (n,c)->(c)], ...}
       ins(%g, %x) outs(%z0, %z1) { %0 = arith.addf %in, %acc0 ; %1 = arith.mulf %in, %in_1 ;
                                    %2 = arith.addf %1, %acc1 ; yield %0, %2 }
```
"""

from typing import Optional

from torch_mlir import ir

from .lazy_dialects import linalg

# A bound on the merged loop's distinct inputs, so that merging never builds a loop that reads
# many streams at once. Chosen, not measured: the batch-norm backward's merged reductions
# read 4 (3 full-size tensors and the mean), well under it.
MAX_INPUTS = 8


def merge_siblings(fn: ir.Operation) -> int:
    """Merges sibling generics in `fn`'s body (see the module docstring), repeatedly.
    Returns how many merges were made."""
    merged = 0
    while True:
        pair = _find_pair(fn)
        if pair is None:
            return merged
        _merge(*pair)
        merged += 1


def _find_pair(fn: ir.Operation):
    block = fn.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    generics = [op for op in ops if op.name == "linalg.generic" and _mergeable(op)]
    for j, second in enumerate(generics):
        for first in generics[:j]:
            if _siblings(first, second, ops):
                return first, second
    return None


def _mergeable(g: ir.Operation) -> bool:
    body = g.regions[0].blocks
    if len(body) != 1:
        return False
    return all(len(op.operation.regions) == 0 for op in body[0].operations)


def _n_outs(g: ir.Operation) -> int:
    return len(g.results)


def _maps(g: ir.Operation) -> list:
    return [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(g.attributes["indexing_maps"])]


def _iterators(g: ir.Operation) -> list:
    return [str(t) for t in ir.ArrayAttr(g.attributes["iterator_types"])]


def loop_ranges(g: ir.Operation) -> Optional[list]:
    """The static size of each loop of `g`, or None where one is not known."""
    maps = _maps(g)
    sizes: list = [None] * maps[0].n_dims
    for value, m in zip(g.operands, maps):
        if not isinstance(value.type, ir.RankedTensorType):
            continue
        shape = ir.RankedTensorType(value.type).shape
        for k, expr in enumerate(m.results):
            if isinstance(expr.maybe_downcast(), ir.AffineDimExpr):
                d = expr.maybe_downcast().position
                if shape[k] == ir.ShapedType.get_dynamic_size():
                    return None
                if sizes[d] is not None and sizes[d] != shape[k]:
                    return None
                sizes[d] = shape[k]
    return None if any(s is None for s in sizes) else sizes


def _inputs(g: ir.Operation) -> list:
    """(value, map) of each input of `g`."""
    n_in = len(g.operands) - _n_outs(g)
    maps = _maps(g)
    return [(g.operands[i], str(maps[i])) for i in range(n_in)]


def _siblings(first, second, ops) -> bool:
    if _iterators(first) != _iterators(second):
        return False
    ranges = loop_ranges(first)
    if ranges is None or ranges != loop_ranges(second):
        return False
    ins1, ins2 = _inputs(first), _inputs(second)
    if not any(a[0] == b[0] and a[1] == b[1] for a in ins1 for b in ins2):
        return False  # nothing read twice: merging would save no traffic
    if len(_union(ins1, ins2)) > MAX_INPUTS:
        return False
    lo, hi = ops.index(first), ops.index(second)
    # The merged op takes `second`'s place: `first`'s results may have no user before it,
    # and `second` may not depend on `first` through the ops between them.
    between = set(ops[lo + 1:hi])
    top_level = set(ops)
    for result in first.results:
        for use in result.uses:
            owner = _top_level(use.owner, top_level)  # a use inside a region counts for its op
            if owner in between or owner == second:
                return False
    return not _depends_on(second, first, between)


def _top_level(op, top_level: set) -> ir.Operation:
    op = op.operation if isinstance(op, ir.OpView) else op
    while op not in top_level and op.parent is not None:
        op = op.parent.operation if isinstance(op.parent, ir.OpView) else op.parent
    return op


def _operands_within(op: ir.Operation) -> list:
    """The operands of `op` and of every op nested in its regions (a generic's body may read
    a value from outside, e.g. `tensor.extract` of another op's result)."""
    found = list(op.operands)
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                found.extend(_operands_within(inner.operation))
    return found


def _depends_on(op, target, between) -> bool:
    """Whether `op` reads a value that `target` produced, directly or through `between`."""
    reached: set = set()
    stack = [op]
    while stack:
        current = stack.pop()
        for value in _operands_within(current):
            owner = value.owner
            if not isinstance(owner, ir.OpView):
                continue
            producer = owner.operation
            if producer == target:
                return True
            if producer in between and producer not in reached:
                reached.add(producer)
                stack.append(producer)
    return False


def _union(ins1, ins2) -> list:
    merged = list(ins1)
    for item in ins2:
        if not any(item[0] == m[0] and item[1] == m[1] for m in merged):
            merged.append(item)
    return merged


def _merge(first: ir.Operation, second: ir.Operation) -> None:
    ins1, ins2 = _inputs(first), _inputs(second)
    ins = _union(ins1, ins2)
    n1, n2 = _n_outs(first), _n_outs(second)
    outs1 = list(first.operands[len(ins1):])
    outs2 = list(second.operands[len(ins2):])
    maps1, maps2 = _maps(first), _maps(second)
    in_maps = {str(m): m for m in maps1[:len(ins1)] + maps2[:len(ins2)]}
    maps = [in_maps[key] for _, key in ins] + maps1[len(ins1):] + maps2[len(ins2):]
    with second.context, second.location, ir.InsertionPoint(second):
        merged = linalg.GenericOp(
            [r.type for r in first.results] + [r.type for r in second.results],
            [v for v, _ in ins], outs1 + outs2,
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
            second.attributes["iterator_types"])
        arg_types = [ir.RankedTensorType(v.type).element_type if isinstance(v.type, ir.RankedTensorType)
                     else v.type for v in [v for v, _ in ins] + outs1 + outs2]
        block = merged.regions[0].blocks.append(*arg_types)
    n_in = len(ins)
    yields = []
    for g, own_ins, out_offset, n_out in ((first, ins1, 0, n1), (second, ins2, n1, n2)):
        old = g.regions[0].blocks[0]
        mapping = {}
        for i, (value, key) in enumerate(own_ins):
            k = next(j for j, (v, kk) in enumerate(ins) if v == value and kk == key)
            mapping[i] = block.arguments[k]
        for i in range(n_out):
            mapping[len(own_ins) + i] = block.arguments[n_in + out_offset + i]
        old_args = list(old.arguments)
        cloned = {}  # a value of the old body -> its value in the merged one
        with ir.InsertionPoint(block):
            for body_op in old.operations:
                body_op = body_op.operation
                if body_op.name == "linalg.yield":
                    yields.extend(_remap(v, old_args, mapping, cloned) for v in body_op.operands)
                    continue
                new = body_op.clone()
                for k, v in enumerate(body_op.operands):
                    new.operands[k] = _remap(v, old_args, mapping, cloned)
                for old_result, new_result in zip(body_op.results, new.results):
                    cloned[old_result] = new_result
    with ir.InsertionPoint(block), second.location:
        linalg.YieldOp(yields)
    for i, result in enumerate(first.results):
        result.replace_all_uses_with(merged.results[i])
    for i, result in enumerate(second.results):
        result.replace_all_uses_with(merged.results[n1 + i])
    second.erase()
    first.erase()


def _remap(value, old_args, mapping, cloned):
    for i, arg in enumerate(old_args):
        if value == arg:
            return mapping[i]
    hit = cloned.get(value)
    return hit if hit is not None else value  # defined outside the body: a constant, a scalar
