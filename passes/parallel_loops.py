"""ca-outline-parallel-loops, ca-bound-parallel-loops and ca-define-parallel-forks: a big
loop nest split over the OpenMP threads torch already runs (`torch.set_num_threads`).

camlir's loops ran on one core while PyTorch's elementwise and reduction kernels used them
all. These passes hand a parallel dimension of a large `linalg.generic` to libgomp's
`GOMP_parallel` (the OpenMP runtime torch and its MKL link, so the same thread pool and no
oversubscription), each thread running its own block of that dimension:

1. `ca-outline-parallel-loops` (memrefs, before the loops stage) moves such a generic into a
   function of its own that takes the block's bounds first, and calls it through a
   declared `fork` function that carries the dimension's extent.
2. `ca-bound-parallel-loops` (after the loops are made) makes that dimension's loop in the
   outlined function run from the first bound to the second.
3. `ca-define-parallel-forks` (LLVM dialect, after the conversion) defines each `fork`: it
   stores its arguments in a stack array and calls `GOMP_parallel` with a `task` function;
   each thread's task reads them back and calls the outlined function with its own block.

The operands keep their types: every thread sees the whole buffers and only its loop is
shorter, so reads in any order (a transpose, a broadcast) and `linalg.index` stay as they
were, and the vectorizer sees the same static shapes. Each output element is written by one
thread, and a reduction into it runs in the same order as on one thread: results are the
same bits for any thread count.
"""

import dataclasses
import math

from torch_mlir import ir
from torch_mlir.dialects import func

from camlir.dialects.ca.ir_helpers import (func_name, funcs, is_inside, is_kernel, live_values, memref_root,
                                           ops_matching, top_level_ops)

from .base import CAPass, PassFailure
from .fold_views import static_view_chain

_FORK_ATTR = "ca.parallel_fork"  # on a fork declaration: [body, extent, grain]
_LOOP_ATTR = "ca.parallel_loop"  # on an outlined function: [depth of the loop its bounds limit, its extent]
# at::get_num_threads(), torch's own count. libgomp's default (its nthreads ICV) is per
# thread: in a thread where torch has not yet run a parallel op it is the core count, not
# what torch.set_num_threads said (measured: 2 in a fresh thread after set_num_threads(1)).
# torch's call also sets that ICV for the calling thread, as its own parallel_for does.
TORCH_NUM_THREADS = "_ZN2at15get_num_threadsEv"
_RUNTIME = ("llvm.func @GOMP_parallel(!llvm.ptr, !llvm.ptr, i32, i32)",  # libgomp's, what the tasks call
            "llvm.func @omp_get_thread_num() -> i32",
            "llvm.func @omp_get_num_threads() -> i32",
            f"llvm.func @{TORCH_NUM_THREADS}() -> i32")


