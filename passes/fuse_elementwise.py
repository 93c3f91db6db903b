"""ca-fuse-elementwise: fuse the elementwise code of lowered kernels into fewer loops."""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import tensor
from torch_mlir.passmanager import PassManager

from camlir.dialects.ca.ir_helpers import funcs, is_kernel, ops_matching, ops_named

from .base import CAPass
from .lazy_dialects import linalg
from .sibling_loops import merge_siblings

# Ops that become one loop nest (or one library call) each: what "kernel count" counts.
STRUCTURED = ("linalg.generic", "linalg.matmul", "linalg.batch_matmul", "linalg.transpose",
              "linalg.fill", "linalg.copy", "linalg.broadcast", "linalg.map", "linalg.reduce",
              "linalg.conv_2d_nchw_fchw", "linalg.pooling_nchw_max", "tm_tensor.scatter")


def count_kernels(module: ir.Operation) -> int:
    """Loop nests and library calls in the `ca.kernel` functions of `module`. A zero fill
    whose only user is a matmul is not counted: it becomes the BLAS call's `beta = 0`."""
    def counted(op):
        if op.name == "linalg.fill" and _only_feeds_matmuls(op):
            return False
        return op.name in STRUCTURED or op.name.startswith(("linalg.conv", "linalg.pooling", "linalg.depthwise"))

    return sum(len(ops_matching(fn, counted)) for fn in _kernels(module))


def _only_feeds_matmuls(fill: ir.Operation) -> bool:
    users = [u.owner.name for u in fill.results[0].uses]
    return bool(users) and all(u in ("linalg.matmul", "linalg.batch_matmul") for u in users)


@dataclasses.dataclass(frozen=True)
class FuseElementwise(CAPass):
    """Fuses elementwise producers into their consumers and scalar epilogues into matmuls,
    in every `ca.kernel` function (linalg on tensors).

    Steps, each for a reason:
    1. Unshare initial values: CSE merges identical `linalg.fill`s, so two matmuls end up
       accumulating into "the same" zero tensor and bufferization has to copy it. Each
       consumer gets its own fill (a fill costs nothing extra: it is fused into `beta = 0`
       of the BLAS call later).
    2. Recompute cheap producers: an elementwise generic of a few adds, multiplies,
       compares and selects whose users are all generics gets one copy per user, where
       that moves fewer bytes than writing it out and reading it back: with `k` full-size
       inputs and `m` users, when `k * m <= k + 1 + m` (read `k` in each user, against read
       `k`, write 1, read it `m` times). A batch norm's `x - mean` (k = 1) feeding its
       two reductions and its output then costs no tensor of its own: the CNN's batch-norm
       backward kernel wrote and re-read two 2 MB temporaries (docs/speed.md).
    3. Upstream `linalg-fuse-elementwise-ops`, which fuses a producer into its consumer only
       when the consumer is the producer's single user: an expensive producer (GELU's
       backward: exp and erf) is never recomputed for several consumers, and no value is
       kept alive longer than eager PyTorch would keep it. Broadcasts (`expand`) and the
       math of inlined hooks are generics too, so they fuse the same way.
    4. Sibling loops (`sibling_loops.py`): two independent generics over the same loops that
       read a common tensor become one generic with both results, so a batch norm's two
       reductions over (N, H, W) read their inputs once.
    5. Scalar epilogues into matmuls: `x * c` applied to the only use of a matmul that
       starts from zero becomes the matmul's `ca.alpha` attribute (the BLAS `alpha`). This
       is how a hook such as `lambda g: g * 0.5` on a weight costs nothing: eager pays a
       full pass over the gradient for it.
    6. Transposes into matmuls: a `linalg.transpose` feeding a matmul operand becomes a
       transposed indexing map on the matmul; BLAS reads the operand with the transpose
       flag, as eager PyTorch does, instead of copying it. So does a transpose of more dims
       that a `collapse_shape` makes 2-D, where it swaps two runs of dims (a weight
       gradient's `t(view(g))` of a 3-D `g`): the matmul reads `g` regrouped. A
       `batch_matmul` operand transposed in its last two dims (a bmm's backward) likewise.
    7. Canonicalize, which drops the transposes step 6 left without users.

    Before:
    ```mlir
    %b = linalg.generic {maps = [()->(), (i,j)->(i,j)]} ins(%s : tensor<f32>) outs(%e) { yield %in }
    %g = linalg.generic {maps = [id, id, id]} ins(%b, %x) outs(%e) { %m = arith.mulf %in, %in_1 ; yield %m }
    %z = linalg.fill ins(%c0) outs(%e2)
    %w = linalg.matmul ins(%g, %y) outs(%z)
    %h = linalg.generic {maps = [id, id]} ins(%w) outs(%e2) { %m = arith.mulf %in, %c05 ; yield %m }
    ```
    After:
    ```mlir
    %g = linalg.generic {maps = [()->(), id, id]} ins(%s, %x) outs(%e) { %m = arith.mulf %in, %in_1 ; yield %m }
    %z = linalg.fill ins(%c0) outs(%e2)
    %w = linalg.matmul {ca.alpha = 5.000000e-01 : f32} ins(%g, %y) outs(%z)
    ```
    """

    argument = "ca-fuse-elementwise"
    summary = "Fuse elementwise producers, broadcasts and scalar epilogues in ca.kernel functions"

    epilogues: bool = True
    recompute: bool = True
    siblings: bool = True

    def run(self, module: ir.Operation) -> None:
        if not _kernels(module):
            return
        with module.context, ir.Location.unknown():
            _unshare_inits(module)
            if self.recompute:
                recompute_cheap_producers(module)
            hidden = _hide_contractions(module)
            _run(module, "builtin.module(func.func(linalg-fuse-elementwise-ops),canonicalize,cse)")
            _restore_contractions(module, hidden)
            if self.siblings:
                for fn in _kernels(module):
                    merge_siblings(fn)
            fold_transposes(module)
            if self.epilogues:
                while _fold_scalar_epilogue(module):
                    pass
            _unshare_inits(module)  # the last canonicalize/cse may have merged fills again
        _run(module, "builtin.module(canonicalize)")
        with module.context, ir.Location.unknown():
            _unshare_inits(module)


