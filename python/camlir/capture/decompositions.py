"""The aten decompositions camlir applies while re-tracing a captured backward.

Kept minimal on purpose: an op is decomposed here only when torch-mlir cannot lower it to
linalg (measured on the zoo and the per-op tests, see docs/op-coverage.md). Everything
torch-mlir lowers stays whole, in particular matmul-class ops (`mm`, `addmm`, `bmm`) and
`convolution`/`convolution_backward`, which camlir's JIT hands to BLAS-like kernels; and
the backward formulas torch-mlir handles (softmax, GELU, threshold, NLL, max-pool, ...).

Not used: torch-mlir's `fx_decomp_util` table and PyTorch's core-aten table. They are
written for `torch.export` forward graphs and decompose far more (e.g. `addmm` into
`mm` + `add`, `_log_softmax` into elementwise ops); the core table also emits
`squeeze.dims`, which torch-mlir rejects.

The `camlir::` leaves (hooks, accumulation) are custom ops with no decomposition, so
tracing leaves them alone.
"""

import functools
from typing import Optional

import torch
from torch._decomp import get_decompositions

aten = torch.ops.aten

# Each: torch-mlir has no linalg lowering for the op (it fails to convert, or is not a
# torch-dialect op at all and is imported as `torch.operator`); PyTorch's decomposition
# gives ops it does lower. The decomposed forms are in comments.
_DECOMPOSED = [
    # LayerNormBackward0: reductions and elementwise ops.
    aten.native_layer_norm_backward,
    # NativeBatchNormBackward0 (training and eval): reductions and elementwise ops.
    aten.native_batch_norm_backward,
    # EmbeddingBackward0: a masked `_unsafe_index_put(accumulate=True)` (a scatter-add,
    # lowered to `tm_tensor.scatter`, then loops).
    aten.embedding_dense_backward,
    aten._unsafe_masked_index_put_accumulate,
    # IndexSelectBackward0 writes `zeros().index_add_()`: an `index_put(accumulate=True)`.
    aten.index_add,
    # SliceBackward0 / SelectBackward0: `new_zeros` + `slice_scatter` / `select_scatter`
    # (tensor.insert_slice).
    aten.slice_backward,
    aten.select_backward,
    # Beyond the zoo, same reason (measured by the single-op cases): SiLUBackward0,
    # NativeGroupNormBackward0, MseLossBackward0, SmoothL1LossBackward0 become elementwise
    # ops and reductions.
    aten.silu_backward,
    aten.native_group_norm_backward,
    aten.mse_loss_backward,
    aten.smooth_l1_loss_backward,
    # LeakyReluBackward0: torch-mlir lowers it WRONG (as `min(0, x) * slope + max(0, grad)`,
    # the forward's shape, not `grad * (x > 0 ? 1 : slope)`); found by the program fuzzer.
    aten.leaky_relu_backward,
    # Activation backwards torch-mlir has no lowering for (each was a host op that cut the
    # backward into several kernels: MobileNetV3's hardswish/hardsigmoid made ~62 kernels).
    # PyTorch's decompositions are `where`s and elementwise ops with eager's boundaries:
    # hardswish: 0 for x <= -3, grad*(x/3 + 0.5) for -3 < x < 3, grad for x >= 3;
    # hardsigmoid: grad/6 for -3 < x < 3, else 0. Mish, log-sigmoid (reads the forward's
    # saved `buffer` = exp(-|x|), as eager's cpu kernel does), PReLU, GLU (slices + cat).
    aten.hardswish_backward,
    aten.hardsigmoid_backward,
    aten.mish_backward,
    aten.log_sigmoid_backward,
    aten._prelu_kernel_backward,
    aten.glu_backward,
    # HardtanhBackward0 (also ReLU6's): torch-mlir lowers it with the wrong boundaries, the
    # gradient passes at x == min_val and x == max_val where eager's is 0 (measured: relu6
    # at x = 0 and 6, hardtanh at -1 and 1).
    aten.hardtanh_backward,
    # RreluWithNoiseBackward0 (F.rrelu(training=False)): torch-mlir's lowering returned
    # x * slope instead of grad * slope; PyTorch's decomposition is leaky_relu_backward
    # (decomposed above) in eval mode and grad * noise in training.
    aten.rrelu_with_noise_backward,
    # NaN: torch-mlir lowers these with compares that drop NaN where eager propagates it
    # (eager's kernels compare so that a NaN input passes through). ReluBackward0
    # (`threshold_backward`, `cmpf ule`) gave 0 where eager's gradient is NaN; clamp, clamp_min,
    # clamp_max, hardtanh (relu6), threshold and softplus_backward gave a bound, a value or
    # the gradient instead of NaN. PyTorch's decompositions are `where`s on `<=`/`>`/`isnan`,
    # which torch-mlir lowers with eager's NaN behaviour (found by the ModuleInfo run:
    # LPPool1d, whose forward makes NaN from negative inputs, and measured per op).
    aten.threshold_backward,
    aten.threshold,
    aten.softplus_backward,
    aten.clamp,
    aten.clamp_min,
    aten.clamp_max,
    aten.hardtanh,
]