@dataclasses.dataclass(frozen=True)
class OutlineParallelLoops(CAPass):
    """Outlines each `linalg.generic` of a kernel whose loop nest has at least `min-elements`
    iterations and can be split along its first parallel dimension dK: every operand has a
    static shape, every output is indexed by dK directly (so two blocks never write one
    element), no input is another view of a buffer an output writes (the same value with
    the same map is fine: each element is read before it is written, in its own block), and
    the region only computes and reads. The generic moves, with its operands' types
    unchanged, into `@<kernel>__par<N>(%lo, %hi, ...)`, marked with the depth of dK's loop;
    the kernel calls `@<kernel>__par<N>_fork`, a declaration that says the body, dK's extent
    and the block granularity (16 when dK is the innermost loop, so blocks start on whole
    vectors and cache lines), for `ca-define-parallel-forks`.

    Before (`min-elements=4`):
    ```mlir
    func.func @k(%a: memref<8x4xf32>, %b: memref<8x4xf32>) attributes {ca.kernel} {
      linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
          ins(%a : memref<8x4xf32>) outs(%b : memref<8x4xf32>) {
      ^bb0(%x: f32, %y: f32):
        %e = math.exp %x : f32
        linalg.yield %e : f32
      }
      return
    }
    ```
    After:
    ```mlir
    func.func @k(%a: memref<8x4xf32>, %b: memref<8x4xf32>) attributes {ca.kernel} {
      call @k__par0_fork(%a, %b) : (memref<8x4xf32>, memref<8x4xf32>) -> ()
      return
    }
    func.func @k__par0(%lo: index, %hi: index, %a: memref<8x4xf32>, %b: memref<8x4xf32>)
        attributes {ca.parallel_loop = [0, 8]} {
      linalg.generic ... ins(%a : memref<8x4xf32>) outs(%b : memref<8x4xf32>) { ... }
      return
    }
    func.func private @k__par0_fork(memref<8x4xf32>, memref<8x4xf32>)
        attributes {ca.parallel_fork = [@k__par0, 8, 1]}
    ```
    """

    argument = "ca-outline-parallel-loops"
    summary = "Outline big parallel linalg.generics to run over the OpenMP threads"

    min_elements: int = 32768

    def run(self, module: ir.Operation) -> None:
        for fn in funcs(module, is_kernel):
            body = fn.regions[0].blocks[0]
            count = 0
            for op in [o.operation for o in body.operations]:
                plan = _plan(op, self.min_elements)
                if plan is not None:
                    _outline(fn, op, plan, f"{func_name(fn)}__par{count}")
                    count += 1


@dataclasses.dataclass(frozen=True)
class BoundParallelLoops(CAPass):
    """In each function `ca-outline-parallel-loops` made, the loop at the marked depth (of
    the one loop nest there, as the loops stage wrote it: `scf.for`s) runs from the
    function's first argument to its second instead of over the whole dimension. A loop
    nest of another shape is an error: running the whole dimension in every thread would
    add a reduction's inputs once per thread.

    Before:
    ```mlir
    func.func @k__par0(%lo: index, %hi: index, %a: memref<8x4xf32>, ...) attributes {ca.parallel_loop = [0, 8]} {
      scf.for %i = %c0 to %c8 step %c1 { ... }
    ```
    After:
    ```mlir
    func.func @k__par0(%lo: index, %hi: index, %a: memref<8x4xf32>, ...) {
      scf.for %i = %lo to %hi step %c1 { ... }
    ```
    """

    argument = "ca-bound-parallel-loops"
    summary = "Limit the split loop of each outlined loop nest to its thread's block"

    def run(self, module: ir.Operation) -> None:
        for fn in funcs(module, lambda f: _LOOP_ATTR in f.attributes):
            depth, extent = (ir.IntegerAttr(a).value for a in ir.ArrayAttr(fn.attributes[_LOOP_ATTR]))
            block = fn.regions[0].blocks[0]
            loop = _only_loop(block, fn)
            for _ in range(depth):
                loop = _only_loop(loop.regions[0].blocks[0], fn)
            bounds = [_constant(loop.operands[0]), _constant(loop.operands[1])]
            if bounds != [0, extent]:
                # Not the loop the outline meant: bounding it could write out of bounds.
                raise PassFailure(f"@{func_name(fn)}: the loop at depth {depth} runs over {bounds}, not "
                                  f"[0, {extent}]", fn)
            step = _constant(loop.operands[2])
            if step is None:
                raise PassFailure(f"@{func_name(fn)}: the loop at depth {depth} has no constant step", fn)
            if step > 1:  # vectorized: blocks must hold whole vectors
                _widen_grain(module, func_name(fn), step)
            loop.operands[0] = block.arguments[0]
            loop.operands[1] = block.arguments[1]
            del fn.attributes[_LOOP_ATTR]


def _widen_grain(module: ir.Operation, body: str, step: int) -> None:
    """Makes the blocks of `body`'s fork multiples of `step`. The vectorizer wrote the loop for
    [0, extent) with this step and may have proven its vector accesses in bounds from that:
    a block starting off the step's grid would write a vector past its end, into the next
    block (a race) or past the buffer (MobileViT's backward at 2 threads: heap corruption)."""
    for fork in funcs(module, lambda f: func_name(f) == body + "_fork"):
        info = list(ir.ArrayAttr(fork.attributes[_FORK_ATTR]))
        grain = ir.IntegerAttr(info[2]).value
        with fork.context:
            info[2] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), grain * step // math.gcd(grain, step))
            fork.attributes[_FORK_ATTR] = ir.ArrayAttr.get(info)