_CONTRACTIONS = ("linalg.matmul", "linalg.batch_matmul")
_HIDDEN = "ca.hidden_contraction"


def _hide_contractions(module: ir.Operation) -> int:
    """Swaps matmuls for an opaque placeholder while upstream fusion runs.

    Upstream fusion also pushes reshapes through linalg ops "by expansion", and for a named
    matmul next to a `view` that means rewriting it as a higher-rank `linalg.generic`: a
    contraction no BLAS call can take, which then ran as naive loops (the transformer
    backward got 5x slower than eager). The placeholder keeps operands, result types and
    attributes; elementwise producers and consumers around it still fuse."""
    count = 0
    for fn in _kernels(module):
        for op in ops_named(fn, *_CONTRACTIONS):
            named = [op.attributes[i] for i in range(len(op.attributes))]
            attrs = {a.name: a.attr for a in named}
            attrs["ca.op"] = ir.StringAttr.get(op.name)
            with ir.InsertionPoint(op), op.location:
                new = ir.Operation.create(_HIDDEN, results=[r.type for r in op.results],
                                          operands=list(op.operands), attributes=attrs)
            op.results[0].replace_all_uses_with(new.results[0])
            op.erase()
            count += 1
    return count


def _restore_contractions(module: ir.Operation, count: int) -> None:
    if not count:
        return
    for fn in _kernels(module):
        for op in ops_named(fn, _HIDDEN):
            name = ir.StringAttr(op.attributes["ca.op"]).value
            a, b, c = op.operands
            with ir.InsertionPoint(op), op.location:
                maps = contraction_maps(op, name) if "indexing_maps" in op.attributes else None
                value = _build(name)(a, b, outs=[c], indexing_maps=maps)
            new = value.owner
            if "ca.alpha" in op.attributes:
                new.attributes["ca.alpha"] = op.attributes["ca.alpha"]
            op.results[0].replace_all_uses_with(value)
            op.erase()


def _kernels(module: ir.Operation) -> list:
    return funcs(module, is_kernel)


def _run(module: ir.Operation, pipeline: str) -> None:
    PassManager.parse(pipeline, module.context).run(module)