def _gelu_backward(grad, x, approximate="none"):
    """GeluBackward0 with approximate='tanh': torch-mlir's lowering uses sqrt(2/pi) =
    0.797724 (the true value is 0.7978846), a relative error of 2e-4 in every gradient
    (100x eager's error against a float64 reference). PyTorch's decomposition is exact;
    the erf form ('none') lowers right and stays whole."""
    if approximate != "tanh":
        return NotImplemented
    from torch._decomp.decompositions import gelu_backward

    return gelu_backward(grad, x, approximate=approximate)


def _shrink_backward(grad, x, lambd):
    """SoftshrinkBackward0 / HardshrinkBackward0 (no lowering in torch-mlir, no PyTorch
    decomposition): eager's cpu kernel gives 0 where -lambd <= x <= lambd (both ends
    included), else grad; NaN passes grad, as there."""
    return torch.where((x >= -lambd) & (x <= lambd), torch.zeros_like(grad), grad)


def _maximum(a, b):
    """`maximum` with eager's NaN: NaN if either is NaN (torch-mlir's `cmpf ogt` + select
    gave the other operand). `(a > b) | isnan(a)` picks `a`, else `b` (NaN when `b` is)."""
    if not (a.is_floating_point() and isinstance(b, torch.Tensor) and b.dtype == a.dtype):
        return NotImplemented
    return torch.where((a > b) | (a != a), a, b)


def _minimum(a, b):
    """`minimum` with eager's NaN (see `_maximum`)."""
    if not (a.is_floating_point() and isinstance(b, torch.Tensor) and b.dtype == a.dtype):
        return NotImplemented
    return torch.where((a < b) | (a != a), a, b)


def _arg_extreme(largest: bool):
    """`argmax`/`argmin` with eager's NaN and ties: the index of the first NaN along the
    dimension if there is one, else of the first extreme value. torch-mlir's lowering compares
    with `cmpf` and gave index 0 for a row holding a NaN. Written without `argmax`/`argmin`
    (the decomposition would call itself): the extreme value by `amax`/`amin` with NaN
    replaced, then the smallest index that holds it."""

    def decomposition(x, dim=None, keepdim=False):
        if not x.is_floating_point() or x.dim() == 0:
            return NotImplemented
        source = x
        if dim is None:
            x, dim = x.reshape(-1), 0
        dim = dim % x.dim()
        n = x.shape[dim]
        if n == 0:
            return NotImplemented
        nan = x != x
        fill = float("-inf") if largest else float("inf")
        clean = torch.where(nan, torch.full_like(x, fill), x)
        extreme = torch.amax(clean, dim, keepdim=True) if largest else torch.amin(clean, dim, keepdim=True)
        has_nan = torch.amax(nan.to(torch.int32), dim, keepdim=True) > 0
        hit = torch.where(has_nan, nan, clean == extreme)
        shape = [1] * x.dim()
        shape[dim] = n
        positions = torch.arange(n, dtype=torch.int64, device=x.device).reshape(shape)
        index = torch.amin(torch.where(hit, positions, torch.full_like(positions, n)), dim, keepdim=True)
        if source.dim() != x.dim():  # dim=None: one index into the flattened tensor
            return index.reshape([1] * source.dim()) if keepdim else index.reshape(())
        return index if keepdim else index.squeeze(dim)

    return decomposition


def _smooth_l1_loss_backward(grad, x, target, reduction, beta):
    """SmoothL1LossBackward0 as eager's cpu kernel branches: -g for d <= -beta, g for
    d >= beta, else g * d / beta (d = x - target, g = grad * norm). PyTorch's decomposition
    takes `sign(d)` outside |d| < beta, which is 0 for a NaN d where eager's gradient is NaN.
    bf16/f16 in float32, rounded once, as eager."""
    low = _low_precision((grad, x, target))
    grad, x, target = _f32(grad), _f32(x), _f32(target)
    norm = 1.0 / x.numel() if reduction == 1 else 1.0  # Reduction.MEAN
    d = x - target
    g = grad * norm
    out = torch.where(d <= -beta, -g, torch.where(d >= beta, g, g * d / beta))
    return out.to(low) if low is not None else out


def _reciprocal(x):
    """`reciprocal` as a division: torch-mlir's lowering guards it with a `cf.assert` that no
    element is 0 (nor NaN: the compare is ordered), and that assert aborts the process where
    eager gives inf (or NaN)."""
    if not x.is_floating_point():
        return NotImplemented
    return torch.div(torch.ones((), dtype=x.dtype), x)


def _embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """EmbeddingBackward0 with the indices made at least 1-d: from a 0-d index (one looked-up
    row, `F.embedding(torch.tensor(5), w)`), PyTorch's decomposition builds an index_put
    that torch-mlir's lowering loops on forever (a hang, found by the OpInfo run)."""
    from torch._decomp.decompositions import embedding_dense_backward

    if indices.dim() == 0:
        indices = indices.reshape(1)
        grad = grad.reshape(1, grad.shape[-1])
    return embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq)


class _Reentry:
    active = False


def _index_put(op):
    """`index_put` / `_unsafe_index_put` with negative integer indices wrapped
    (`where(i < 0, i + size, i)`): torch-mlir's lowering (a `tm_tensor.scatter`) uses them
    as they are and writes before the tensor. IndexBackward0 of `x[..., [-2], :]` (Falcon's
    multi-query attention) gave wrong gradients on the cpu backend or corrupted the heap
    (found by test/python/model_sweep.py). Boolean masks are left alone. The wrapped op is
    traced whole (the re-entry guard keeps this from decomposing it again)."""

    def decomposition(self, indices, values, accumulate=False):
        if _Reentry.active or all(i is None or i.dtype in (torch.bool, torch.uint8) for i in indices):
            return NotImplemented
        wrapped, dim = [], 0
        for i in indices:
            if i is None or i.dtype in (torch.bool, torch.uint8):
                wrapped.append(i)
                dim += 1 if i is None else i.dim()
                continue
            wrapped.append(torch.where(i < 0, i + self.shape[dim], i))
            dim += 1
        _Reentry.active = True
        try:
            return op(self, wrapped, values, accumulate)
        finally:
            _Reentry.active = False

    return decomposition


_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _sum_dim(x, dim=None, keepdim=False, *, dtype=None):
    """A bf16/f16 sum accumulates in float32, as eager's kernels do: torch-mlir's lowering
    accumulates in the element type, and a 2,000-row bf16 bias gradient was off by 6.1
    where eager's error is 0.13 (found by the fuzzer)."""
    if dtype is not None or x.dtype not in _LOW_PRECISION:
        return NotImplemented
    return aten.sum.dim_IntList(x, dim, keepdim, dtype=torch.float32).to(x.dtype)


def _sum(x, *, dtype=None):
    if dtype is not None or x.dtype not in _LOW_PRECISION:
        return NotImplemented
    return aten.sum.default(x, dtype=torch.float32).to(x.dtype)


def _mean_dim(x, dim=None, keepdim=False, *, dtype=None):
    """A bf16/f16 mean accumulates (and divides) in float32, as eager's kernels do."""
    if dtype is not None or x.dtype not in _LOW_PRECISION:
        return NotImplemented
    return aten.mean.dim(x, dim, keepdim, dtype=torch.float32).to(x.dtype)


def _mean(x, *, dtype=None):
    if dtype is not None or x.dtype not in _LOW_PRECISION:
        return NotImplemented
    return aten.mean.default(x, dtype=torch.float32).to(x.dtype)


def _low_precision(args) -> Optional[torch.dtype]:
    """The dtype of the first bf16/f16 tensor among `args`, else None."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype in _LOW_PRECISION:
            return a.dtype
    return None


def _f32(a):
    return a.to(torch.float32) if isinstance(a, torch.Tensor) and a.dtype in _LOW_PRECISION else a


def _in_float32(op, dtype_arg: Optional[int] = None):
    """`op` on bf16/f16 tensors computed in float32 and rounded once, as eager's cpu kernel
    computes it (in "opmath" float32). torch-mlir lowers such an op to a chain of bf16 ops,
    each rounding (GELU's backward: erf, exp, several products), and the gradients of a
    bf16 MLP drifted by up to 4x the bf16 tolerance from eager's. Matmuls go through f32 too:
    their products of bf16 values are exact in f32, both accumulate in f32, and the f32
    matmul becomes MKL's sgemm (the bf16 one ran as plain loops). `dtype_arg`: the position
    of an argument naming the result dtype (softmax backwards' `input_dtype`), which becomes
    float32 for the inner call; the result is cast back to it."""

    def decomposition(*args, **kwargs):
        low = _low_precision(args)
        if low is None:
            return NotImplemented
        args = [_f32(a) for a in args]
        result_dtype = low
        if dtype_arg is not None:
            result_dtype = args[dtype_arg] if args[dtype_arg] not in _LOW_PRECISION else low
            args[dtype_arg] = torch.float32 if args[dtype_arg] in _LOW_PRECISION else args[dtype_arg]
        out = op(*args, **kwargs)
        return out.to(result_dtype)

    return decomposition


def _softmax_like(op):
    """`_softmax`/`_log_softmax(x, dim, half_to_float)` on bf16/f16: in float32, rounded once
    (or kept in float32 with `half_to_float`)."""

    def decomposition(x, dim, half_to_float):
        if x.dtype not in _LOW_PRECISION:
            return NotImplemented
        out = op(x.to(torch.float32), dim, False)
        return out if half_to_float else out.to(x.dtype)

    return decomposition


# Ops eager computes in float32 for bf16/f16 tensors, rounding once (see `_in_float32`).
# PyTorch's decompositions used above (`_DECOMPOSED`) already do (`pw_cast_for_opmath`).
_FLOAT32_OPS = [aten.gelu_backward.default, aten.gelu.default, aten.tanh_backward.default,
                aten.sigmoid_backward.default, aten.elu_backward.default, aten.softplus_backward.default,
                aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default]


@functools.cache
def decomposition_table() -> dict:
    """OpOverload -> decomposition, for `make_fx(..., decomposition_table=...)` (shared: do
    not modify)."""
    table = get_decompositions(_DECOMPOSED)
    table[aten.gelu_backward.default] = _gelu_backward
    table[aten.embedding_dense_backward.default] = _embedding_dense_backward
    table[aten.maximum.default] = _maximum
    table[aten.minimum.default] = _minimum
    table[aten.reciprocal.default] = _reciprocal
    table[aten.argmax.default] = _arg_extreme(largest=True)
    table[aten.argmin.default] = _arg_extreme(largest=False)
    table[aten.constant_pad_nd.default] = _constant_pad_nd
    table[aten.smooth_l1_loss_backward.default] = _smooth_l1_loss_backward
    table[aten.softshrink_backward.default] = _shrink_backward
    table[aten.hardshrink_backward.default] = _shrink_backward
    table[aten.sum.dim_IntList] = _sum_dim
    table[aten.sum.default] = _sum
    table[aten.mean.dim] = _mean_dim
    table[aten.mean.default] = _mean
    table[aten.index_put.default] = _index_put(aten.index_put.default)
    table[aten._unsafe_index_put.default] = _index_put(aten._unsafe_index_put.default)
    for op in _FLOAT32_OPS:
        inner = table.get(op)
        table[op] = _first_of(_in_float32(op), inner) if inner else _in_float32(op)
    for op in (aten._softmax_backward_data.default, aten._log_softmax_backward_data.default):
        table[op] = _first_of(_softmax_backward_0d(op), _in_float32(op, dtype_arg=3))
    table[aten._softmax.default] = _softmax_like(aten._softmax.default)
    table[aten._log_softmax.default] = _softmax_like(aten._log_softmax.default)
    return table


def _softmax_backward_0d(op):
    """`_softmax_backward_data` / `_log_softmax_backward_data` of a 0-d tensor: torch-mlir's
    lowering never returns (a HANG, found by the ModuleInfo run: `nn.Softmax(0)` on a scalar).
    The same op on the one-element vector, reshaped back."""

    def decomposition(grad, output, dim, input_dtype):
        if grad.dim() != 0:
            return NotImplemented
        return op(grad.reshape(1), output.reshape(1), 0, input_dtype).reshape(())

    return decomposition


def _constant_pad_nd(x, pad, value=0):
    """`constant_pad_nd` with negative pads (the backward of a padding: ZeroPad/ConstantPad,
    LocalResponseNorm) as slices first, then the non-negative pads: torch-mlir's lowering
    of a negative pad failed to bufferize ("expected offsets to be non-negative") and the
    graph ran on the reference interpreter."""
    if all(p >= 0 for p in pad):
        return NotImplemented
    for i in range(len(pad) // 2):
        dim = x.dim() - 1 - i
        left, right = pad[2 * i], pad[2 * i + 1]
        start = -left if left < 0 else 0
        end = x.shape[dim] + right if right < 0 else x.shape[dim]
        if start or end != x.shape[dim]:
            x = aten.slice.Tensor(x, dim, start, max(start, end))
    rest = [max(p, 0) for p in pad]
    return aten.constant_pad_nd.default(x, rest, value) if any(rest) else aten.clone.default(x)


def _first_of(*decompositions):
    """The first of `decompositions` that does not return NotImplemented."""

    def decomposition(*args, **kwargs):
        for d in decompositions:
            out = d(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return NotImplemented

    return decomposition
