"""ca-outline-kernels: split a flat backward into a host function and compute kernels."""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import func

from camlir.dialects.ca.ir_helpers import find_func, func_name, funcs, is_inside, live_values, next_op, torch_op_name
from camlir.dialects.ca.types import tensor_sig

from .base import CAPass, PassFailure

# Ops the host keeps and clones into each kernel that reads them: they make scalars and
# lists, which kernels cannot return and which cost nothing to recompute.
_CLONEABLE_PREFIXES = ("torch.constant.",)
_CLONEABLE = ("torch.prim.ListConstruct",)
# Host ops that are not barriers: accumulation has no results that compute reads, and a
# size is a scalar handed to kernels as an argument.
_TRANSPARENT = ("ca.accumulate_grad", "ca.size")
# Host ops that are barriers: anything that runs Python (a hook, a call-back) may observe
# or change state, so compute is not moved across them; a call is a kernel outlined before.
_BARRIERS = ("ca.hook", "ca.call_python", "func.call")
# The attribute that keeps an op on the host, run through torch (ca-lower-to-linalg sets it
# on ops it could not convert).
HOST_ATTR = "ca.host"


# Ops that lower, but whose linalg form becomes plain loops far slower than PyTorch's own
# kernel (oneDNN for convolutions): until camlir has a schedule or library call for them,
# they run through torch on the host, like the ops with no lowering at all.
SLOW_WHEN_LOWERED = frozenset({
    "aten.convolution_backward",
    "aten.convolution",
    # Lowered as a loop over every input element with index arithmetic (no vectorization).
    "aten.max_pool2d_with_indices_backward",
})


def default_extern_ops() -> frozenset:
    """The aten ops that stay on the host and run through torch: the ones the lowering
    cannot take, and the ones it would make slow."""
    try:
        from camlir.lowering.torch_to_linalg import EXTERN_OPS
    except ImportError:  # the lowering package is optional for ca-opt users
        return SLOW_WHEN_LOWERED
    return frozenset(EXTERN_OPS) | SLOW_WHEN_LOWERED


# Ops taking (self, indices, ...) whose lowering hangs on a boolean mask index.
_INDEX_PUTS = ("aten.index_put", "aten.index_put_", "aten._unsafe_index_put", "aten._index_put_impl",
               "aten._index_put_impl_", "aten.index", "aten._unsafe_index")


def hangs_or_crashes_the_lowering(op: ir.Operation) -> bool:
    """Ops that torch-mlir's lowering does not fail on but hangs or crashes the process on,
    by their operands (an error would move them to the host by itself; these must never
    reach it). Found by the OpInfo differential run:
    - an index or index_put with a boolean mask index (`x[mask]`, `x[mask] = v` and their
      backwards; the result's size depends on the data): loops forever;
    - a scatter into a 0-d tensor (`median(x, dim=-1)` of a 0-d x): LLVM out of memory;
    - an op on or making a tensor with no elements (`a.view(0, 25)`, `pad` of an empty
      batch): SIGFPE in the lowering or the JIT; on the host it costs nothing;
    - an op on complex tensors (the FFT family): SIGSEGV in the lowering."""
    for value in list(op.operands) + list(op.results):
        sig = tensor_sig(value.type)
        if sig is not None and ((sig.shape is not None and 0 in sig.shape)
                                or (sig.dtype or "").startswith("complex")):
            return True
    name = torch_op_name(op)
    base = name if name in _INDEX_PUTS else name.rsplit(".", 1)[0]  # without the overload
    if base in _INDEX_PUTS and len(op.operands) > 1:
        indices = op.operands[1].owner
        if isinstance(indices, ir.OpView) and indices.operation.name == "torch.prim.ListConstruct":
            return any(str(v.type).endswith(",i1>") for v in indices.operation.operands)
    if torch_op_name(op).startswith("aten.scatter") and op.operands:
        return str(op.operands[0].type).startswith("!torch.vtensor<[]")
    return False


def is_cloneable(op: ir.Operation) -> bool:
    """Whether `op` is a constant or a list construction: what the host keeps and clones
    into each kernel that reads it, rather than passing it as a kernel argument."""
    return op.name.startswith(_CLONEABLE_PREFIXES) or op.name in _CLONEABLE