# Body ops cheap enough to compute again in each user: a cycle or two per element, no
# division, no transcendental (those stay materialized: see step 3 of FuseElementwise).
_CHEAP = frozenset({
    "arith.addf", "arith.subf", "arith.mulf", "arith.negf", "arith.cmpf", "arith.select",
    "arith.maximumf", "arith.minimumf", "arith.maxnumf", "arith.minnumf", "arith.extf",
    "arith.truncf", "arith.addi", "arith.subi", "arith.muli", "arith.cmpi", "arith.andi",
    "arith.ori", "arith.xori", "arith.constant", "arith.uitofp", "arith.sitofp", "linalg.yield"})
_MAX_CHEAP_OPS = 6


def recompute_cheap_producers(module: ir.Operation) -> int:
    """Step 2 of `FuseElementwise`: gives each user of a cheap elementwise generic its own
    copy where that moves fewer bytes (see the class docstring). Returns how many copies
    were made. Users come before producers (the walk goes backwards), so a chain such as
    `le` -> `where` is copied whole: each copy of `where` is a new user of `le`."""
    made = 0
    for fn in _kernels(module):
        for g in reversed(ops_named(fn, "linalg.generic")):
            users = _recomputable_users(g)
            if users is None:
                continue
            for use in users[1:]:
                with ir.InsertionPoint(use.owner):
                    clone = g.clone()
                use.owner.operands[use.operand_number] = clone.results[0]
                made += 1
    return made


def _recomputable_users(g: ir.Operation):
    """The uses of `g`'s result, when each may get a copy of `g`; else None."""
    if len(g.results) != 1 or len(g.regions[0].blocks) != 1:
        return None
    if any(not _parallel(t) for t in ir.ArrayAttr(g.attributes["iterator_types"])):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(g.attributes["indexing_maps"])]
    n_in = len(g.operands) - 1
    out_type = ir.RankedTensorType(g.results[0].type)
    if not out_type.has_static_shape or str(maps[-1]) != str(ir.AffineMap.get_identity(out_type.rank)):
        return None
    body = [op.operation for op in g.regions[0].blocks[0].operations]
    if len(body) > _MAX_CHEAP_OPS or any(op.name not in _CHEAP for op in body):
        return None
    uses = list(g.results[0].uses)
    m = len(uses)
    if m < 2:
        return None
    for use in uses:
        owner = use.owner
        if owner.name != "linalg.generic" or use.operand_number >= len(owner.operands) - len(owner.results):
            return None  # a return, a matmul, or the init (outs) of a generic: keep the tensor
    full = sum(1 for i in range(n_in)
               if isinstance(g.operands[i].type, ir.RankedTensorType)
               and ir.RankedTensorType(g.operands[i].type).shape == out_type.shape)
    if full * m > full + 1 + m:
        return None
    return uses


def _parallel(t) -> bool:
    return str(t) in ('"parallel"', "#linalg.iterator_type<parallel>")


def _unshare_inits(module: ir.Operation) -> None:
    """Gives every DPS consumer of a multiply-used `linalg.fill`/`tensor.empty` its own."""
    for fn in _kernels(module):
        for init in ops_named(fn, "linalg.fill", "tensor.empty"):
            uses = list(init.results[0].uses)
            if len(uses) < 2:
                continue
            for use in uses[1:]:
                owner = use.owner
                if owner.name not in STRUCTURED:
                    continue
                with ir.InsertionPoint(owner):
                    clone = _clone_chain(init)
                owner.operands[use.operand_number] = clone.results[0]


def _clone_chain(init: ir.Operation) -> ir.Operation:
    """Clones a fill together with its own `tensor.empty` (so that one is not shared either)."""
    if init.name == "linalg.fill":
        empty = init.operands[1].owner
        clone = init.clone()
        if isinstance(empty, ir.OpView) and empty.operation.name == "tensor.empty":
            new_empty = empty.operation.clone()
            new_empty.move_before(clone)
            clone.operands[1] = new_empty.results[0]
        return clone
    return init.clone()


def _fold_scalar_epilogue(module: ir.Operation) -> bool:
    for fn in _kernels(module):
        for g in ops_named(fn, "linalg.generic"):
            hit = _epilogue_of_matmul(g)
            if hit is None:
                continue
            mm, factor = hit
            old = ir.FloatAttr(mm.attributes["ca.alpha"]).value if "ca.alpha" in mm.attributes else 1.0
            elem = ir.RankedTensorType(mm.results[0].type).element_type
            mm.attributes["ca.alpha"] = ir.FloatAttr.get(elem, old * factor)
            g.results[0].replace_all_uses_with(mm.results[0])
            g.erase()
            return True
    return False


def _epilogue_of_matmul(g: ir.Operation):
    """(matmul, c) when `g` computes `matmul_result * c` elementwise and is its only user."""
    if len(g.results) != 1 or len(g.operands) != 2:
        return None
    if any(not _parallel(t) for t in ir.ArrayAttr(g.attributes["iterator_types"])):
        return None
    maps = [str(ir.AffineMapAttr(m).value) for m in ir.ArrayAttr(g.attributes["indexing_maps"])]
    if len(set(maps)) != 1:
        return None
    src = g.operands[0]
    mm = src.owner
    if not isinstance(mm, ir.OpView) or mm.operation.name != "linalg.matmul":
        return None
    mm = mm.operation
    if len(list(src.uses)) != 1 or src.type != g.results[0].type or not _starts_from_zero(mm):
        return None
    body = g.regions[0].blocks[0]
    ops = [o.operation for o in body.operations]
    if len(ops) != 2 or ops[0].name != "arith.mulf" or ops[1].name != "linalg.yield":
        return None
    if ops[1].operands[0] != ops[0].results[0]:
        return None
    a, b = ops[0].operands
    arg = body.arguments[0]
    other = b if a == arg else a if b == arg else None
    if other is None:
        return None
    factor = _constant_float(other)
    return None if factor is None else (mm, factor)


def _starts_from_zero(mm: ir.Operation) -> bool:
    init = mm.operands[2].owner
    if not isinstance(init, ir.OpView) or init.operation.name != "linalg.fill":
        return False
    return _constant_float(init.operation.operands[0]) == 0.0


def _constant_float(v: ir.Value):
    owner = v.owner
    if not isinstance(owner, ir.OpView) or owner.operation.name != "arith.constant":
        return None
    attr = owner.operation.attributes["value"]
    return ir.FloatAttr(attr).value if isinstance(attr, ir.FloatAttr) else None


def _permutation(op) -> list:
    return [int(x) for x in str(op.attributes["permutation"]).removeprefix("array<i64:").rstrip(">").split(",")]


def _is_2d_transpose(op) -> bool:
    return op.name == "linalg.transpose" and _permutation(op) == [1, 0]


def _reassociation(op) -> list:
    return [[ir.IntegerAttr(i).value for i in ir.ArrayAttr(group)]
            for group in ir.ArrayAttr(op.attributes["reassociation"])]


def _untransposed(v: ir.Value):
    """`v` as the 2-D transpose of a value that is cheaper to make, or None:
    - the operand of a 2-D `linalg.transpose` (no copy);
    - for `collapse_shape(transpose(x, p), [rows, cols])`, `x`'s dims in the order `q`
      (`p` with its `cols` dims moved in front of its `rows` dims), collapsed to
      `[cols, rows]`. Where `q` is the identity that is `x` regrouped, no copy: a weight
      gradient's `t(view(g))` of a 3-D `g` (W3's linear layers; the transpose, copied, cost
      5.4 ms of a 12.4 ms kernel). Else it is taken only where `q` keeps `x`'s innermost
      dim innermost and `p` does not: a copy in contiguous runs instead of a strided one
      (W3's in-projection weight gradient, `p` = [0, 4, 3, 1, 2] on 3x128x8x1x256)."""
    owner = v.owner
    if not isinstance(owner, ir.OpView):
        return None
    op = owner.operation
    if _is_2d_transpose(op):
        return op.operands[0]
    if op.name != "tensor.collapse_shape":
        return None
    groups = _reassociation(op)
    inner = op.operands[0].owner
    if len(groups) != 2 or not isinstance(inner, ir.OpView) or inner.operation.name != "linalg.transpose":
        return None
    transpose = inner.operation
    perm = _permutation(transpose)
    x = transpose.operands[0]
    x_type = ir.RankedTensorType(x.type)
    shape = list(x_type.shape)
    if any(d == ir.ShapedType.get_dynamic_size() for d in shape):
        return None
    n, k = len(perm), len(groups[0])
    order = perm[k:] + perm[:k]
    if order != list(range(n)) and not (_keeps_innermost(order, shape) and not _keeps_innermost(perm, shape)):
        return None
    rows = cols = 1
    for d in order[:n - k]:
        rows *= shape[d]
    for d in order[n - k:]:
        cols *= shape[d]
    i64 = ir.IntegerType.get_signless(64)
    with op.context, op.location, ir.InsertionPoint(op):
        if order != list(range(n)):
            init = tensor.EmptyOp([shape[d] for d in order], x_type.element_type).result
            x = linalg.transpose(x, outs=[init], permutation=order)
        regroup = ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, i) for i in group])
                                    for group in (range(n - k), range(n - k, n))])
        target = ir.RankedTensorType.get([rows, cols], x_type.element_type)
        return tensor.CollapseShapeOp(target, x, regroup).result