def _constant(v: ir.Value):
    owner = v.owner
    if isinstance(owner, ir.OpView) and owner.operation.name == "arith.constant":
        return ir.IntegerAttr(owner.operation.attributes["value"]).value
    return None


def _only_loop(block: ir.Block, fn: ir.Operation) -> ir.Operation:
    loops = [op.operation for op in block.operations if op.operation.name == "scf.for"]
    if len(loops) != 1:
        raise PassFailure(f"@{func_name(fn)} does not hold one loop nest "
                          f"({len(loops)} scf.for at one level)", fn)
    return loops[0]


@dataclasses.dataclass(frozen=True)
class DefineParallelForks(CAPass):
    """Defines every fork that `ca-outline-parallel-loops` declared, in the LLVM dialect: the
    fork stores its (expanded) arguments in a stack array and calls libgomp's
    `GOMP_parallel(task, array, threads, 0)` (threads: torch's `at::get_num_threads()`);
    each thread's task takes
    one block [lo, hi) of the split dimension (blocks of ceil(extent / threads) rounded up to
    the grain; a thread past the end does nothing) and calls the outlined function with
    lo, hi and the arguments as they were.

    Before:
    ```mlir
    llvm.func @k__par0_fork(!llvm.ptr, !llvm.ptr, i64, i64, i64, i64, i64)
        attributes {ca.parallel_fork = [@k__par0, 8, 1]}
    ```
    After (abridged):
    ```mlir
    llvm.func internal @k__par0_fork(%a0: !llvm.ptr, ...) {
      %ctx = llvm.alloca %n x i64 : (i64) -> !llvm.ptr
      llvm.store %a0, %slot0 : !llvm.ptr, !llvm.ptr
      ...
      %threads = llvm.call @_ZN2at15get_num_threadsEv() : () -> i32
      llvm.call @GOMP_parallel(%task, %ctx, %threads, %zero) : (!llvm.ptr, !llvm.ptr, i32, i32) -> ()
      llvm.return
    }
    llvm.func internal @k__par0_task(%ctx: !llvm.ptr) {
      // this thread's block [lo, hi) of the 8
      llvm.call @k__par0(%lo, %hi, %v0, ...) : (i64, i64, !llvm.ptr, ...) -> ()
      llvm.return
    }
    ```
    """

    argument = "ca-define-parallel-forks"
    summary = "Define the forks of ca-outline-parallel-loops with libgomp's GOMP_parallel"

    def run(self, module: ir.Operation) -> None:
        forks = [op for op in top_level_ops(module)
                 if op.name == "llvm.func" and _FORK_ATTR in op.attributes and not len(op.regions[0].blocks)]
        if not forks:
            return
        functions = {ir.StringAttr(op.attributes["sym_name"]).value: op
                     for op in top_level_ops(module) if op.name == "llvm.func"}
        # The new functions parse as a module of their own: it declares what they call.
        declared = list(_RUNTIME)
        defined = []
        for fork in forks:
            body, text = _fork_text(fork, functions)
            declared.append(f"llvm.func @{body}({', '.join(_llvm_inputs(_function_type(functions[body])))})")
            defined.append(text)
        with module.context, ir.Location.unknown():
            new = ir.Module.parse("module {\n" + "\n".join(declared + defined) + "\n}")
            for fork in forks:
                body = ir.FlatSymbolRefAttr(ir.ArrayAttr(fork.attributes[_FORK_ATTR])[0]).value
                # Only its task calls it: internal, LLVM inlines it there and drops the copy
                # (external, MobileNetV3's module took ~50% longer in LLVM than without the stage).
                if len(functions[body].regions[0].blocks):
                    functions[body].attributes["linkage"] = ir.Attribute.parse("#llvm.linkage<internal>")
                fork.erase()
            end = ir.InsertionPoint(module.regions[0].blocks[0])
            for op in top_level_ops(new):
                if ir.StringAttr(op.attributes["sym_name"]).value not in functions or len(op.regions[0].blocks):
                    end.insert(op.clone())


