"""Depthwise convolution backwards compiled as camlir loops (capture/depthwise_conv.py), and
the view folding that lets the loops stage vectorize their slices (passes/fold_views.py)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import camlir
from camlir.capture import depthwise_conv
from helpers import assert_grads_equal, eager_and_camlir

aten = torch.ops.aten
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _cases():
    """Spatial rank, kernel, stride, dilation, padding, input extent: strides and dilations
    past 1, padding up to the kernel's reach, odd extents."""
    for spatial, (k, s, d, p, h) in itertools.product(
            (1, 2, 3), [(3, 1, 1, 1, 4), (5, 1, 1, 2, 2), (3, 2, 1, 1, 7), (2, 1, 2, 0, 5), (5, 2, 1, 2, 8),
                        (3, 3, 2, 4, 9), (1, 1, 1, 0, 3)]):
        if spatial == 3 and k == 5:
            continue  # 125 taps: past MAX_TAPS, a case of its own below
        yield spatial, k, s, d, p, h


@pytest.mark.parametrize("spatial,k,s,d,p,h", list(_cases()))
def test_the_decomposition_equals_pytorchs_backward(spatial, k, s, d, p, h, monkeypatch):
    monkeypatch.setattr(depthwise_conv, "MAX_OUTPUT_POSITIONS", 10 ** 9)
    torch.manual_seed(0)
    channels = 3
    x = torch.randn(2, channels, *[h] * spatial, dtype=torch.float64)
    w = torch.randn(channels, 1, *[k] * spatial, dtype=torch.float64)
    y = _CONV[spatial](x, w, None, s, p, d, channels)
    gy = torch.randn_like(y)
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        args = (gy, x, w, [channels], [s] * spatial, [p] * spatial, [d] * spatial, False, [0] * spatial,
                channels, mask)
        expected = aten.convolution_backward(*args)
        got = depthwise_conv.depthwise_convolution_backward(*args)
        assert got is not NotImplemented
        for e, g in zip(expected, got):
            if e is None:
                assert g is None
            else:
                torch.testing.assert_close(g, e)


@pytest.mark.parametrize("what", ["grouped", "multiplier", "transposed", "bf16", "past_reach", "taps",
                                  "large_map"])
def test_what_it_does_not_take_stays_one_host_op(what):
    torch.manual_seed(0)
    c, groups, wc, dtype, pad, k, h = 4, 4, 1, torch.float32, 1, 3, 4
    if what == "grouped":
        groups, wc = 2, 2  # 2 input channels per group
    if what == "multiplier":
        wc = 1
    if what == "bf16":
        dtype = torch.bfloat16
    if what == "past_reach":
        pad = 3  # more than (k - 1) * dilation
    if what == "taps":
        k, pad = 9, 4  # 81 taps
    if what == "large_map":
        h = 16  # 16x16 outputs: eager's kernel is faster there
    out_channels = 2 * c if what == "multiplier" else c
    x = torch.randn(2, c, h, h, dtype=dtype)
    w = torch.randn(out_channels, wc, k, k, dtype=dtype)
    y = F.conv2d(x, w, None, 1, pad, 1, groups)
    got = depthwise_conv.depthwise_convolution_backward(
        torch.randn_like(y), x, w, None, [1, 1], [pad, pad], [1, 1], what == "transposed", [0, 0], groups,
        [True, True, False])
    assert got is NotImplemented


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
        assert program.lowered_text.count("torch.aten.convolution_backward") == 1
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

