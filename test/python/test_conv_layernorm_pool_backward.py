"""Bug found by test/python/model_sweep.py (Swin and BEiT: their patch-embedding conv
weight gradients were wrong on the cpu backend, every step the native kernel ran).

The pattern: patch conv -> flatten -> transpose -> layer_norm -> adaptive_avg_pool1d(1) (the
models' pooler: a `mean` that PyTorch restrides with `as_strided`, because the transposed input
is channels-last, so the backward has AsStridedBackward1). The fused kernel's result feeds the
host convolution_backward; the bias gradient (a sum over positions) is right and the weight
gradient is not, so the gradient reaching the conv has its positions in the wrong order. The
reference backend is right, and so is the kernel's torch-ops twin (which is why the sweep's
step 1, measured on the twin, matched). Without the layer_norm, or with `.mean(-1)` in place of
the pool, it is right.

Cause: the pool's backward reads a constant index, which ca-lower-to-linalg moved to the
host; it then outlined kernels again without knowing the extern ops, so the host
convolution_backward went into a kernel and through torch-mlir's lowering, whose weight
gradient is wrong here. Fixed in ca-outline-kernels: extern ops are marked `ca.host`, so
every later outlining keeps them on the host. The test also checks that the convolution
stayed on the host.
"""

import torch

import camlir


def test_conv_layernorm_adaptive_pool_matches_eager(monkeypatch):
    monkeypatch.setenv("CAMLIR_KERNEL_CHOICE", "0")  # always the native kernel
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 4, stride=4)
    x = torch.randn(2, 3, 16, 16)

    def loss_fn():
        y = conv(x).flatten(2).transpose(1, 2)  # (2, 16, 8)
        y = torch.nn.functional.layer_norm(y, (8,))
        return torch.nn.functional.adaptive_avg_pool1d(y.transpose(1, 2), 1).pow(2).mean()

    loss_fn().backward()
    expected = [p.grad.clone() for p in conv.parameters()]
    for p in conv.parameters():
        p.grad = None
    loss = loss_fn()
    camlir.reset()
    with camlir.enable(backend="cpu"):
        loss.backward()
    for p, e in zip(conv.parameters(), expected):
        torch.testing.assert_close(p.grad, e, rtol=1e-4, atol=1e-5)
    program = camlir.compiled_programs()[-1][2]
    assert "conv_2d" not in program.lowered_text, "convolution_backward must stay on the host"
