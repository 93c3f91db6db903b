"""ca-gpu-parallel-dims-first and ca-gpu-flatten-parallel: the loop shapes the gpu
pipeline maps onto blocks and threads.

Why: upstream `convert-linalg-to-parallel-loops` nests loops in the op's dim order:
parallel dims become an `scf.parallel`, reduction dims `scf.for`. A column sum
(`["reduction", "parallel"]`, every bias gradient) comes out as `scf.for { scf.parallel }`,
and `convert-parallel-loops-to-gpu` then launches one kernel per row from a host loop. With
the parallel dims first, every linalg op is one `scf.parallel` (one thread per output
element) around its serial reduction loops. `gpu-map-parallel-loops` maps at most three
dims and `scf-parallel-loop-tiling` takes one tile size list for every loop, whatever its
rank; a loop flattened to one dim gets the same tiling (256 threads a block) at any rank.
Code that no parallel loop holds (a full reduction to a scalar, a 0-d op) would run on the
host against device memory: it is wrapped in a one-iteration `scf.parallel`, so it becomes
a one-thread kernel.
"""

import dataclasses
import re

from torch_mlir import ir
from torch_mlir.dialects import arith, scf

from camlir.dialects.ca.ir_helpers import ops_named

from .base import CAPass, PassFailure

_DIM = re.compile(r"\bd(\d+)\b")


@dataclasses.dataclass(frozen=True)
class ParallelDimsFirst(CAPass):
    """Reorders the iteration dims of every `linalg.generic`: parallel dims first, in their
    order, then the reduction dims.

    The indexing maps are rewritten for the new dim order and `linalg.index` ops in the body
    renumbered; what the op computes does not change (each output element still sums its
    reduction in the same order). Run on generic ops (`linalg-generalize-named-ops` first).

    Before:
    ```mlir
    linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (0, d1)>],
                    iterator_types = ["reduction", "parallel"]}
        ins(%x : memref<8x4xf32>) outs(%s : memref<1x4xf32>) { ... }
    ```
    After:
    ```mlir
    linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d1, d0)>, affine_map<(d0, d1) -> (0, d0)>],
                    iterator_types = ["parallel", "reduction"]}
        ins(%x : memref<8x4xf32>) outs(%s : memref<1x4xf32>) { ... }
    ```
    """

    argument = "ca-gpu-parallel-dims-first"
    summary = "Reorder linalg.generic iteration dims: parallel dims outermost"

    def run(self, module: ir.Operation) -> None:
        for op in ops_named(module, "linalg.generic"):
            kinds = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
            order = ([i for i, k in enumerate(kinds) if "parallel" in k]
                     + [i for i, k in enumerate(kinds) if "parallel" not in k])
            if order == list(range(len(kinds))):
                continue
            new_of_old = {old: new for new, old in enumerate(order)}
            maps = []
            for attr in ir.ArrayAttr(op.attributes["indexing_maps"]):
                text = str(attr)
                head, arrow, results = text.partition("->")
                results = _DIM.sub(lambda m: f"d{new_of_old[int(m.group(1))]}", results)
                maps.append(ir.Attribute.parse(head + arrow + results))
            op.attributes["indexing_maps"] = ir.ArrayAttr.get(maps)
            op.attributes["iterator_types"] = ir.ArrayAttr.get(
                [ir.ArrayAttr(op.attributes["iterator_types"])[old] for old in order])
            for index in ops_named(op, "linalg.index"):
                old = ir.IntegerAttr(index.attributes["dim"]).value
                index.attributes["dim"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), new_of_old[old])


# Ops that may stay on the host side of a gpu program: buffers, views, constants, calls
# (the matmuls, run by the runtime through torch), and the loops that become launches.
HOST_OPS = frozenset({
    "arith.constant", "memref.alloc", "memref.dealloc", "memref.cast", "memref.expand_shape",
    "memref.collapse_shape", "memref.transpose", "memref.subview", "memref.reinterpret_cast",
    "memref.get_global", "func.call", "func.return", "scf.parallel",
})


