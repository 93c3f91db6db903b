"""ca-sink-views: a view that one kernel returns only for other kernels is recomputed in them."""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import defining_op, find_func, func_name, funcs, is_kernel
from camlir.dialects.ca.types import tensor_sig

from .base import CAPass, PassFailure
from .outline_kernels import HOST_ATTR, is_cloneable

# Ops whose result is a view of their first operand, with the same elements in another order
# or shape: cheap to recompute anywhere, and folded by the lowering (a transpose into a
# BLAS flag, t(t(x)) into x, a reshape of a contiguous value into a reassociation).
VIEW_OPS = frozenset({
    "torch.aten.permute", "torch.aten.t", "torch.aten.transpose.int", "torch.aten.numpy_T",
    "torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view",
    "torch.aten.unsqueeze", "torch.aten.squeeze.dim", "torch.aten.squeeze",
})


@dataclasses.dataclass(frozen=True)
class SinkViews(CAPass):
    """Makes a kernel result that is a view (`permute`, `t`, `transpose`, `view`, `reshape`,
    `unsqueeze`, `squeeze`) of a value, and that only other kernels read, cross the kernel
    boundary as that value: the producer returns the view's base (or nothing, when the base
    is one of its arguments: the host passes that argument on), and every consumer takes the
    base and recomputes the view. A kernel whose result is then an identity view of its own
    argument (`t(t(x))`) gives the host that argument instead, and a kernel left with no
    results is erased.

    Why: a kernel result is a buffer written in full. A Python hook that stays a call (a
    post-accumulate-grad hook per parameter, as DDP's reducer installs) cuts the backward
    into one kernel per hook, and the views that one kernel would have folded away (the
    transposed weight a Linear's backward multiplies by, the `t` of a weight gradient that
    `TBackward` undoes) were written out as transposed copies, and copied back by the next
    kernel: a 4-layer MLP of 1024-wide layers took 3x as long with a no-op hook per
    parameter. After this pass the kernels read what a single kernel would have read.
    Nothing moves across a hook: only views are recomputed, never other compute, and the
    host's order of hooks, accumulations and kernel calls stays as it was.

    Only results that nothing on the host reads but kernel calls are changed (an
    accumulation, a hook or a host op needs the tensor itself), only kernels called once,
    and only views whose other operands are constants (a symbolic size keeps the view
    where it is). One exception for host ops: a result that is a view and that only host
    ops run through torch (`ca.host`) read is made on the host, from the call's operand
    when the view's base is a kernel argument (a channels_last activation passed to a
    convolution backward stays channels_last, as on the eager engine, instead of being
    copied to NCHW), or from the base itself, which the kernel then returns, when the
    kernel computes it and torch can make the view of a contiguous tensor (an attention
    backward gets its gradient in the permuted layout eager's engine hands it). Runs on
    the host function after ca-outline-kernels.

    Before:
    ```mlir
    func.func @backward(%g: !torch.vtensor<[2,3],f32>, %x: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[3,3],f32>) {
      %0:2 = call @backward_kernel_0(%g, %x) : (...) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3,3],f32>)
      "ca.accumulate_grad"(%b, %0#0) ...
      "ca.hook"(%b) {hook_id = 0 : i64, kind = "post_acc_grad_hook"} ...
      %1 = call @backward_kernel_1(%0#1) : (!torch.vtensor<[3,3],f32>) -> !torch.vtensor<[3,3],f32>
      "ca.accumulate_grad"(%w, %1) ...
    }
    func.func private @backward_kernel_0(%g, %x) -> (...) attributes {ca.kernel} {
      %0 = torch.aten.sum.dim_IntList %g, ...
      %1 = torch.aten.mm %gt, %x ...
      %2 = torch.aten.t %1 ...                    // written out as a transposed copy
      return %0, %2
    }
    func.func private @backward_kernel_1(%a) -> !torch.vtensor<[3,3],f32> attributes {ca.kernel} {
      %0 = torch.aten.t %a ...                    // and copied back
      return %0
    }
    ```
    After:
    ```mlir
    func.func @backward(...) {
      %0:2 = call @backward_kernel_0(%g, %x) : (...) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3,3],f32>)
      "ca.accumulate_grad"(%b, %0#0) ...
      "ca.hook"(%b) {hook_id = 0 : i64, kind = "post_acc_grad_hook"} ...
      "ca.accumulate_grad"(%w, %0#1) ...          // the mm itself; @backward_kernel_1 is gone
    }
    func.func private @backward_kernel_0(%g, %x) -> (...) attributes {ca.kernel} {
      %0 = torch.aten.sum.dim_IntList %g, ...
      %1 = torch.aten.mm %gt, %x ...
      return %0, %1
    }
    ```
    """

    argument = "ca-sink-views"
    summary = "Recompute views that cross kernel boundaries in the kernels that read them"

    function: str = "backward"

    def run(self, module: ir.Operation) -> None:
        host = find_func(module, self.function)
        if host is None:
            raise PassFailure(f"no function @{self.function}", module)
        with module.context, host.location:
            sink_views(module, host)