@dataclasses.dataclass(frozen=True)
class OutlineKernels(CAPass):
    """Moves every maximal run of compute into its own `func.func` kernel.

    What remains in `@backward` is the host program the runtime walks: kernel calls, hooks
    that stay calls into Python, accumulation into `.grad`, and extern ops (aten ops with no
    lowering, see `docs/op-coverage.md`). Kernels are plain torch-dialect functions with
    the `ca.kernel` attribute, which the lowering takes to linalg and the backends compile.

    Runs are cut at barriers: `ca.hook`, `ca.call_python`, calls of kernels outlined
    before, ops marked `ca.host`, and extern ops. A run of more than `max-ops` ops (default
    160: LLVM's codegen time grows faster than a kernel's size) is also cut, into as few
    kernels of nearly equal size as fit, each cut where the fewest values cross it (lit
    test `outline-kernels-max-ops.mlir`). Accumulation
    does not cut a run: it moves after the kernel that computes its gradient (no compute
    reads `.grad`, and it never moves past a hook, which might). Constants and list
    constructions stay on the host and are cloned into every kernel that reads them; a
    host scalar such a list is built from (a symbolic capture's lifted size, from
    `ca.size`) becomes a kernel argument (`!torch.int`, `i64` once lowered).
    Requires flat code (`ca-flatten-nodes` first).

    Before:
    ```mlir
    func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
      %0 = torch.aten.neg %g : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
      "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
      %1 = "ca.hook"(%0) {hook_id = 0 : i64, kind = "tensor_pre_hook"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
      %2 = torch.aten.mul.Tensor %1, %g : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
      "ca.accumulate_grad"(%p, %2) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
      return
    }
    ```
    After:
    ```mlir
    func.func @backward(%g: !torch.vtensor<[4],f32>, %p: !torch.vtensor<[4],f32>) {
      %0 = call @backward_kernel_0(%g) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
      "ca.accumulate_grad"(%p, %0) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
      %1 = "ca.hook"(%0) {hook_id = 0 : i64, kind = "tensor_pre_hook"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
      %2 = call @backward_kernel_1(%1, %g) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
      "ca.accumulate_grad"(%p, %2) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
      return
    }
    func.func private @backward_kernel_0(%arg0: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> attributes {ca.kernel} {
      %0 = torch.aten.neg %arg0 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
      return %0 : !torch.vtensor<[4],f32>
    }
    func.func private @backward_kernel_1(...)  // the mul
    ```
    """

    argument = "ca-outline-kernels"
    summary = "Outline runs of compute into ca.kernel functions; the host keeps hooks and accumulation"

    function: str = "backward"
    extern_ops: str = ""  # more aten ops to keep on the host, comma-separated ("aten.foo,aten.bar")
    max_ops: int = 0  # ops per kernel at most (0: MAX_KERNEL_OPS; negative: no limit)

    def run(self, module: ir.Operation) -> None:
        host = find_func(module, self.function)
        if host is None:
            raise PassFailure(f"no function @{self.function} to outline", module)
        extern = default_extern_ops() | {name for name in self.extern_ops.split(",") if name}
        outline_runs(module, host, extern, self.max_ops or MAX_KERNEL_OPS)


# LLVM's codegen time grows faster than a function's size: on T5's backward, a kernel of
# ~450 ops took 4.9 s of codegen where kernels of ~120 took 0.1-0.4 s each. A longer run is
# cut into nearly equal kernels, each cut where the fewest values cross it (what is lost is
# fusion across the cut, and the crossing values go through memory).
MAX_KERNEL_OPS = 160


