"""The backward of a depthwise convolution as slices, products and sums camlir compiles.

A depthwise convolution (`groups` = input channels = output channels, MobileNet's and
EfficientNet's 3x3/5x5 layers, ConvNeXt's 7x7) is little arithmetic per element, and
PyTorch's CPU backward for it is slow at the batch sizes of a training step: on
MobileNetV3-small's layers (batch 8, 1 thread) `convolution_backward` took 0.16-1.45 ms per
depthwise layer, 8.6 of the 11.9 ms that all its 52 convolutions' backwards took
(`aten.convolution_backward` timed alone on each layer's own tensors). torch-mlir has no
lowering for a grouped `convolution_backward`, so it ran on the host.

Here it is written as what it is, one term per kernel tap (i, j); camlir fuses the terms:
- input gradient: `grad_y` scattered (stride) and padded once, then
  `sum over taps of shifted_slice(grad_y) * weight[:, 0, i, j]`, a single elementwise loop
  with one read per tap;
- weight gradient: per tap, `sum over (n, h, w) of grad_y * strided_slice(padded x)`;
- bias gradient: `grad_y` summed over (n, h, w).

Only where the result is exact and the form is a win: small output maps
(`MAX_OUTPUT_POSITIONS`), 1-3 spatial dims, static sizes,
float32/float64 (eager accumulates half types in float32 inside its kernel), no channel
multiplier, not transposed, padding at most the kernel's reach (`(k-1)*dilation`), and at
most `MAX_TAPS` taps. Anything else returns NotImplemented and stays one host op.
"""

import itertools
import math

import torch

aten = torch.ops.aten

# 7x7 (ConvNeXt) is 49 taps; a tap is one more operand of the fused input-gradient loop and
# one more reduction for the weight gradient.
MAX_TAPS = 64
_DTYPES = (torch.float32, torch.float64)
# Where eager's own backward is slow: maps of at most 4x4 outputs (the late layers of a
# mobile network). Measured per layer of MobileNetV3-small (batch 8, 1 thread, backward
# alone; eager against camlir's program): 576 channels 2x2 5x5 taps 1.58 ms against
# 0.55; 240 at 4x4 1.20 against 0.74; 96 at 8x8 -> 4x4 (stride 2) 0.64 against 0.54. On
# larger maps eager's kernel wins: 88 at 8x8 0.28 against 0.38-0.43; 72 at 16x16 -> 8x8
# 0.46 against 0.65; 16 at 32x32 -> 16x16 0.40 against 0.53.
MAX_OUTPUT_POSITIONS = 16


def _static(*sizes) -> bool:
    return all(type(s) is int for group in sizes for s in group)


def depthwise_convolution_backward(grad_y, x, weight, bias_sizes, stride, padding, dilation, transposed,
                                   output_padding, groups, output_mask):
    """`aten.convolution_backward` for a depthwise convolution (see the module docstring);
    NotImplemented for any other convolution."""
    spatial = x.dim() - 2
    if (transposed or spatial not in (1, 2, 3) or x.dtype not in _DTYPES or grad_y.dtype != x.dtype
            or weight.dtype != x.dtype or not _static(x.shape, grad_y.shape, weight.shape)):
        return NotImplemented
    channels = x.shape[1]
    if groups != channels or tuple(weight.shape[:2]) != (channels, 1) or grad_y.shape[1] != channels:
        return NotImplemented
    stride, padding, dilation = (_per_dim(v, spatial) for v in (stride, padding, dilation))
    if stride is None or padding is None or dilation is None:
        return NotImplemented
    kernel = list(weight.shape[2:])
    taps = list(itertools.product(*(range(k) for k in kernel)))
    if math.prod(grad_y.shape[2:]) > MAX_OUTPUT_POSITIONS or len(taps) > MAX_TAPS or any(p > (k - 1) * d for p, k, d in zip(padding, kernel, dilation)):
        return NotImplemented
    reduce_dims = [0] + list(range(2, x.dim()))
    grad_x = grad_w = grad_b = None
    if output_mask[0]:
        grad_x = _input_grad(grad_y, weight, x.shape, stride, padding, dilation, kernel, taps)
    if output_mask[1]:
        grad_w = _weight_grad(grad_y, x, stride, padding, dilation, kernel, taps, reduce_dims)
    if output_mask[2]:
        grad_b = aten.sum.dim_IntList(grad_y, reduce_dims)
    return grad_x, grad_w, grad_b


