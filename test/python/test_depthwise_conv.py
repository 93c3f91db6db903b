"""Depthwise convolution backwards compiled as camlir window loops (passes/depthwise_kernels.py),
and the view folding that lets the loops stage vectorize slices (passes/fold_views.py)."""

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import camlir
from camlir.passes import depthwise_kernels
from helpers import assert_grads_equal, eager_and_camlir
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _cases():
    """Spatial rank, kernel, stride, dilation (the last dim's is 1), padding, input extent,
    bias: strides and dilations past 1, padding up to the kernel's reach, odd extents, at
    most 16 output positions."""
    for spatial, (k, s, d, p, h, bias) in itertools.product(
            (1, 2, 3), [(3, 1, 1, 1, 4, False), (5, 1, 1, 2, 2, True), (3, 2, 1, 1, 7, False),
                        (2, 1, 2, 0, 5, True), (5, 2, 1, 2, 8, False), (3, 3, 2, 2, 7, True),
                        (1, 1, 1, 0, 3, False)]):
        if spatial == 3 and k == 5:
            continue  # 125 taps: past MAX_TAPS
        dil = [d] * (spatial - 1) + [1]
        out = [(h + 2 * p - di * (k - 1) - 1) // s + 1 for di in dil]
        if math.prod(out) <= depthwise_kernels.MAX_OUTPUT_POSITIONS:
            yield spatial, k, s, dil, p, h, bias


def _host_convolution_backwards(program) -> int:
    """How many `convolution_backward`s the host function runs through torch."""
    return sum(1 for line in program.lowered_text.splitlines()
               if "torch.aten.convolution_backward" in line and "ca.host" in line)


def _weighted_sum(y):
    """A loss whose gradient differs per output element (a plain sum would hide a swapped tap)."""
    return (y * torch.linspace(0.5, 1.5, y.numel(), dtype=y.dtype).reshape(y.shape)).sum()


@pytest.mark.parametrize("spatial,k,s,dil,p,h,bias", list(_cases()))
def test_a_depthwise_backward_compiles_to_window_loops_exact_in_float64(spatial, k, s, dil, p, h, bias):
    channels = 3
    conv = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[spatial](
        channels, channels, k, s, p, dil, channels, bias=bias).double()
    camlir.reset()
    eager, ours = eager_and_camlir(lambda: copy.deepcopy(conv),
                                   lambda: [torch.randn(2, channels, *[h] * spatial, dtype=torch.float64,
                                                        requires_grad=True)],
                                   lambda m, x: _weighted_sum(m(x)), steps=2, backend="cpu")
    assert_grads_equal(eager, ours)
    [(_, _, program)] = camlir.compiled_programs()
    # the window-loop kernel, with the op itself kept as its torch twin for the runtime's choice
    assert _host_convolution_backwards(program) == 0
    assert "__torch" in program.lowered_text and "torch.aten.convolution_backward" in program.lowered_text
    camlir.reset()


@pytest.mark.parametrize("what", ["grouped", "multiplier", "large_map", "dilated_last_dim", "taps"])
def test_what_it_does_not_take_stays_one_host_op(what):
    torch.manual_seed(0)
    c, groups, out, k, pad, dil, h = 4, 4, 4, 3, 1, 1, 4
    if what == "grouped":
        groups = 2  # 2 input channels per group
    if what == "multiplier":
        out = 8  # 2 output channels per input channel
    if what == "large_map":
        h = 16  # 16x16 outputs: torch's kernel is faster there
    if what == "dilated_last_dim":
        dil, pad = 2, 2
    if what == "taps":
        k, pad = 9, 4  # 81 taps
    conv = torch.nn.Conv2d(c, out, k, 1, pad, dil, groups, bias=False)
    camlir.reset()
    eager, ours = eager_and_camlir(lambda: copy.deepcopy(conv), lambda: [torch.randn(2, c, h, h, requires_grad=True)],
                                   lambda m, x: m(x).square().sum(), backend="cpu")
    assert_grads_equal(eager, ours, rtol=1e-4, atol=1e-4)
    [(_, _, program)] = camlir.compiled_programs()
    assert _host_convolution_backwards(program) == 1
    camlir.reset()


class _MobileTail(torch.nn.Module):
    """The late layers of a mobile network: depthwise 5x5 and 3x3 convolutions on 4x4 and
    2x2 maps (stride 1 and 2), with batch norm, hardswish and a pointwise convolution."""

    def __init__(self, c=24):
        super().__init__()
        self.dw1 = torch.nn.Conv2d(c, c, 5, 1, 2, groups=c, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.dw2 = torch.nn.Conv2d(c, c, 3, 2, 1, groups=c, bias=True)
        self.pw = torch.nn.Conv2d(c, 2 * c, 1)
        self.dw3 = torch.nn.Conv2d(2 * c, 2 * c, 5, 1, 2, groups=2 * c)

    def forward(self, x):
        x = F.hardswish(self.bn1(self.dw1(x)))
        x = self.dw3(self.pw(F.relu(self.dw2(x))))
        return x.square().mean()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_mobile_tail_compiles_its_depthwise_backwards_natively(threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        camlir.reset()
        eager, ours = eager_and_camlir(_MobileTail, lambda: [torch.randn(4, 24, 4, 4, requires_grad=True)],
                                       lambda m, x: m(x), steps=2, backend="cpu")
        assert_grads_equal(eager, ours, rtol=1e-4, atol=1e-5)
        [(_, _, program)] = camlir.compiled_programs()
        # the three depthwise backwards are kernel code; the pointwise one stays torch's
        assert _host_convolution_backwards(program) == 1
    finally:
        torch.set_num_threads(previous)
        camlir.reset()


@pytest.mark.parametrize("width,batch,threads", [(4, 3, 1), (7, 3, 1), (8, 3, 1), (12, 3, 1), (16, 3, 1),
                                                 (24, 3, 1), (32, 24, 2), (12, 48, 2)])
def test_slices_of_a_padded_tensor_compile_right_at_any_width(width, batch, threads):
    """Shifted windows of a padded buffer read and written in kernels: the loops stage folds
    the views into the buffer's own indices where whole vectors fit, and leaves them where a
    partial vector would spill past the view (a 4- or 12-wide row). The big cases split
    over 2 threads (each split loop nest gets the viewed buffer and makes the view again)."""

    def loss(m, x):
        p = F.pad(x * m.weight, (1, 2, 2, 1))
        rows, cols = p.shape[-2] - 3, p.shape[-1] - 3
        total = 0
        for i, j in itertools.product(range(3), range(3)):
            total = total + p[:, :, i:i + rows, j:j + cols] * (i + 2 * j + 1)
        return total.tanh().sum()

    def make():
        m = torch.nn.Module()
        m.weight = torch.nn.Parameter(torch.randn(1, 16, 1, 1))
        return m

    camlir.reset()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        eager, ours = eager_and_camlir(make, lambda: [torch.randn(batch, 16, 5, width, requires_grad=True)], loss,
                                       backend="cpu")
    finally:
        torch.set_num_threads(previous)
    # the weight's gradient sums ~3,000 terms: eager's and camlir's float32 sums both land
    # 3-4e-5 from the float64 value (width 24), in different orders
    assert_grads_equal(eager, ours, rtol=1e-4, atol=1e-4)
    camlir.reset()

