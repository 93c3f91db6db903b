"""ca-disjoint-scatters: sums of gradients scattered into different slices of zeros become
one scatter chain: each gradient written into its slice, no zero tensor per term, no add.

Why: `select` and `unbind` have a backward that scatters the gradient into zeros of the
input's shape (`new_zeros` + `select_scatter`); the engine then adds the terms. PyTorch's
`nn.MultiheadAttention` splits its packed q, k, v projection that way (`proj[0]`, `proj[1]`,
`proj[2]`), so each attention layer's backward built three zero tensors of the whole
projection (3 x 64 x 8 x 128 floats in the bench Transformer), wrote one slice of each,
and added the three: four passes over 786 KB where one write per slice does (measured with
perf at 38ba838: the three zero copies and the add were ~0.2 ms of kernel time per layer).
"""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import ops_named

from .base import CAPass

_ZEROS = ("torch.aten.new_zeros", "torch.aten.zeros", "torch.aten.zeros_like")


@dataclasses.dataclass(frozen=True)
class DisjointScatters(CAPass):
    """Rewrites `add(X, select_scatter(zeros, b, d, j))` (alpha 1, either operand order)
    into `select_scatter(X, b, d, j)` where `X` is zeros or a chain of `select_scatter`s
    into zeros along the same dim `d` that never wrote index `j`: `X` is zero at `j`, and
    the scatter is zero everywhere else, so the sum is `X` with `b` at `j`. Types must be
    equal (no broadcast, no promotion); dims and indices constant (negative ones are
    normalized by the static shape). The only difference from the sum is the sign of a zero:
    `0 + (-0.0)` is `+0.0`, the scatter keeps `-0.0` (equal under `==` and
    `torch.testing.assert_close`). Zeros are `aten.new_zeros`, `aten.zeros`,
    `aten.zeros_like`. A scatter left without users is erased (and its zeros).

    Before:
    ```mlir
    %z0 = torch.aten.new_zeros %g0, %shape, %none, %none, %none, %false : ... -> !torch.vtensor<[3,4],f32>
    %s0 = torch.aten.select_scatter %z0, %g0, %int0, %int2 : ... -> !torch.vtensor<[3,4],f32>
    %z1 = torch.aten.new_zeros %g1, %shape, %none, %none, %none, %false : ... -> !torch.vtensor<[3,4],f32>
    %s1 = torch.aten.select_scatter %z1, %g1, %int0, %int1 : ... -> !torch.vtensor<[3,4],f32>
    %sum = torch.aten.add.Tensor %s0, %s1, %int1 : ... -> !torch.vtensor<[3,4],f32>
    ```
    After:
    ```mlir
    %z0 = torch.aten.new_zeros %g0, %shape, %none, %none, %none, %false : ... -> !torch.vtensor<[3,4],f32>
    %s0 = torch.aten.select_scatter %z0, %g0, %int0, %int2 : ... -> !torch.vtensor<[3,4],f32>
    %sum = torch.aten.select_scatter %s0, %g1, %int0, %int1 : ... -> !torch.vtensor<[3,4],f32>
    ```
    """

    argument = "ca-disjoint-scatters"
    summary = "Sums of select_scatters into zeros along disjoint indices as one scatter chain"

    def run(self, module: ir.Operation) -> None:
        disjoint_scatters(module)


def disjoint_scatters(module) -> int:
    """Rewrites every such add in `module` (in program order, so a chain grows term by
    term); returns how many."""
    count = 0
    for add in list(ops_named(module, "torch.aten.add.Tensor")):
        if not _is_one(add.operands[2]):
            continue
        x, y = add.operands[0], add.operands[1]
        result_type = add.results[0].type
        if x.type != result_type or y.type != result_type:
            continue
        for chain, single in ((x, y), (y, x)):
            term = _single_scatter(single)
            if term is None:
                continue
            written = _written(chain)
            if written is None:
                continue
            dim, indices = written
            if indices and dim != term[1]:
                continue
            if term[2] in indices:
                continue
            _rewrite(add, chain, single)
            count += 1
            break
    return count


def _rewrite(add, chain, single) -> None:
    scatter = single.owner
    with add.context, add.location, ir.InsertionPoint(add):
        new = ir.Operation.create("torch.aten.select_scatter", results=[add.results[0].type],
                                  operands=[chain, scatter.operands[1], scatter.operands[2], scatter.operands[3]])
    if "ca.provenance" in add.attributes:
        new.attributes["ca.provenance"] = add.attributes["ca.provenance"]
    add.results[0].replace_all_uses_with(new.results[0])
    add.erase()
    if not _has_uses(scatter.results[0]):
        zeros = scatter.operands[0].owner
        scatter.erase()
        if isinstance(zeros, (ir.Operation, ir.OpView)) and not _has_uses(zeros.results[0]):
            zeros.erase()


def _has_uses(value) -> bool:
    return any(True for _ in value.uses)


def _op(value):
    owner = value.owner
    return owner if isinstance(owner, (ir.Operation, ir.OpView)) else None


def _is_one(value) -> bool:
    op = _op(value)
    if op is None:
        return False
    if op.name == "torch.constant.int":
        return ir.IntegerAttr(op.attributes["value"]).value == 1
    if op.name == "torch.constant.float":
        return ir.FloatAttr(op.attributes["value"]).value == 1.0
    return False


def _const_int(value):
    op = _op(value)
    if op is None or op.name != "torch.constant.int":
        return None
    return ir.IntegerAttr(op.attributes["value"]).value


def _shape(value):
    """The static sizes of a `!torch.vtensor<[3,4],f32>`, or None."""
    text = str(value.type)
    if not text.startswith("!torch.vtensor<["):
        return None
    inner = text[len("!torch.vtensor<["):text.index("]")]
    try:
        return [int(s) for s in inner.split(",")] if inner else []
    except ValueError:
        return None  # a dynamic size ("?")


def _single_scatter(value):
    """(op, dim, index) where `value` is `select_scatter(zeros, b, dim, index)`, else None."""
    op = _op(value)
    if op is None or op.name != "torch.aten.select_scatter":
        return None
    base = _op(op.operands[0])
    if base is None or base.name not in _ZEROS or op.operands[0].type != value.type:
        return None
    where = _dim_index(op)
    return None if where is None else (op, where[0], where[1])


def _dim_index(scatter):
    """The normalized (dim, index) of a `select_scatter`, or None when not constant."""
    shape = _shape(scatter.results[0])
    dim, index = _const_int(scatter.operands[2]), _const_int(scatter.operands[3])
    if shape is None or dim is None or index is None or not shape:
        return None
    rank = len(shape)
    dim = dim + rank if dim < 0 else dim
    if not 0 <= dim < rank:
        return None
    size = shape[dim]
    index = index + size if index < 0 else index
    if not 0 <= index < size:
        return None
    return dim, index


def _written(value, depth: int = 0):
    """(dim, indices) where `value` is zeros (no index written: dim None) or a chain of
    `select_scatter`s into zeros along one dim, else None: everything outside `indices` is
    zero."""
    op = _op(value)
    if op is None or depth > 64:
        return None
    if op.name in _ZEROS:
        return None, frozenset()
    if op.name != "torch.aten.select_scatter" or op.operands[0].type != value.type:
        return None
    where = _dim_index(op)
    below = _written(op.operands[0], depth + 1)
    if where is None or below is None:
        return None
    dim, index = where
    if below[1] and below[0] != dim:
        return None
    return dim, below[1] | {index}
