"""Opaque leaves for re-tracing: hooks and gradient accumulation as `torch.library` ops.

While a captured backward is re-traced to aten ops, hooks must not run (they are recorded,
never executed with real data at capture time) and accumulation must not turn into copies.
Each becomes one call of a `camlir::` custom op whose fake implementation only produces
outputs of the right shape; the importer turns them into `ca.hook` / `ca.accumulate_grad`.
The graph carries the hook's index in the backward's hook list, not the hook itself.

The real implementations run the hooks found in `current_hooks` (set by whoever executes a
re-traced graph directly, e.g. when debugging); camlir's own backends run `ca` ops instead.
"""

import threading
from typing import Optional

import torch
from torch import Tensor
from torch._dynamo.external_utils import call_accumulate_grad, call_hook

_state = threading.local()


def set_current_hooks(hooks) -> None:
    """For running a re-traced aten graph directly (debugging): the hooks its leaves call."""
    _state.hooks = hooks


def _hook(hook_id: int):
    hooks = getattr(_state, "hooks", None)
    if hooks is None:
        raise RuntimeError("camlir: no hooks registered for this backward call")
    return hooks[hook_id]


def _unalias(out, inputs):
    # Custom ops may not return an input itself (a hook returning None or its argument).
    return out.clone() if any(out is i for i in inputs) else out


@torch.library.custom_op("camlir::tensor_pre_hook", mutates_args=())
def tensor_pre_hook(hook_id: int, grad: Tensor) -> Tensor:
    """`camlir::tensor_pre_hook`: hook `hook_id` on one gradient (`Tensor.register_hook`);
    returns the gradient it hands on. Imported as `ca.hook` of kind `tensor_pre_hook`."""
    return _unalias(call_hook(_hook(hook_id), grad, hook_type="tensor_pre_hook"), [grad])


@tensor_pre_hook.register_fake
def _(hook_id, grad):
    return torch.empty_like(grad)


@torch.library.custom_op("camlir::cpp_tensor_pre_hook", mutates_args=())
def cpp_tensor_pre_hook(hook_id: int, grad: Tensor) -> Tensor:
    """`camlir::cpp_tensor_pre_hook`: the autograd engine's C++ hooks on one gradient (what
    `retain_grad()` registers), number `hook_id` of the running backward; returns the
    gradient they hand on. Imported as `ca.hook` of kind `cpp_tensor_pre_hook`. Run for real
    only by a compiled backward: at re-trace time it must not store a fake tensor in `.grad`."""
    out = torch._C._dynamo.compiled_autograd.call_cpp_tensor_pre_hooks(hook_id, grad)
    return _unalias(out, [grad])


@cpp_tensor_pre_hook.register_fake
def _(hook_id, grad):
    return torch.empty_like(grad)


def with_nones(present: list, none_at: list) -> list:
    """The full gradient list a hook sees: `present` with None at the positions `none_at`
    (autograd passes None for outputs that got no gradient)."""
    full, it = [], iter(present)
    for i in range(len(present) + len(none_at)):
        full.append(None if i in none_at else next(it))
    return full


def without_nones(full, none_at: list, kind: str) -> list:
    """A hook's returned list back to the present gradients. A hook that returns a tensor
    where autograd had None would change the graph's structure: refused loudly."""
    out = []
    for i, g in enumerate(full):
        if i in none_at:
            if g is not None:
                raise RuntimeError(f"camlir: a {kind} returned a gradient at position {i}, where autograd "
                                   f"had None; camlir cannot run that backward")
        else:
            out.append(g)
    return out


@torch.library.custom_op("camlir::pre_hook", mutates_args=())
def pre_hook(hook_id: int, grads: list[Tensor], none_at: list[int]) -> list[Tensor]:
    """`camlir::pre_hook`: hook `hook_id` on a node's grad_outputs before it runs
    (`Node.register_prehook`); `grads` are the present ones, None sits at `none_at`.
    Returns the present gradients the hook hands on. Imported as `ca.hook`."""
    out = call_hook(_hook(hook_id), with_nones(grads, none_at), hook_type="pre_hook")
    return [_unalias(o, grads) for o in without_nones(out, none_at, "pre_hook")]


@pre_hook.register_fake
def _(hook_id, grads, none_at):
    return [torch.empty_like(g) for g in grads]


@torch.library.custom_op("camlir::post_hook", mutates_args=())
def post_hook(hook_id: int, grad_inputs: list[Tensor], grad_outputs: list[Tensor],
              none_at: list[int], none_at_outputs: list[int]) -> list[Tensor]:
    """`camlir::post_hook`: hook `hook_id` after a node ran (`Node.register_hook`); the
    present grad_inputs and grad_outputs, with None at `none_at` / `none_at_outputs`.
    Returns the present grad_inputs to use. Imported as `ca.hook` of kind `post_hook`."""
    out = call_hook(_hook(hook_id), with_nones(grad_inputs, none_at),
                    with_nones(grad_outputs, none_at_outputs), hook_type="post_hook")
    return [_unalias(o, grad_inputs + grad_outputs) for o in without_nones(out, none_at, "post_hook")]