def outline_runs(module: ir.Operation, host: ir.Operation, extern=frozenset(), max_ops: int = MAX_KERNEL_OPS) -> list:
    """Outlines every run of compute in `host` between barriers into new kernels of at most
    `max_ops` ops each (no limit when it is not positive), numbered after the kernels the
    module already has; returns the new kernels. Calls of existing kernels are barriers, so a
    host that was outlined before only has its new compute outlined (ca-lower-to-linalg uses
    this after moving an op to the host)."""
    block = host.regions[0].blocks[0]
    prefix = f"{func_name(host)}_kernel_"
    taken = [func_name(fn)[len(prefix):] for fn in funcs(module) if func_name(fn).startswith(prefix)]
    number = 1 + max((int(t) for t in taken if t.isdigit()), default=-1)
    segment, kernels = [], []
    for op in list(block.operations):
        op = op.operation
        if op.name == "ca.node":
            raise PassFailure("ca-outline-kernels needs flat code: run ca-flatten-nodes first", op)
        if op.name == "func.return" or op.name in _TRANSPARENT:
            continue
        if is_cloneable(op) and not _reads_tensors(op):
            continue  # a list of tensors is compute: it goes where its tensors are
        if (op.name in _BARRIERS or HOST_ATTR in op.attributes or torch_op_name(op) in extern
                or hangs_or_crashes_the_lowering(op)):
            if op.name not in _BARRIERS and HOST_ATTR not in op.attributes:
                # Marked, so that it stays on the host when ca-lower-to-linalg outlines again
                # around an op it could not lower (it does not know the extern set). Unmarked,
                # a convolution_backward went into the new kernel, and torch-mlir's lowering
                # of it gave wrong weight gradients (Swin's patch embedding; model sweep).
                op.attributes[HOST_ATTR] = ir.UnitAttr.get()
            for chunk in split_run(segment, max_ops):
                kernels += _outline(module, host, chunk, number + len(kernels))
            segment = []
            continue
        segment.append(op)
    for chunk in split_run(segment, max_ops):
        kernels += _outline(module, host, chunk, number + len(kernels))
    _erase_dead_cloneables(block)
    return kernels