@dataclasses.dataclass(frozen=True)
class FlattenParallel(CAPass):
    """Makes every top-level `scf.parallel` of a function one-dimensional, and wraps code
    left outside any parallel loop in a one-iteration `scf.parallel`.

    A loop over `(0, 0) to (M, N) step (1, 1)` becomes one over `0 to M*N`, its indices
    recovered with `divui`/`remui` (row-major, so neighbouring threads touch neighbouring
    elements of the innermost dim). A maximal run of ops that are not buffers, views,
    constants, calls or parallel loops (`scf.for` nests of a full reduction, stores into
    0-d buffers) moves into `scf.parallel (%i) = (%c0) to (%c1) step (%c1)`; a value such a
    run defines and code after it uses fails the pass. Functions inside `gpu.module`s are
    left alone.

    Before:
    ```mlir
    scf.parallel (%i, %j) = (%c0, %c0) to (%c8, %c4) step (%c1, %c1) {
      memref.store %v, %out[%i, %j] : memref<8x4xf32>
    }
    ```
    After:
    ```mlir
    %c32 = arith.constant 32 : index
    scf.parallel (%k) = (%c0) to (%c32) step (%c1) {
      %i = arith.divui %k, %c4 : index
      %j = arith.remui %k, %c4 : index
      memref.store %v, %out[%i, %j] : memref<8x4xf32>
    }
    ```
    """

    argument = "ca-gpu-flatten-parallel"
    summary = "Flatten top-level scf.parallel loops to one dim; wrap serial code in a one-iteration loop"

    def run(self, module: ir.Operation) -> None:
        for fn in ops_named(module, "func.func"):
            if fn.parent is not None and fn.parent.name == "gpu.module":
                continue
            if not fn.regions[0].blocks:
                continue
            block = fn.regions[0].blocks[0]
            for op in list(block.operations):
                if op.operation.name == "scf.parallel":
                    _flatten(op.operation)
            _wrap_serial_runs(block)


def _const_index(value: ir.Value):
    owner = getattr(value.owner, "operation", value.owner)  # an OpView or an Operation
    if isinstance(owner, ir.Operation) and owner.name == "arith.constant":
        return ir.IntegerAttr(owner.attributes["value"]).value
    return None


def _flatten(loop: ir.Operation) -> None:
    n = len(loop.regions[0].blocks[0].arguments)
    lbs, ubs, steps = (list(loop.operands[i * n:(i + 1) * n]) for i in range(3))
    extents = [_const_index(v) for v in ubs]
    if n < 2 or len(loop.results) or any(_const_index(v) != 0 for v in lbs) \
            or any(_const_index(v) != 1 for v in steps) or None in extents:
        return  # dynamic bounds: left as it is (gpu-map-parallel-loops maps up to three dims)
    with ir.InsertionPoint(loop), loop.location:
        product = 1
        for e in extents:
            product *= e
        total = arith.constant(ir.IndexType.get(), product)
        flat = scf.ParallelOp([], [lbs[0]], [total], [steps[0]], [])
        body = flat.regions[0].blocks.append(ir.IndexType.get())
    old = loop.regions[0].blocks[0]
    with ir.InsertionPoint(body), loop.location:
        terminator = scf.ReduceOp([], 0)
    with ir.InsertionPoint(terminator), loop.location:
        rest = body.arguments[0]
        indices = [None] * n
        for d in range(n - 1, 0, -1):
            indices[d] = arith.remui(rest, ubs[d])
            rest = arith.divui(rest, ubs[d])
        indices[0] = rest
    for arg, index in zip(old.arguments, indices):
        arg.replace_all_uses_with(index)
    for op in list(old.operations)[:-1]:  # all but the scf.reduce
        op.operation.move_before(terminator.operation)
    loop.erase()


def _wrap_serial_runs(block: ir.Block) -> None:
    runs, current = [], []
    for op in block.operations:
        op = op.operation
        if op.name in HOST_OPS:
            if current:
                runs.append(current)
                current = []
        else:
            current.append(op)
    if current:
        runs.append(current)
    for run in runs:
        inside = set()
        for op in run:
            inside.add(op)
            for nested in _nested_ops(op):
                inside.add(nested)
        for op in run:
            for result in op.results:
                for use in result.uses:
                    if use.owner not in inside:
                        raise PassFailure("a value computed outside any parallel loop is used on the host", op)
        with ir.InsertionPoint(run[0]), run[0].location:
            zero = arith.constant(ir.IndexType.get(), 0)
            one = arith.constant(ir.IndexType.get(), 1)
            loop = scf.ParallelOp([], [zero], [one], [one], [])
            body = loop.regions[0].blocks.append(ir.IndexType.get())
        with ir.InsertionPoint(body), run[0].location:
            terminator = scf.ReduceOp([], 0)
        for op in run:
            op.move_before(terminator.operation)


def _nested_ops(op: ir.Operation):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _nested_ops(inner.operation)