@post_hook.register_fake
def _(hook_id, grad_inputs, grad_outputs, none_at, none_at_outputs):
    return [torch.empty_like(g) for g in grad_inputs]


@torch.library.custom_op("camlir::post_acc_grad_hook", mutates_args=())
def post_acc_grad_hook(hook_id: int, param: Tensor) -> None:
    """`camlir::post_acc_grad_hook`: hook `hook_id` on `param` after its `.grad` was
    accumulated (`Tensor.register_post_accumulate_grad_hook`); returns nothing."""
    call_hook(_hook(hook_id), param, hook_type="post_acc_grad_hook")


@post_acc_grad_hook.register_fake
def _(hook_id, param):
    return None


@torch.library.custom_op("camlir::accumulate_grad", mutates_args=())
def accumulate_grad(param: Tensor, old_grad: Optional[Tensor], grad: Tensor, has_post_hooks: bool) -> None:
    """`camlir::accumulate_grad`: accumulates `grad` into `param.grad` as the engine does.
    Imported as `ca.accumulate_grad(param, grad)` (`old_grad` and the flag are dropped)."""
    # The side effect is on `param.grad`, not on tensor data, so the op declares no mutation;
    # the `ca` dialect keeps it alive and ordered (ca.accumulate_grad).
    call_accumulate_grad(param, old_grad, grad, has_post_hooks)


@accumulate_grad.register_fake
def _(param, old_grad, grad, has_post_hooks):
    return None


@torch.library.custom_op("camlir::unpack_hook", mutates_args=())
def unpack_hook(hook_id: int, data_id: int, size: list[int], stride: list[int], dtype: torch.dtype) -> Tensor:
    """`camlir::unpack_hook`: saved-tensor unpack hook `hook_id` on packed value `data_id`
    (what its pack hook returned); returns the tensor a node saved. `size`, `stride` and
    `dtype` are what the capture's first run saw (the fake result's metadata). Imported as
    `ca.hook` of kind `unpack_hook`; never run at trace time."""
    raise RuntimeError("camlir::unpack_hook runs only inside a compiled backward (the packed data "
                       "lives in the backward call)")


@unpack_hook.register_fake
def _(hook_id, data_id, size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype)


@torch.library.custom_op("camlir::custom_backward", mutates_args=())
def custom_backward(hook_id: int, saved: list[Tensor], saved_none_at: list[int], grads: list[Tensor],
                    none_at: list[int], outputs: list[int], sizes: list[int], ranks: list[int],
                    dtypes: list[int]) -> list[Tensor]:
    """`camlir::custom_backward`: the backward of the custom autograd.Function whose `ctx`
    is hook `hook_id`, run in Python (a host call: camlir could not trace it). `saved` and
    `grads` are the present saved tensors and grad_outputs, None at `saved_none_at` /
    `none_at`. Returns entries `outputs` of the backward's result, shaped as the engine
    wants them: result i has the next `ranks[i]` of `sizes` and dtype number `dtypes[i]`
    (what the node's input metadata says). Imported as `ca.hook` of kind `custom_backward`;
    never run at trace time."""
    raise RuntimeError("camlir::custom_backward runs only inside a compiled backward (its ctx lives in "
                       "the backward call)")


@custom_backward.register_fake
def _(hook_id, saved, saved_none_at, grads, none_at, outputs, sizes, ranks, dtypes):
    out, at = [], 0
    for rank, dtype in zip(ranks, dtypes):
        out.append(torch.empty(sizes[at:at + rank], dtype=DTYPES[dtype]))
        at += rank
    return out


# PyTorch's ScalarType numbering (c10/core/ScalarType.h), as compiled autograd's input
# metadata carries a dtype: the floating and integer types a gradient can have.
DTYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
          6: torch.float32, 7: torch.float64, 9: torch.complex64, 10: torch.complex128, 11: torch.bool,
          15: torch.bfloat16}


LEAF_OPS = {
    "camlir.tensor_pre_hook": "tensor_pre_hook",
    "camlir.cpp_tensor_pre_hook": "cpp_tensor_pre_hook",
    "camlir.pre_hook": "pre_hook",
    "camlir.post_hook": "post_hook",
    "camlir.post_acc_grad_hook": "post_acc_grad_hook",
    "camlir.unpack_hook": "unpack_hook",
    "camlir.custom_backward": "custom_backward",
}

# Every leaf has an effect that no result shows (a hook runs Python; accumulation writes
# `.grad`), so FX must never drop one as dead code. torch-mlir's importer runs FX's
# dead-code elimination when it rewrites `as_strided`, and with the leaves declared pure it
# deleted every accumulation of such a backward (no gradient at all, no error).
for _op in (tensor_pre_hook, cpp_tensor_pre_hook, pre_hook, post_hook, post_acc_grad_hook, unpack_hook,
            custom_backward, accumulate_grad):
    torch.fx.node.has_side_effect(_op._opoverload)