def _keeps_innermost(perm: list, shape: list) -> bool:
    """Whether `transpose(x, perm)` of an `x` of `shape` keeps its innermost dim (size 1
    dims aside) innermost: then it copies contiguous runs, else it reads with a stride."""
    real = [d for d in range(len(shape)) if shape[d] != 1]
    if not real:
        return True
    placed = [d for d in perm if shape[d] != 1]
    return placed[-1] == real[-1]


def fold_transposes(module: ir.Module) -> int:
    """`matmul(transpose(a), b)` -> `matmul(a, b)` with a transposed map on the first operand
    (either operand; a transpose of more dims behind a `collapse_shape` too, see
    `_untransposed`). The same for a `batch_matmul` operand transposed in its last two dims:
    a bmm's backward multiplies by its saved operands so (BERT's attention: 12 copies of
    16x64x64 per backward before). Returns how many transposes were folded."""
    folded = 0
    for mm in ops_named(module, *_CONTRACTIONS):
        name = mm.name
        maps = contraction_maps(mm, name)
        untransposed = _untransposed if name == "linalg.matmul" else _batch_untransposed
        ins = list(mm.operands[:2])
        changed = False
        for i in (0, 1):
            source = untransposed(ins[i])
            if source is not None:
                ins[i] = source
                maps[i] = _swap_last(maps[i])
                changed = True
        if not changed:
            continue
        with mm.context, mm.location, ir.InsertionPoint(mm):
            new = _build(name)(ins[0], ins[1], outs=[mm.operands[2]], indexing_maps=maps)
        if "ca.alpha" in mm.attributes:  # a folded epilogue: part of the matmul's meaning
            new.owner.attributes["ca.alpha"] = mm.attributes["ca.alpha"]
        mm.results[0].replace_all_uses_with(new)
        mm.erase()
        folded += 1
    return folded


def _batch_untransposed(v: ir.Value):
    """The operand of a `linalg.transpose` of `v`'s last two dims (a batch of matrices), or None."""
    owner = v.owner
    if (isinstance(owner, ir.OpView) and owner.operation.name == "linalg.transpose"
            and _permutation(owner.operation) == [0, 2, 1]):
        return owner.operation.operands[0]
    return None


def _build(name: str):
    """The builder of the contraction `name` (`linalg.matmul`, `linalg.batch_matmul`)."""
    return {"linalg.matmul": linalg.matmul, "linalg.batch_matmul": linalg.batch_matmul}[name]


def contraction_maps(mm, name: str = "linalg.matmul") -> list:
    """The three `ir.AffineMap`s (A, B, C) of a `linalg.matmul` or `linalg.batch_matmul`
    (`name`): its `indexing_maps` attribute when it has one (e.g. a transposed operand), else
    the default `(m, n, k) -> (m, k)`, `-> (k, n)`, `-> (m, n)`, with a leading batch dim
    for a batch_matmul."""
    if "indexing_maps" in mm.attributes:
        return [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(mm.attributes["indexing_maps"])]
    batch = 1 if name == "linalg.batch_matmul" else 0
    d = [ir.AffineDimExpr.get(i) for i in range(3 + batch)]
    b, (m, n, k) = d[:batch], d[batch:]
    return [ir.AffineMap.get(3 + batch, 0, b + [m, k]), ir.AffineMap.get(3 + batch, 0, b + [k, n]),
            ir.AffineMap.get(3 + batch, 0, b + [m, n])]


def _swap_last(m) -> "ir.AffineMap":
    """`m` with its last two results swapped: the map of its operand's transpose."""
    exprs = list(m.results)
    return ir.AffineMap.get(m.n_dims, m.n_symbols, exprs[:-2] + [exprs[-1], exprs[-2]])