def sink_views(module: ir.Operation, host: ir.Operation) -> None:
    """The pass on `host`'s kernel calls (see `SinkViews`)."""
    kernels = {func_name(fn): fn for fn in funcs(module, is_kernel)}
    changed = True
    while changed:
        changed = False
        calls = _kernel_calls(host, kernels)
        counts = {}
        for call in calls:
            counts[_callee(call)] = counts.get(_callee(call), 0) + 1
        once = {c for c in calls if counts[_callee(c)] == 1}
        for call in calls:
            if call not in once:
                continue
            if (_fold_identity_results(call, kernels) or _views_on_host(call, kernels)
                    or _sink_one(call, kernels, once)):
                changed = True
                break
    calls = _kernel_calls(host, kernels)
    names = [_callee(c) for c in calls]
    for call, name in zip(calls, names):
        if not call.results and names.count(name) == 1:
            kernel = kernels.pop(name)
            call.erase()
            kernel.erase()


# --------------------------------------------------------------------------- helpers

def _callee(call: ir.Operation) -> str:
    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def _kernel_calls(host: ir.Operation, kernels: dict) -> list:
    return [op.operation for op in host.regions[0].blocks[0].operations
            if op.operation.name == "func.call" and _callee(op.operation) in kernels]


def _block(kernel: ir.Operation) -> ir.Block:
    return kernel.regions[0].blocks[0]


def _return(kernel: ir.Operation) -> ir.Operation:
    return list(_block(kernel).operations)[-1].operation


def _view_chain(value: ir.Value):
    """The view ops that make `value` from a base, base first, and that base; ([], value)
    when `value` is not a view. Stops at a view whose other operands are not constants."""
    chain = []
    while True:
        op = defining_op(value)
        if op is None or op.name not in VIEW_OPS or not all(_constant(v) for v in list(op.operands)[1:]):
            break
        chain.append(op)
        value = op.operands[0]
    return list(reversed(chain)), value


def _constant(value: ir.Value) -> bool:
    """Whether `value` is made only of constants (cloneable into another function)."""
    op = defining_op(value)
    return op is not None and is_cloneable(op) and all(_constant(v) for v in op.operands)


def _is_identity(chain: list, base: ir.Value) -> bool:
    """Whether the views of `chain` applied to `base` give `base` back, element for element:
    the permutations compose to the identity, and a reshape only happens while the order is
    the original one (then shape changes that end at the base's shape are the identity)."""
    sig = tensor_sig(base.type)
    if sig is None or sig.shape is None:
        return False
    perm = list(range(len(sig.shape)))
    for op in chain:
        name = op.name
        if name in ("torch.aten.t", "torch.aten.numpy_T"):
            perm = perm[::-1]
        elif name == "torch.aten.permute":
            dims = _int_list(op.operands[1])
            if dims is None or len(dims) != len(perm):
                return False
            dims = [d % len(perm) for d in dims]
            perm = [perm[d] for d in dims]
        elif name == "torch.aten.transpose.int":
            a, b = _int(op.operands[1]), _int(op.operands[2])
            if a is None or b is None or not perm:
                return False
            a, b = a % len(perm), b % len(perm)
            perm[a], perm[b] = perm[b], perm[a]
        else:  # a shape change: exact only in the original order
            if perm != list(range(len(perm))):
                return False
            out = tensor_sig(op.results[0].type)
            if out is None or out.shape is None:
                return False
            perm = list(range(len(out.shape)))
    return perm == list(range(len(perm))) and str(chain[-1].results[0].type) == str(base.type)


def _int(value: ir.Value):
    op = defining_op(value)
    if op is None or op.name != "torch.constant.int":
        return None
    return ir.IntegerAttr(op.attributes["value"]).value


def _int_list(value: ir.Value):
    op = defining_op(value)
    if op is None or op.name != "torch.prim.ListConstruct":
        return None
    items = [_int(v) for v in op.operands]
    return None if any(i is None for i in items) else items


def _clone_chain(chain: list, base: ir.Value, before: ir.Operation) -> ir.Value:
    """Clones `chain` (and the constants it reads) before `before`, applied to `base`;
    returns the last view's result."""
    mapping = {}

    def clone(op):
        for v in op.operands:
            inner = defining_op(v)
            if v not in mapping and inner is not None and inner not in chain:
                clone(inner)
        with ir.InsertionPoint(before):
            new = op.clone()
        for i, v in enumerate(op.operands):
            if v in mapping:
                new.operands[i] = mapping[v]
        for old, result in zip(op.results, new.results):
            mapping[old] = result
        return new

    mapping[chain[0].operands[0]] = base
    for op in chain:
        clone(op)
    return mapping[chain[-1].results[0]]