def _per_dim(values, spatial):
    values = list(values)
    if len(values) == 1:
        values = values * spatial
    if len(values) != spatial or not all(type(v) is int and v >= 0 for v in values):
        return None
    return values


def _input_grad(grad_y, weight, x_shape, stride, padding, dilation, kernel, taps):
    """grad_x[h] = sum over taps i of grad_y[o] * w[i] where h = o*s - p + i*d. With grad_y
    placed at `(k-1)*d - p + o*s` in a zero tensor of extent `(k-1)*d + H` (call it g), the
    tap i reads g at `h + (k-1-i)*d`: one shifted slice per tap."""
    out_sizes = list(grad_y.shape[2:])
    lefts = [(k - 1) * d - p for k, d, p in zip(kernel, dilation, padding)]
    extents = [(k - 1) * d + h for k, d, h in zip(kernel, dilation, x_shape[2:])]
    if all(s == 1 for s in stride):
        pads = []
        for left, extent, o in reversed(list(zip(lefts, extents, out_sizes))):
            pads += [left, extent - left - o]
        g = aten.constant_pad_nd.default(grad_y, pads, 0.0)
    else:
        g = grad_y
        for axis, (left, extent, s, o) in enumerate(zip(lefts, extents, stride, out_sizes)):
            dim = axis + 2
            shape = list(g.shape)
            shape[dim] = extent
            zeros = aten.new_zeros.default(g, shape)
            g = aten.slice_scatter.default(zeros, g, dim, left, left + (o - 1) * s + 1, s)
    channels = weight.shape[0]
    # taps first: one select per tap gives its (1, C, 1, ...) column
    columns = aten.view.default(aten.permute.default(aten.view.default(weight, [channels, len(taps)]), [1, 0]),
                                [len(taps), 1, channels] + [1] * len(kernel))
    starts = [[(k - 1 - i) * d for i in range(k)] for k, d in zip(kernel, dilation)]
    total = None
    for t, (tap, shifted) in enumerate(_windows(g, taps, starts, list(x_shape[2:]), [1] * len(kernel))):
        term = aten.mul.Tensor(shifted, aten.select.int(columns, 0, t))
        total = term if total is None else aten.add.Tensor(total, term)
    return total


def _windows(source, taps, starts, sizes, steps):
    """(tap, slice of `source` for it) for each tap in order: along spatial dim a, from
    `starts[a][tap[a]]`, `sizes[a]` elements `steps[a]` apart. A slice shared by taps with
    the same leading indices is made once (k + k^2 slice ops for a k x k kernel, not 2k^2:
    each op costs ~1 ms to re-trace)."""
    made = {(): source}
    for tap in taps:
        for depth in range(1, len(tap) + 1):
            key = tap[:depth]
            if key not in made:
                axis = depth - 1
                start = starts[axis][tap[axis]]
                made[key] = aten.slice.Tensor(made[key[:-1]], axis + 2, start,
                                              start + (sizes[axis] - 1) * steps[axis] + 1, steps[axis])
        yield tap, made[tap]


def _weight_grad(grad_y, x, stride, padding, dilation, kernel, taps, reduce_dims):
    """grad_w[c, i] = sum over (n, o) of grad_y[n, c, o] * x_padded[n, c, o*s + i*d]: one
    strided slice, product and reduction per tap."""
    pads = []
    for p in reversed(padding):
        pads += [p, p]
    xp = aten.constant_pad_nd.default(x, pads, 0.0) if any(padding) else x
    out_sizes = list(grad_y.shape[2:])
    starts = [[i * d for i in range(k)] for k, d in zip(kernel, dilation)]
    sums = [aten.sum.dim_IntList(aten.mul.Tensor(grad_y, window), reduce_dims)
            for _, window in _windows(xp, taps, starts, out_sizes, stride)]
    stacked = aten.stack.default(sums, 1)
    return aten.view.default(stacked, [x.shape[1], 1] + kernel)
