"""ca-outline-parallel-loops and ca-define-parallel-forks: a big loop nest split over the
OpenMP threads torch already runs (`torch.set_num_threads`).

camlir's loops ran on one core while PyTorch's elementwise and reduction kernels used them
all. The two passes hand the outermost parallel dimension of a large `linalg.generic` to
libgomp's `GOMP_parallel` (the OpenMP runtime torch and its MKL link, so the same thread
pool and no oversubscription), each thread running its own contiguous block of rows:

1. `ca-outline-parallel-loops` (memrefs, before the loops stage) moves such a generic into a
   function of its own whose chunked operands have a dynamic outer dimension, and calls it
   through a declared `fork` function that carries what the second pass needs to know.
2. `ca-define-parallel-forks` (LLVM dialect, after the conversion) defines each `fork`: it
   stores its arguments (the expanded memref descriptors and scalars) in a stack array and
   calls `GOMP_parallel` with a `task` function; each thread's task reads them back, moves
   the chunked operands' pointers to its first row, sets their outer size to its row count,
   and calls the outlined function.
"""

import dataclasses
import math

from torch_mlir import ir
from torch_mlir.dialects import func

from camlir.dialects.ca.ir_helpers import func_name, funcs, is_kernel, live_values, top_level_ops

from .base import CAPass, PassFailure

_FORK_ATTR = "ca.parallel_fork"  # on a fork declaration: [body, extent, [[chunked, row bytes], ...]]
_VIEWS = ("memref.expand_shape", "memref.collapse_shape", "memref.subview", "memref.reinterpret_cast",
          "memref.cast", "memref.transpose", "memref.view")
_RUNTIME = {  # libgomp's entry points the tasks call
    "GOMP_parallel": "!llvm.func<void (ptr, ptr, i32, i32)>",
    "omp_get_thread_num": "!llvm.func<i32 ()>",
    "omp_get_num_threads": "!llvm.func<i32 ()>",
}
RUNTIME_SYMBOLS = tuple(_RUNTIME)


@dataclasses.dataclass(frozen=True)
class OutlineParallelLoops(CAPass):
    """Outlines each `linalg.generic` of a kernel whose loop nest has at least `min-elements`
    iterations and can be split along its first loop dimension: that dimension is
    `parallel`, every operand is an identity-layout memref of static shape that either does
    not use it or uses it, alone, as its outer index, every output does, and nothing else
    in the kernel can alias an output (no region op writes memory either). The generic
    moves into `@<kernel>__par<N>`, where the chunked operands' outer dimension is dynamic,
    and the kernel calls `@<kernel>__par<N>_fork` instead, a declaration that
    `ca-define-parallel-forks` defines after the LLVM conversion.

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
    func.func @k__par0(%a: memref<?x4xf32>, %b: memref<?x4xf32>) {
      linalg.generic ... ins(%a : memref<?x4xf32>) outs(%b : memref<?x4xf32>) { ... }
      return
    }
    func.func private @k__par0_fork(memref<8x4xf32>, memref<8x4xf32>)
        attributes {ca.parallel_fork = [@k__par0, 8, [[1, 16], [1, 16]]]}
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
                    _outline(module, fn, op, plan, f"{func_name(fn)}__par{count}")
                    count += 1


@dataclasses.dataclass(frozen=True)
class DefineParallelForks(CAPass):
    """Defines every fork that `ca-outline-parallel-loops` declared, in the LLVM dialect: the
    fork stores its (expanded) arguments in a stack array and calls libgomp's
    `GOMP_parallel(task, array, 0, 0)` (0: torch's thread count); the task splits the outer
    extent into one block of rows per thread, moves each chunked operand's aligned pointer
    to its first row and sets its outer size, and calls the outlined function.

    Before:
    ```mlir
    llvm.func @k__par0_fork(!llvm.ptr, !llvm.ptr, i64, i64, i64, i64, i64, ...)
        attributes {ca.parallel_fork = [@k__par0, 8, [[1, 16], [1, 16]]]}
    ```
    After (abridged):
    ```mlir
    llvm.func @k__par0_fork(%a0: !llvm.ptr, ...) {
      %ctx = llvm.alloca %n x i64 : (i64) -> !llvm.ptr
      llvm.store %a0, %slot0 : !llvm.ptr, !llvm.ptr
      ...
      llvm.call @GOMP_parallel(%task, %ctx, %zero, %zero) : (!llvm.ptr, !llvm.ptr, i32, i32) -> ()
      llvm.return
    }
    llvm.func @k__par0_task(%ctx: !llvm.ptr) {
      // rows [lo, hi) of this thread; each chunked operand: aligned + lo * row bytes, size hi - lo
      llvm.call @k__par0(...) : (...) -> ()
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
        declared = [f"llvm.func @{name}() -> i32" if sig.endswith("i32 ()>") else
                    "llvm.func @GOMP_parallel(!llvm.ptr, !llvm.ptr, i32, i32)" for name, sig in _RUNTIME.items()]
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
    extent: int            # the first loop dimension's trip count
    values: list           # the generic's distinct memref operands, then what its region captures
    chunked: list          # per value: whether its outer dimension is split
    constants: list        # arith.constant ops the region reads (cloned into the body)


def _plan(op: ir.Operation, min_elements: int):
    """What outlining `op` takes, or None when it is not a generic that may be split."""
    if op.name != "linalg.generic":
        return None
    iterators = ir.ArrayAttr(op.attributes["iterator_types"])
    if not len(iterators) or "parallel" not in str(iterators[0]):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    n_outs = _count_outs(op)
    operands = list(op.operands)
    ranges = [None] * len(iterators)
    uses = {}  # operand value -> whether it is indexed by d0 (as its outer index)
    for i, (value, amap) in enumerate(zip(operands, maps)):
        if not _plain_memref(value.type):
            return None
        shape = ir.MemRefType(value.type).shape
        outer = _d0_use(amap)
        if outer is None:
            return None  # d0 inside an expression or at an inner position
        if i >= len(operands) - n_outs and not outer:
            return None  # an output every row would write
        if value in uses and uses[value] != outer:
            return None
        uses[value] = outer
        for position, expr in enumerate(amap.results):
            if isinstance(expr, ir.AffineDimExpr):
                ranges[ir.AffineDimExpr(expr).position] = shape[position]
    if any(r is None for r in ranges) or ranges[0] < 2 or math.prod(ranges) < min_elements:
        return None
    if not _region_only_reads(op):
        return None
    outs = operands[len(operands) - n_outs:]
    roots_out = {_root(v) for v in outs}
    for value in operands[:len(operands) - n_outs]:
        if _root(value) in roots_out and value not in outs:
            return None  # reads another view of a buffer it writes
    captured, _ = live_values([op], keep_outside=_is_constant)
    constants = []
    for inner in _region_ops(op):
        for v in inner.operands:
            if _is_constant(v) and v not in uses and v.owner.operation not in constants:
                if not _defined_inside(v, op):
                    constants.append(v.owner.operation)
    if any(chunked and _row_bytes(v.type) is None for v, chunked in uses.items()):
        return None
    values = list(uses)
    for v in captured:
        if v in uses:
            continue
        if isinstance(v.type, ir.MemRefType):
            if _root(v) in roots_out:
                return None
        elif not (isinstance(v.type, ir.IntegerType) or isinstance(v.type, ir.FloatType)
                  or isinstance(v.type, ir.IndexType)):
            return None
        values.append(v)
    return _Plan(ranges[0], values, [uses.get(v, False) for v in values], constants)


def _count_outs(op: ir.Operation) -> int:
    segments = op.attributes["operandSegmentSizes"]
    return list(ir.DenseI32ArrayAttr(segments))[1]


def _plain_memref(t: ir.Type) -> bool:
    """A memref of static shape and identity layout (rows are contiguous)."""
    if not isinstance(t, ir.MemRefType):
        return False
    m = ir.MemRefType(t)
    if not m.has_static_shape:
        return False
    return str(m.layout) == str(ir.AffineMapAttr.get(ir.AffineMap.get_identity(m.rank)))


def _d0_use(amap: ir.AffineMap):
    """True when d0 is the map's first result and appears nowhere else; False when the map
    does not use d0; None otherwise."""
    results = list(amap.results)
    hits = [i for i, e in enumerate(results) if _uses_d0(e)]
    if not hits:
        return False
    first = results[0]
    if hits == [0] and isinstance(first, ir.AffineDimExpr) and ir.AffineDimExpr(first).position == 0:
        return True
    return None


def _uses_d0(expr) -> bool:
    if isinstance(expr, ir.AffineDimExpr):
        return ir.AffineDimExpr(expr).position == 0
    if isinstance(expr, ir.AffineBinaryExpr):
        binary = ir.AffineBinaryExpr(expr)
        return _uses_d0(binary.lhs) or _uses_d0(binary.rhs)
    return False


def _region_ops(op: ir.Operation) -> list:
    found = []

    def visit(inner):
        if inner.operation != op:
            found.append(inner.operation)
        return ir.WalkResult.ADVANCE

    op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


_PURE_PREFIXES = ("arith.", "math.", "linalg.yield", "linalg.index", "memref.load", "memref.dim",
                  "scf.", "affine.apply", "complex.")


def _region_only_reads(op: ir.Operation) -> bool:
    """Whether the region only computes and reads, and never asks for d0's index (a thread's
    block starts at row 0 of its own view: `linalg.index 0` would count from there; fuzz
    seed 108 built an index tensor with it, and the rows past the first block were wrong)."""
    for inner in _region_ops(op):
        if not inner.name.startswith(_PURE_PREFIXES) or inner.name == "scf.execute_region":
            return False
        if inner.name == "linalg.index" and ir.IntegerAttr(inner.attributes["dim"]).value == 0:
            return False
    return True


def _is_constant(v: ir.Value) -> bool:
    owner = v.owner
    return isinstance(owner, ir.OpView) and owner.operation.name == "arith.constant"


def _defined_inside(v: ir.Value, op: ir.Operation) -> bool:
    parent = v.owner.operation.parent
    while parent is not None:
        if parent == op:
            return True
        parent = parent.parent
    return False


def _root(v: ir.Value):
    while isinstance(v.owner, ir.OpView) and v.owner.operation.name in _VIEWS:
        v = v.owner.operation.operands[0]
    return v


def _chunked_type(t: ir.Type) -> ir.Type:
    m = ir.MemRefType(t)
    return ir.MemRefType.get([ir.ShapedType.get_dynamic_size()] + list(m.shape[1:]), m.element_type,
                             memory_space=m.memory_space)


def _rank(t: ir.Type) -> int:
    """A memref operand's rank; -1 for a scalar."""
    return ir.MemRefType(t).rank if isinstance(t, ir.MemRefType) else -1


def _row_bytes(t: ir.Type):
    """Bytes from one row of a memref to the next; None for an element type whose size this
    pass does not know (complex, ...): such a generic stays in its kernel."""
    m = ir.MemRefType(t)
    element = m.element_type
    if isinstance(element, ir.IndexType):
        width = 64
    elif isinstance(element, (ir.IntegerType, ir.FloatType)):
        width = element.width
    else:
        return None
    return math.prod(m.shape[1:]) * max(1, (width + 7) // 8)


def _outline(module: ir.Operation, fn: ir.Operation, op: ir.Operation, plan: _Plan, name: str) -> None:
    ctx = op.context
    with ctx, op.location:
        types = [v.type for v in plan.values]
        body_types = [_chunked_type(t) if c else t for t, c in zip(types, plan.chunked)]
        anchor = ir.InsertionPoint.after(fn)
        body_fn = func.FuncOp(name, (body_types, []), ip=anchor)
        block = body_fn.add_entry_block()
        with ir.InsertionPoint(block):
            mapping = {}
            for const in plan.constants:
                clone = const.clone()
                mapping[const.results[0]] = clone.results[0]
            for v, arg in zip(plan.values, block.arguments):
                mapping[v] = arg
            generic = op.clone()
            for inner in [generic] + _region_ops(generic):
                for i, v in enumerate(list(inner.operands)):
                    if v in mapping:
                        inner.operands[i] = mapping[v]
            func.ReturnOp([])
        fork = func.FuncOp(name + "_fork", (types, []), visibility="private", ip=ir.InsertionPoint.after(body_fn))
        i64 = ir.IntegerType.get_signless(64)
        layout = [ir.ArrayAttr.get([ir.IntegerAttr.get(i64, _rank(t)), ir.IntegerAttr.get(i64, int(c)),
                                    ir.IntegerAttr.get(i64, _row_bytes(t) if c else 0)])
                  for t, c in zip(types, plan.chunked)]
        fork.operation.attributes[_FORK_ATTR] = ir.ArrayAttr.get([
            ir.FlatSymbolRefAttr.get(name), ir.IntegerAttr.get(i64, plan.extent), ir.ArrayAttr.get(layout)])
        with ir.InsertionPoint(op):
            func.CallOp([], ir.FlatSymbolRefAttr.get(name + "_fork"), plan.values)
        op.erase()


# --------------------------------------------------------------------------- forks


def _fork_text(fork: ir.Operation, functions: dict) -> tuple:
    """(the name of the outlined function it runs, the LLVM-dialect text of one fork and its
    task)."""
    name = ir.StringAttr(fork.attributes["sym_name"]).value
    info = ir.ArrayAttr(fork.attributes[_FORK_ATTR])
    body = ir.FlatSymbolRefAttr(info[0]).value
    extent = ir.IntegerAttr(info[1]).value
    layout = [[ir.IntegerAttr(x).value for x in ir.ArrayAttr(entry)] for entry in ir.ArrayAttr(info[2])]
    arg_types = _llvm_inputs(_function_type(fork))
    target = functions.get(body)
    if target is None:
        raise PassFailure(f"ca-define-parallel-forks: @{name}'s body @{body} is not in the module", fork)
    body_types = _llvm_inputs(_function_type(target))
    if body_types != arg_types:
        raise PassFailure(f"ca-define-parallel-forks: @{name} takes ({', '.join(arg_types)}) but @{body} "
                          f"takes ({', '.join(body_types)})", fork)
    # Where each operand's pieces sit among the expanded arguments: a memref of rank r is
    # allocated, aligned, offset, r sizes, r strides; a scalar is one argument.
    groups, i = [], 0
    for rank, chunked, row_bytes in layout:
        groups.append((i, rank, chunked, row_bytes))
        i += 1 if rank < 0 else 3 + 2 * rank
    if i != len(arg_types):
        raise PassFailure(f"ca-define-parallel-forks: @{name} has {len(arg_types)} arguments, its operands "
                          f"expand to {i}", fork)
    n = len(arg_types)
    params = ", ".join(f"%a{k}: {t}" for k, t in enumerate(arg_types))
    lines = [f"llvm.func internal @{name}({params}) {{",
             f"  %n = llvm.mlir.constant({n} : i64) : i64",
             "  %ctx = llvm.alloca %n x i64 : (i64) -> !llvm.ptr"]
    for k, t in enumerate(arg_types):
        lines += [f"  %s{k} = llvm.getelementptr %ctx[{k}] : (!llvm.ptr) -> !llvm.ptr, i64",
                  f"  llvm.store %a{k}, %s{k} : {t}, !llvm.ptr"]
    lines += [f"  %task = llvm.mlir.addressof @{body}_task : !llvm.ptr",
              "  %zero = llvm.mlir.constant(0 : i32) : i32",
              "  llvm.call @GOMP_parallel(%task, %ctx, %zero, %zero) : (!llvm.ptr, !llvm.ptr, i32, i32) -> ()",
              "  llvm.return", "}"]
    # Blocks of rows whose size is a multiple of `grain`: at least 64 bytes of the narrowest
    # chunked operand, so that no two threads write one cache line (1-D operands).
    narrowest = min(row_bytes for _, rank, chunked, row_bytes in groups if chunked)
    grain = max(1, 64 // narrowest)
    lines += [f"llvm.func internal @{body}_task(%ctx: !llvm.ptr) {{",
              "  %tid32 = llvm.call @omp_get_thread_num() : () -> i32",
              "  %nt32 = llvm.call @omp_get_num_threads() : () -> i32",
              "  %tid = llvm.sext %tid32 : i32 to i64",
              "  %nt = llvm.sext %nt32 : i32 to i64",
              f"  %ext = llvm.mlir.constant({extent} : i64) : i64",
              f"  %grain = llvm.mlir.constant({grain} : i64) : i64",
              "  %one = llvm.mlir.constant(1 : i64) : i64",
              # rows per thread: ceil(ceil(ext / nt) / grain) * grain; thread t takes
              # [t * chunk, (t + 1) * chunk) clipped to the extent
              "  %ntm1 = llvm.sub %nt, %one : i64",
              "  %e1 = llvm.add %ext, %ntm1 : i64",
              "  %per = llvm.sdiv %e1, %nt : i64",
              "  %gm1 = llvm.sub %grain, %one : i64",
              "  %p1 = llvm.add %per, %gm1 : i64",
              "  %p2 = llvm.sdiv %p1, %grain : i64",
              "  %chunk = llvm.mul %p2, %grain : i64",
              "  %lo0 = llvm.mul %tid, %chunk : i64",
              "  %lofar = llvm.icmp \"sgt\" %lo0, %ext : i64",
              "  %lo = llvm.select %lofar, %ext, %lo0 : i1, i64",
              "  %hi0 = llvm.add %lo, %chunk : i64",
              "  %hifar = llvm.icmp \"sgt\" %hi0, %ext : i64",
              "  %hi = llvm.select %hifar, %ext, %hi0 : i1, i64",
              "  %empty = llvm.icmp \"sge\" %lo, %hi : i64",
              "  llvm.cond_br %empty, ^done, ^work",
              "^work:",
              "  %rows = llvm.sub %hi, %lo : i64"]
    call_args = []
    for k, t in enumerate(arg_types):
        lines += [f"  %g{k} = llvm.getelementptr %ctx[{k}] : (!llvm.ptr) -> !llvm.ptr, i64",
                  f"  %v{k} = llvm.load %g{k} : !llvm.ptr -> {t}"]
        call_args.append(f"%v{k}")
    for start, rank, chunked, row_bytes in groups:
        if not chunked:
            continue
        lines += [f"  %rb{start} = llvm.mlir.constant({row_bytes} : i64) : i64",
                  f"  %off{start} = llvm.mul %lo, %rb{start} : i64",
                  f"  %p{start} = llvm.getelementptr %v{start + 1}[%off{start}] : (!llvm.ptr, i64) -> !llvm.ptr, i8"]
        call_args[start + 1] = f"%p{start}"
        call_args[start + 3] = "%rows"  # sizes[0]
    lines += [f"  llvm.call @{body}({', '.join(call_args)}) : ({', '.join(arg_types)}) -> ()",
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
