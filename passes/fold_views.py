"""ca-fold-views: affine loads and stores through a view read their buffer's root instead."""

import dataclasses
import math

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import ops_named

from .base import CAPass

_VIEWS = ("memref.subview", "memref.expand_shape", "memref.collapse_shape")


@dataclasses.dataclass(frozen=True)
class FoldViews(CAPass):
    """Rewrites each `affine.load` / `affine.store` whose buffer is a chain of static views
    (`memref.subview` without rank reduction, `memref.expand_shape`, `memref.collapse_shape`)
    of a buffer with the identity layout into an access of that buffer, its indices
    composed through the views (`offset + stride * i` for a subview, linearized for an
    expansion, `floordiv`/`mod` for a collapse).

    Why: the super-vectorizer refuses a loop that touches a buffer with a strided layout
    ("NYI: non-trivial layout map"), so every loop that reads a slice stayed scalar:
    a depthwise convolution's backward (one shifted slice of the padded gradient per kernel
    tap) and the fill of a padded tensor's interior. The wheel's `fold-memref-alias-ops`
    folds views into `memref.load`/`store` only, not the affine ones the loops stage makes.
    Dynamic offsets, sizes or strides, and rank-reducing subviews, are left as they are.

    Before:
    ```mlir
    %s = memref.subview %a[1, 2] [8, 8] [1, 1] : memref<10x10xf32> to memref<8x8xf32, strided<[10, 1], offset: 12>>
    affine.for %i = 0 to 8 {
      affine.for %j = 0 to 8 {
        %v = affine.load %s[%i, %j] : memref<8x8xf32, strided<[10, 1], offset: 12>>
        affine.store %v, %o[%i, %j] : memref<8x8xf32>
      }
    }
    ```
    After:
    ```mlir
    affine.for %i = 0 to 8 {
      affine.for %j = 0 to 8 {
        %v = affine.load %a[%i + 1, %j + 2] : memref<10x10xf32>
        affine.store %v, %o[%i, %j] : memref<8x8xf32>
      }
    }
    ```
    """

    argument = "ca-fold-views"
    summary = "Affine loads and stores through static views access the root buffer (vectorizable)"

    def run(self, module: ir.Operation) -> None:
        for op in ops_named(module, "affine.load", "affine.store"):
            _fold(op)


def static_view_chain(value: ir.Value) -> tuple:
    """(root, views): the views that make `value` from `root`, root first, following static
    views only; `(value, [])` when `value` is not such a view."""
    views = []
    while True:
        owner = value.owner
        if not isinstance(owner, ir.OpView) or not _is_static_view(owner.operation):
            break
        views.append(owner.operation)
        value = owner.operation.operands[0]
    return value, views[::-1]


def _fold(op: ir.Operation) -> None:
    store = op.name == "affine.store"
    buffer = op.operands[1 if store else 0]
    root, views = static_view_chain(buffer)
    if not views or _identity_layout(buffer.type) or not _identity_layout(root.type):
        return
    amap = ir.AffineMapAttr(op.attributes["map"]).value
    exprs = list(amap.results)
    for view in reversed(views):
        exprs = _through(view, exprs)
    exprs = [ir.AffineExpr.simplify_affine_expr(e, amap.n_dims, amap.n_symbols).maybe_downcast() for e in exprs]
    indices = list(op.operands[2 if store else 1:])
    loops = _loops_around(op)
    ivs = {k for k, v in enumerate(indices[:amap.n_dims]) if any(iv == v for iv, _ in loops)}
    if not all(_unit_steps(e, ivs) for e in exprs):
        return  # the vectorizer would read such an index as contiguous
    if not _whole_vectors(views, buffer, root, exprs, indices[:amap.n_dims], loops):
        return
    new_map = ir.AffineMapAttr.get(ir.AffineMap.get(amap.n_dims, amap.n_symbols, exprs))
    with op.context, op.location, ir.InsertionPoint(op):
        if store:
            ir.Operation.create("affine.store", operands=[op.operands[0], root] + indices,
                                attributes={"map": new_map})
        else:
            new = ir.Operation.create("affine.load", results=[op.results[0].type], operands=[root] + indices,
                                      attributes={"map": new_map})
            op.results[0].replace_all_uses_with(new.results[0])
    op.erase()


VECTOR = 8  # the loops stage's virtual vector size


def _whole_vectors(views, buffer, root, exprs, dims, loops) -> bool:
    """Whether the vector code made from the folded access touches only what the view
    did. The vectorizer widens a loop whose trip count is not a multiple of the vector by
    masking against the buffer's bounds, so a store through a view dropped the lanes past
    its end; on the root they land in the next row, the padding or past the buffer (heap
    corruption in a depthwise backward's 4x4 maps). So every loop index that reaches a root
    dim the views narrowed must come from a loop of a multiple of `VECTOR` iterations
    (an index that is no loop's, a constant, is never widened)."""
    narrowed = set(range(len(exprs)))
    if all(v.name == "memref.subview" for v in views):
        view_shape, root_shape = ir.MemRefType(buffer.type).shape, ir.MemRefType(root.type).shape
        narrowed = {k for k in narrowed if view_shape[k] != root_shape[k]}
    for k in narrowed:
        for position in _dim_positions(exprs[k]):
            loop = [n for iv, n in loops if position < len(dims) and iv == dims[position]]
            if loop and (loop[0] is None or loop[0] % VECTOR):
                return False  # a loop the vectorizer may widen, with a partial vector
    return True


def _loops_around(op: ir.Operation) -> list:
    """(induction variable, trip count) of each `affine.for` around `op`; the count is None
    unless the bounds are constants and the step 1."""
    counts = []
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if parent.name == "affine.for":
            lower = ir.AffineMapAttr(parent.attributes["lowerBoundMap"]).value
            upper = ir.AffineMapAttr(parent.attributes["upperBoundMap"]).value
            step = ir.IntegerAttr(parent.attributes["step"]).value
            count = None
            if (step == 1 and len(lower.results) == 1 and len(upper.results) == 1
                    and isinstance(lower.results[0], ir.AffineConstantExpr)
                    and isinstance(upper.results[0], ir.AffineConstantExpr)):
                count = upper.results[0].value - lower.results[0].value
            counts.append((parent.regions[0].blocks[0].arguments[0], count))
        parent = parent.parent
    return counts


def _dim_positions(e) -> set:
    if isinstance(e, ir.AffineDimExpr):
        return {e.position}
    if isinstance(e, ir.AffineBinaryExpr):
        return _dim_positions(e.lhs) | _dim_positions(e.rhs)
    return set()


def _unit_steps(expr, ivs: set) -> bool:
    """Whether `expr` moves by exactly 1 when any one loop index it reads (the dims in
    `ivs`) moves by 1: loop indices with coefficient 1, plus anything of constants, symbols
    and other dims. The super-vectorizer takes an access whose one varying index depends on
    its loop as contiguous along it, whatever the coefficient (a stride-2 slice,
    `i floordiv 9`); folding such a view would turn a loop it refused into wrong vector
    code."""
    coefficients = {}

    def visit(e, scale) -> bool:
        if isinstance(e, ir.AffineAddExpr):
            return visit(e.lhs, scale) and visit(e.rhs, scale)
        if isinstance(e, ir.AffineDimExpr):
            if e.position in ivs:
                coefficients[e.position] = coefficients.get(e.position, 0) + scale
            return True
        if isinstance(e, ir.AffineMulExpr):
            if isinstance(e.rhs, ir.AffineConstantExpr):
                return visit(e.lhs, scale * e.rhs.value)
            if isinstance(e.lhs, ir.AffineConstantExpr):
                return visit(e.rhs, scale * e.lhs.value)
        return not (_dim_positions(e) & ivs)  # constants, symbols; floordiv/mod without loop indices

    return visit(expr, 1) and all(c in (0, 1) for c in coefficients.values())


def _is_static_view(op: ir.Operation) -> bool:
    if op.name not in _VIEWS or len(op.operands) != 1:  # a dynamic offset, size or stride
        return False
    source, result = ir.MemRefType(op.operands[0].type), ir.MemRefType(op.results[0].type)
    if not (source.has_static_shape and result.has_static_shape):
        return False
    if op.name == "memref.subview":
        return source.rank == result.rank  # rank-reducing: which dims went is not local
    return True


def _identity_layout(t: ir.Type) -> bool:
    if not isinstance(t, ir.MemRefType):
        return False
    layout = ir.MemRefType(t).layout
    return (isinstance(layout, ir.AffineMapAttr)
            and ir.AffineMapAttr(layout).value == ir.AffineMap.get_identity(ir.MemRefType(t).rank))


def _through(view: ir.Operation, exprs: list) -> list:
    """The index expressions into `view`'s source for `exprs`, indices into its result."""
    if view.name == "memref.subview":
        offsets = list(ir.DenseI64ArrayAttr(view.attributes["static_offsets"]))
        strides = list(ir.DenseI64ArrayAttr(view.attributes["static_strides"]))
        return [e * s + o for e, o, s in zip(exprs, offsets, strides)]
    groups = [[ir.IntegerAttr(i).value for i in ir.ArrayAttr(g)] for g in ir.ArrayAttr(view.attributes["reassociation"])]
    if view.name == "memref.expand_shape":
        shape = ir.MemRefType(view.results[0].type).shape
        out = []
        for group in groups:
            total = None
            for j in group:
                term = exprs[j] * math.prod(shape[j + 1:group[-1] + 1])
                total = term if total is None else total + term
            out.append(total)
        return out
    shape = ir.MemRefType(view.operands[0].type).shape  # collapse_shape: split each index
    out = []
    for group, e in zip(groups, exprs):
        for n, j in enumerate(group):
            inner = math.prod(shape[j + 1:group[-1] + 1])
            part = ir.AffineFloorDivExpr.get(e, ir.AffineConstantExpr.get(inner)) if inner != 1 else e
            if n:
                part = ir.AffineModExpr.get(part, ir.AffineConstantExpr.get(shape[j]))
            out.append(part)
    return out