def _function_type(fn: ir.Operation) -> ir.Type:
    return ir.TypeAttr(fn.attributes["function_type"]).value


# --------------------------------------------------------------------------- outlining


@dataclasses.dataclass
class _Plan:
    depth: int             # the split dimension (its loop's depth in the nest)
    extent: int            # its trip count
    grain: int             # blocks are multiples of this
    values: list           # the generic's distinct operands, then what its region captures
    constants: list        # arith.constant ops the region reads (cloned into the body)


def _plan(op: ir.Operation, min_elements: int):
    """What outlining `op` takes, or None when it is not a generic that may be split."""
    if op.name != "linalg.generic":
        return None
    iterators = [str(t) for t in ir.ArrayAttr(op.attributes["iterator_types"])]
    parallel = [i for i, t in enumerate(iterators) if "parallel" in t]
    if not parallel:
        return None
    k = parallel[0]
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    n_outs = _count_outs(op)
    operands = list(op.operands)
    ranges = [None] * len(iterators)
    for value, amap in zip(operands, maps):
        if not isinstance(value.type, ir.MemRefType) or not ir.MemRefType(value.type).has_static_shape:
            return None
        shape = ir.MemRefType(value.type).shape
        for position, expr in enumerate(amap.results):
            if isinstance(expr, ir.AffineDimExpr):
                ranges[ir.AffineDimExpr(expr).position] = shape[position]
    if any(r is None for r in ranges) or ranges[k] < 2 or math.prod(ranges) < min_elements:
        return None
    outs, out_maps = operands[len(operands) - n_outs:], maps[len(maps) - n_outs:]
    if not all(_indexed_by(amap, k) for amap in out_maps):
        return None  # an output element that more than one block would write
    if not _region_only_reads(op):
        return None
    roots_out = {memref_root(v) for v in outs}
    for value, amap in zip(operands[:len(operands) - n_outs], maps):
        if memref_root(value) in roots_out:
            same = [m for v, m in zip(outs, out_maps) if v == value]
            if not same or any(str(m) != str(amap) for m in same):
                return None  # reads, in another order, a buffer it writes
    captured, _ = live_values([op], keep_outside=_is_constant)
    values = []
    for v in operands:
        if v not in values:
            values.append(v)
    region_reads = {v for inner in _region_ops(op) for v in inner.operands
                    if isinstance(v.type, ir.MemRefType) and not is_inside(_defining(v), op)}
    if any(memref_root(v) in roots_out for v in region_reads):
        return None  # the region loads from a buffer the generic writes: other blocks' rows
    for v in captured:
        if v in values:
            continue
        if not isinstance(v.type, (ir.MemRefType, ir.IntegerType, ir.FloatType, ir.IndexType)):
            return None
        values.append(v)
    constants = []
    for inner in _region_ops(op):
        for v in inner.operands:
            if _is_constant(v) and not is_inside(v.owner.operation, op) and v.owner.operation not in constants:
                constants.append(v.owner.operation)
    grain = 16 if k == len(iterators) - 1 else 1
    return _Plan(k, ranges[k], grain, values, constants)


def _count_outs(op: ir.Operation) -> int:
    segments = op.attributes["operandSegmentSizes"]
    return list(ir.DenseI32ArrayAttr(segments))[1]


def _indexed_by(amap: ir.AffineMap, k: int) -> bool:
    """Whether the map has dK itself among its results."""
    return any(isinstance(e, ir.AffineDimExpr) and ir.AffineDimExpr(e).position == k for e in amap.results)


def _region_ops(op: ir.Operation) -> list:
    """Every op nested in `op`'s regions, in pre-order."""
    return ops_matching(op, lambda inner: inner != op)