def split_run(ops: list, max_ops: int) -> list:
    """`ops` (one run, in block order) as consecutive chunks of at most `max_ops` ops, as
    few as that allows and of nearly equal size; each cut is placed, within a quarter of
    a chunk of its even position, where the fewest of the run's values cross it."""
    n = len(ops)
    if max_ops <= 0 or n <= max_ops:
        return [ops]
    # crossing[p]: values defined by ops[:p] that ops[p:] read.
    index = {op: i for i, op in enumerate(ops)}
    delta = [0] * (n + 1)
    for i, op in enumerate(ops):
        last = max((index.get(use.owner, -1) for r in op.results for use in r.uses), default=-1)
        if last > i:
            delta[i + 1] += 1
            delta[last + 1] -= 1
    crossing, live = [], 0
    for p in range(n + 1):
        live += delta[p]
        crossing.append(live)
    count = -(-n // max_ops)
    cuts, start = [], 0
    for j in range(1, count):
        ideal = start + (n - start) // (count - j + 1)
        window = max(1, (n // count) // 4)
        # This chunk must fit, and so must the rest in the chunks left.
        allowed = range(max(start + 1, n - (count - j) * max_ops), min(start + max_ops, n - 1) + 1)
        cut = min(allowed, key=lambda p: (abs(p - ideal) > window, crossing[p], abs(p - ideal)))
        cuts.append(cut)
        start = cut
    bounds = [0] + cuts + [n]
    return [ops[a:b] for a, b in zip(bounds, bounds[1:])]


def _outline(module: ir.Operation, host: ir.Operation, ops: list, number: int) -> list:
    """Moves `ops` (in block order) into a new kernel; returns [kernel], or [] when the
    run was dead and erased."""
    # A list of tensors that only host ops read stays on the host: kernels return tensors,
    # never lists (the index of a mask moved to the host takes its indices as a list).
    members = set(ops)
    ops = [op for op in ops if not (op.name in _CLONEABLE and op.results
                                    and all(u.owner not in members for u in op.results[0].uses))]
    if not ops:
        return []
    members = set(ops)
    inputs, outputs = live_values(ops, keep_outside=_is_cloneable_value)
    inputs += [v for v in _scalars_under_cloneables(ops) if v not in inputs]
    if not outputs:  # nothing reads it: pure compute is dead
        for op in reversed(ops):
            op.erase()
        return []
    name = f"{func_name(host)}_kernel_{number}"
    with host.context, host.location:
        fn_type = ir.FunctionType.get([v.type for v in inputs], [v.type for v in outputs])
        with ir.InsertionPoint(module.regions[0].blocks[0]):
            kernel = func.FuncOp(name, fn_type, visibility="private")
        kernel.attributes["ca.kernel"] = ir.UnitAttr.get()
        body = kernel.add_entry_block()
        last = ops[-1]
        # Never None: the function's terminator follows every run of compute.
        with ir.InsertionPoint(next_op(last)):
            call = func.CallOp([v.type for v in outputs], ir.FlatSymbolRefAttr.get(name), inputs)
        with ir.InsertionPoint(body):
            ret = func.ReturnOp(outputs)
    # Host ops interleaved with the run that read its results move after the call.
    first = ops[0]
    between = _ops_between(first, call.operation)
    movers = [op for op in between if op not in members]
    for old, new in zip(outputs, call.results):
        for use in list(old.uses):
            if use.owner not in members and use.owner != ret.operation:
                use.owner.operands[use.operand_number] = new
    anchor = call.operation
    for op in movers:
        if any(isinstance(v.owner, ir.OpView) and v.owner.operation == call.operation for v in op.operands):
            op.move_after(anchor)
            anchor = op
    for op in ops:
        op.move_before(ret.operation)
    _clone_cloneables_into(kernel.operation, body)
    # After the cloning: the clones read the host's scalars too (a symbolic size in a list).
    for v, arg in zip(inputs, body.arguments):
        for use in list(v.uses):
            if is_inside(use.owner, kernel.operation):
                use.owner.operands[use.operand_number] = arg
    return [kernel.operation]


def _scalars_under_cloneables(ops: list) -> list:
    """The values that the constants and lists a run reads are built from but that are not
    themselves cloneable: the `!torch.int` of a `ca.size` in `[%n, 3]` (a symbolic capture).
    The lists are cloned into the kernel, so these become kernel arguments."""
    members = set(ops)
    found, seen = [], set()

    def visit(v):
        if v in seen:
            return
        seen.add(v)
        for operand in v.owner.operation.operands:
            if _is_cloneable_value(operand):
                visit(operand)
            elif operand not in found:
                found.append(operand)

    for op in ops:
        for v in op.operands:
            if _is_cloneable_value(v) and v.owner.operation not in members:
                visit(v)
    return found


def _is_cloneable_value(v: ir.Value) -> bool:
    owner = v.owner
    return isinstance(owner, ir.OpView) and is_cloneable(owner.operation) and not _reads_tensors(owner.operation)


def _reads_tensors(op: ir.Operation) -> bool:
    return any(str(v.type).startswith(("!torch.vtensor", "!torch.tensor")) for v in op.operands)


def _clone_cloneables_into(kernel: ir.Operation, body: ir.Block) -> None:
    """Copies host constants and lists read by the kernel to the top of its body."""
    first = list(body.operations)[0]
    clones = {}

    def clone(v):
        if v in clones:
            return clones[v]
        op = v.owner.operation
        for operand in op.operands:
            if _is_cloneable_value(operand):
                clone(operand)
        with ir.InsertionPoint(first):
            new = op.clone()
        for i, operand in enumerate(op.operands):
            if operand in clones:
                new.operands[i] = clones[operand]
        for old_r, new_r in zip(op.results, new.results):
            clones[old_r] = new_r
        return clones[v]

    targets = []
    kernel.walk(lambda o: targets.append(o.operation) or ir.WalkResult.ADVANCE)
    for op in targets:
        for i, v in enumerate(op.operands):
            if not is_inside(op, kernel) or not _is_cloneable_value(v):
                continue
            if is_inside(v.owner.operation, kernel):
                continue
            op.operands[i] = clone(v)


def _erase_dead_cloneables(block: ir.Block) -> None:
    changed = True
    while changed:
        changed = False
        for op in reversed(list(block.operations)):
            op = op.operation
            if is_cloneable(op) and not any(True for r in op.results for _ in r.uses):
                op.erase()
                changed = True


def _ops_between(first: ir.Operation, last: ir.Operation) -> list:
    """The ops from `first` up to `last` (excluded), in one block. (Walked op by op: listing
    the whole block per kernel cost 0.5 s on MobileNetV3's host function.)"""
    found, op = [], first
    while op is not None and op != last:
        found.append(op)
        op = next_op(op)
    return found
