"""`torch.autograd.grad` under vmap (what gradcheck's batched-gradient check does) after the
same backward was compiled: the gradients are batched tensors, which a compiled program
cannot take ("Cannot access storage of BatchedTensorImpl"; PyTorch's
test_custom_function_non_tensor_inputs_outputs under camlir). Such a call runs as plain
PyTorch, with its reason logged."""

import logging

import pytest
import torch

import camlir


def _vjp_under_vmap(x):
    def vjp(v):
        out = x * x.sin()
        return torch.autograd.grad(out, x, v)[0]

    first = vjp(torch.ones(3, dtype=torch.double))  # compiled (and cached) here
    return first, torch._vmap_internals._vmap(vjp, 0, 0)(torch.eye(3, dtype=torch.double))


@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_grad_under_vmap_after_a_compile(backend, caplog):
    camlir.reset()
    x = torch.rand(3, dtype=torch.double, requires_grad=True)
    expected = _vjp_under_vmap(x)
    with caplog.at_level(logging.WARNING, logger="camlir"), camlir.enable(backend=backend):
        got = _vjp_under_vmap(x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert camlir.counters["compiles"] == 1  # the plain call was compiled
    assert "under vmap runs uncompiled" in caplog.text
    camlir.reset()


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k, k  # a non-tensor output, as in PyTorch's test

    @staticmethod
    def backward(ctx, grad, _):
        return grad * ctx.k, None


def test_gradcheck_with_batched_grad():
    camlir.reset()
    x = torch.rand(4, dtype=torch.double, requires_grad=True)
    with camlir.enable(backend="cpu"):
        assert torch.autograd.gradcheck(lambda t: _Scale.apply(t, 3.0)[0], (x,), check_batched_grad=True,
                                        fast_mode=True)
    camlir.reset()