_PURE_PREFIXES = ("arith.", "math.", "linalg.yield", "linalg.index", "memref.load", "memref.dim",
                  "scf.", "affine.apply", "complex.")


def _region_only_reads(op: ir.Operation) -> bool:
    """Whether the region only computes and reads memory (no stores, no calls)."""
    return all(inner.name.startswith(_PURE_PREFIXES) and inner.name != "scf.execute_region"
               for inner in _region_ops(op))


def _is_constant(v: ir.Value) -> bool:
    owner = v.owner
    return isinstance(owner, ir.OpView) and owner.operation.name == "arith.constant"


def _defining(v: ir.Value) -> ir.Operation:
    """The op that defines `v`, or for a block argument the op whose region holds it."""
    owner = v.owner
    return owner.operation if isinstance(owner, ir.OpView) else owner.owner


def _outline(fn: ir.Operation, op: ir.Operation, plan: _Plan, name: str) -> None:
    # A static view (a slice, a reshape) is passed as the buffer it views and made again in
    # the body, so that ca-fold-views can fold it into the loads there (the vectorizer
    # refuses strided layouts; a view passed as an argument cannot be folded).
    passed, views = [], []
    for v in plan.values:
        root, chain = static_view_chain(v)
        if root not in passed:
            passed.append(root)
        views += [view for view in chain if view not in views]
    with op.context, op.location:
        types = [v.type for v in passed]
        index = ir.IndexType.get()
        body_fn = func.FuncOp(name, ([index, index] + types, []), ip=ir.InsertionPoint.after(fn))
        i64 = ir.IntegerType.get_signless(64)
        body_fn.operation.attributes[_LOOP_ATTR] = ir.ArrayAttr.get(
            [ir.IntegerAttr.get(i64, plan.depth), ir.IntegerAttr.get(i64, plan.extent)])
        block = body_fn.add_entry_block()
        with ir.InsertionPoint(block):
            mapping = {}
            for const in plan.constants:
                mapping[const.results[0]] = const.clone().results[0]
            for v, arg in zip(passed, list(block.arguments)[2:]):
                mapping[v] = arg
            for view in views:
                copy = view.clone()
                copy.operands[0] = mapping[view.operands[0]]
                mapping[view.results[0]] = copy.results[0]
            generic = op.clone()
            for inner in [generic] + _region_ops(generic):
                for i, v in enumerate(list(inner.operands)):
                    if v in mapping:
                        inner.operands[i] = mapping[v]
            func.ReturnOp([])
        fork = func.FuncOp(name + "_fork", (types, []), visibility="private", ip=ir.InsertionPoint.after(body_fn))
        fork.operation.attributes[_FORK_ATTR] = ir.ArrayAttr.get([
            ir.FlatSymbolRefAttr.get(name), ir.IntegerAttr.get(i64, plan.extent), ir.IntegerAttr.get(i64, plan.grain)])
        with ir.InsertionPoint(op):
            func.CallOp([], ir.FlatSymbolRefAttr.get(name + "_fork"), passed)
        op.erase()


# --------------------------------------------------------------------------- forks