def _rebuild(call: ir.Operation, kernel: ir.Operation, operands: list, sources: list) -> ir.Operation:
    """Replaces `call` by a call of the same kernel with `operands`, whose result i stands for
    the old value `sources[i]` (its uses move over; None for a new result); the kernel's
    type is set from its block arguments and return. Returns the new call."""
    _set_type(kernel)
    types = [v.type for v in _return(kernel).operands]
    with ir.InsertionPoint(call), call.location:
        new = ir.Operation.create("func.call", results=types, operands=operands,
                                  attributes={"callee": call.attributes["callee"]})
    for old, result in zip(sources, new.results):
        if old is not None:
            old.replace_all_uses_with(result)
    call.erase()
    return new


def _set_type(kernel: ir.Operation) -> None:
    kernel.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
        [a.type for a in _block(kernel).arguments], [v.type for v in _return(kernel).operands]))


def _set_returns(kernel: ir.Operation, values: list) -> None:
    ret = _return(kernel)
    with ir.InsertionPoint(ret), ret.location:
        ir.Operation.create("func.return", operands=values)
    ret.erase()


def _drop_results(call: ir.Operation, kernel: ir.Operation, drop: set) -> ir.Operation:
    """Drops the results at the indices `drop` (nothing on the host reads them), then the
    kernel's dead ops and unused arguments."""
    keep = [i for i in range(len(call.results)) if i not in drop]
    returned = list(_return(kernel).operands)
    _set_returns(kernel, [returned[i] for i in keep])
    call = _rebuild(call, kernel, list(call.operands), [call.results[i] for i in keep])
    _erase_dead_ops(kernel)
    return _drop_unused_args(call, kernel)


def _erase_dead_ops(kernel: ir.Operation) -> None:
    for op in reversed(list(_block(kernel).operations)[:-1]):
        op = op.operation
        if len(op.results) and not any(True for r in op.results for _ in r.uses):
            op.erase()


def _drop_unused_args(call: ir.Operation, kernel: ir.Operation) -> ir.Operation:
    block = _block(kernel)
    unused = [i for i, a in enumerate(block.arguments) if not any(True for _ in a.uses)]
    if not unused:
        return call
    for i in reversed(unused):
        block.erase_argument(i)
    operands = [v for i, v in enumerate(call.operands) if i not in unused]
    return _rebuild(call, kernel, operands, list(call.results))


def _argument_for(call: ir.Operation, kernel: ir.Operation, value: ir.Value):
    """The kernel's argument that `value` is passed as, added when there is none; returns
    (the call, now maybe a new one, the argument)."""
    operands = list(call.operands)
    if value in operands:
        return call, _block(kernel).arguments[operands.index(value)]
    arg = _block(kernel).add_argument(value.type, call.location)
    return _rebuild(call, kernel, operands + [value], list(call.results)), arg


# Host ops that may read a kernel's argument where they read an identity view of it: kernel
# calls, and accumulation (which copies what it cannot steal, and steals only a kernel's
# own result that nothing else reads).
_IDENTITY_READERS = ("func.call", "ca.accumulate_grad")


def _fold_identity_results(call: ir.Operation, kernels: dict) -> bool:
    """A result that is an identity view of a kernel argument (`t(t(x))`): the host reads
    the call's operand instead. Returns whether something changed."""
    kernel = kernels[_callee(call)]
    args = list(_block(kernel).arguments)
    drop = set()
    for i, value in enumerate(_return(kernel).operands):
        chain, base = _view_chain(value)
        uses = [u.owner for u in call.results[i].uses]
        if (chain and base in args and _is_identity(chain, base)
                and all(isinstance(u, ir.OpView) and u.operation.name in _IDENTITY_READERS for u in uses)):
            call.results[i].replace_all_uses_with(call.operands[args.index(base)])
            drop.add(i)
    if drop:
        _drop_results(call, kernel, drop)
    return bool(drop)


def _views_on_host(call: ir.Operation, kernels: dict) -> bool:
    """A result that is a view and that only host ops run through torch read (`ca.host`: a
    convolution backward, a max-pool backward, an attention backward): the host makes the
    view itself, with no copy, from the call's operand when the view's base is a kernel
    argument, or else from the base, which the kernel returns instead. Returns whether
    something changed.

    Why, for an argument: such an argument is often a saved tensor passed permuted to
    contiguous (a channels_last activation or weight, `lowering/layouts.py`), and the kernel
    wrote its NCHW view out as a contiguous copy, so torch's kernel got NCHW tensors where
    eager's engine hands it channels_last ones: a channels_last convolution backward took
    2.6x as long (16.0 against 6.2 ms in one process, 64 channels, 16x16, bf16 autocast).
    For a value the kernel computes: the gradient an attention backward reads is the
    output projection's `mm`, viewed as (L, B, H, D) and permuted to (B, H, L, D); written
    out as a contiguous copy, torch's flash-attention backward read it in the other layout
    and took 689 against eager's 545 us a call (the bench Transformer, 1 thread)."""
    kernel = kernels[_callee(call)]
    args = list(_block(kernel).arguments)
    drop = set()
    for i, value in enumerate(_return(kernel).operands):
        chain, base = _view_chain(value)
        if not (chain and base in args and _only_host_ops_read(call.results[i])):
            continue
        view = _clone_chain(chain, call.operands[args.index(base)], call)
        _mark_host(view, chain)
        call.results[i].replace_all_uses_with(view)
        drop.add(i)
    if drop:
        _drop_results(call, kernel, drop)
        return True
    return _view_of_own_value_on_host(call, kernel)


_PERMUTING = ("torch.aten.permute", "torch.aten.t", "torch.aten.transpose.int", "torch.aten.numpy_T")
_RESHAPING = ("torch.aten.view", "torch.aten._unsafe_view")


def _only_host_ops_read(result: ir.Value) -> bool:
    uses = [u.owner for u in result.uses]
    return bool(uses) and all(isinstance(u, ir.OpView) and HOST_ATTR in u.operation.attributes for u in uses)


def _mark_host(view: ir.Value, chain: list) -> None:
    """The cloned views stay host ops (run through torch), not a new kernel."""
    made = view
    for _ in chain:
        op = defining_op(made)
        op.attributes[HOST_ATTR] = ir.UnitAttr.get()
        made = op.operands[0]


def _view_of_own_value_on_host(call: ir.Operation, kernel: ir.Operation) -> bool:
    """The first result that is a view of a value the kernel computes, read only by host
    ops, becomes that value (the kernel returns it, contiguous) and the view is made on the
    host. Only chains that torch can view on a contiguous tensor: a `view` after a
    permutation may need a copy there (value semantics in the kernel, an error in
    `aten.view`), so such a chain stays in the kernel."""
    returned = list(_return(kernel).operands)
    args = list(_block(kernel).arguments)
    for i, value in enumerate(returned):
        chain, base = _view_chain(value)
        if not chain or base in args or not _only_host_ops_read(call.results[i]):
            continue
        permuted = False
        for op in chain:
            permuted = permuted or op.name in _PERMUTING
            if permuted and op.name in _RESHAPING:
                break
        else:
            if not any(op.name in _PERMUTING for op in chain):
                continue  # a reshape alone costs the kernel nothing: leave it
            if base in returned:
                index = returned.index(base)
            else:
                _set_returns(kernel, returned + [base])
                call = _rebuild(call, kernel, list(call.operands), list(call.results) + [None])
                index = len(returned)
            ops = [op.operation for op in call.parent.regions[0].blocks[0].operations]
            after = ops[ops.index(call) + 1]  # the host function's return, at the latest
            view = _clone_chain(chain, call.results[index], after)
            _mark_host(view, chain)
            call.results[i].replace_all_uses_with(view)
            _drop_results(call, kernel, {i})
            return True
    return False


def _sink_one(call: ir.Operation, kernels: dict, once: set) -> bool:
    """Sinks the first view result of `call` that only kernel calls (each the only call of
    its kernel) read into those kernels. Returns whether one was sunk."""
    kernel = kernels[_callee(call)]
    args = list(_block(kernel).arguments)
    for i, value in enumerate(_return(kernel).operands):
        uses = [u.owner for u in call.results[i].uses]
        if not uses or not all(isinstance(u, ir.OpView) and u.operation in once for u in uses):
            continue
        chain, base = _view_chain(value)
        if not chain:
            continue
        # The value the consumers take instead, on the host.
        returned = list(_return(kernel).operands)
        if base in args:
            host_base = call.operands[args.index(base)]
        elif base in returned:
            host_base = call.results[returned.index(base)]
        else:
            _set_returns(kernel, returned + [base])
            call = _rebuild(call, kernel, list(call.operands), list(call.results) + [None])
            host_base = call.results[len(returned)]
        old = call.results[i]
        consumers = []
        for u in uses:
            if u.operation not in consumers:
                consumers.append(u.operation)
        for consumer in consumers:
            target = kernels[_callee(consumer)]
            consumer, arg = _argument_for(consumer, target, host_base)
            body = _block(target)
            first = list(body.operations)[0].operation
            for j, operand in enumerate(consumer.operands):
                if operand == old:
                    view = _clone_chain(chain, arg, first)
                    body.arguments[j].replace_all_uses_with(view)
            _drop_unused_args(consumer, target)
        _drop_results(call, kernel, {i})
        return True
    return False