def _fork_text(fork: ir.Operation, functions: dict) -> tuple:
    """(the name of the outlined function it runs, the LLVM-dialect text of one fork and its
    task)."""
    name = ir.StringAttr(fork.attributes["sym_name"]).value
    info = ir.ArrayAttr(fork.attributes[_FORK_ATTR])
    body = ir.FlatSymbolRefAttr(info[0]).value
    extent, grain = ir.IntegerAttr(info[1]).value, ir.IntegerAttr(info[2]).value
    arg_types = _llvm_inputs(_function_type(fork))
    target = functions.get(body)
    if target is None:
        raise PassFailure(f"ca-define-parallel-forks: @{name}'s body @{body} is not in the module", fork)
    body_types = _llvm_inputs(_function_type(target))
    if body_types != ["i64", "i64"] + arg_types:
        raise PassFailure(f"ca-define-parallel-forks: @{name} takes ({', '.join(arg_types)}) but @{body} "
                          f"takes ({', '.join(body_types)}), not the block bounds and those", fork)
    n = len(arg_types)
    params = ", ".join(f"%a{k}: {t}" for k, t in enumerate(arg_types))
    lines = [f"llvm.func internal @{name}({params}) {{",
             f"  %n = llvm.mlir.constant({max(n, 1)} : i64) : i64",
             "  %ctx = llvm.alloca %n x i64 : (i64) -> !llvm.ptr"]
    for k, t in enumerate(arg_types):
        lines += [f"  %s{k} = llvm.getelementptr %ctx[{k}] : (!llvm.ptr) -> !llvm.ptr, i64",
                  f"  llvm.store %a{k}, %s{k} : {t}, !llvm.ptr"]
    lines += [f"  %task = llvm.mlir.addressof @{body}_task : !llvm.ptr",
              "  %zero = llvm.mlir.constant(0 : i32) : i32",
              f"  %threads = llvm.call @{TORCH_NUM_THREADS}() : () -> i32",
              "  llvm.call @GOMP_parallel(%task, %ctx, %threads, %zero) : (!llvm.ptr, !llvm.ptr, i32, i32) -> ()",
              "  llvm.return", "}"]
    lines += [f"llvm.func internal @{body}_task(%ctx: !llvm.ptr) {{",
              "  %tid32 = llvm.call @omp_get_thread_num() : () -> i32",
              "  %nt32 = llvm.call @omp_get_num_threads() : () -> i32",
              "  %tid = llvm.sext %tid32 : i32 to i64",
              "  %nt = llvm.sext %nt32 : i32 to i64",
              f"  %ext = llvm.mlir.constant({extent} : i64) : i64",
              f"  %grain = llvm.mlir.constant({grain} : i64) : i64",
              "  %one = llvm.mlir.constant(1 : i64) : i64",
              # block = ceil(ceil(ext / nt) / grain) * grain; thread t takes
              # [t * block, (t + 1) * block) clipped to the extent
              "  %ntm1 = llvm.sub %nt, %one : i64",
              "  %e1 = llvm.add %ext, %ntm1 : i64",
              "  %per = llvm.sdiv %e1, %nt : i64",
              "  %gm1 = llvm.sub %grain, %one : i64",
              "  %p1 = llvm.add %per, %gm1 : i64",
              "  %p2 = llvm.sdiv %p1, %grain : i64",
              "  %block = llvm.mul %p2, %grain : i64",
              "  %lo0 = llvm.mul %tid, %block : i64",
              "  %lofar = llvm.icmp \"sgt\" %lo0, %ext : i64",
              "  %lo = llvm.select %lofar, %ext, %lo0 : i1, i64",
              "  %hi0 = llvm.add %lo, %block : i64",
              "  %hifar = llvm.icmp \"sgt\" %hi0, %ext : i64",
              "  %hi = llvm.select %hifar, %ext, %hi0 : i1, i64",
              "  %empty = llvm.icmp \"sge\" %lo, %hi : i64",
              "  llvm.cond_br %empty, ^done, ^work",
              "^work:"]
    call_args = ["%lo", "%hi"]
    for k, t in enumerate(arg_types):
        lines += [f"  %g{k} = llvm.getelementptr %ctx[{k}] : (!llvm.ptr) -> !llvm.ptr, i64",
                  f"  %v{k} = llvm.load %g{k} : !llvm.ptr -> {t}"]
        call_args.append(f"%v{k}")
    lines += [f"  llvm.call @{body}({', '.join(call_args)}) : ({', '.join(body_types)}) -> ()",
              "  llvm.br ^done",
              "^done:",
              "  llvm.return", "}"]
    return body, "\n".join(lines)


def _llvm_inputs(fn_type: ir.Type) -> list:
    text = str(fn_type)  # !llvm.func<void (ptr, ptr, i64, ...)>
    inner = text[text.index("(") + 1:text.rindex(")")]
    return ["!llvm.ptr" if p.strip() == "ptr" else p.strip() for p in _split_top(inner)] if inner.strip() else []


def _split_top(text: str) -> list:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts
