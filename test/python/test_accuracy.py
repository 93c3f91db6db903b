"""The accuracy budget: for the backward of each op camlir compiles, its float32 error
against a float64 reference is at most 4x eager PyTorch's, plus a tiny absolute floor.

Found this way: torch-mlir lowers GELU(tanh)'s backward with sqrt(2/pi) = 0.797724, a
2e-4 relative error in every gradient (eager's error is 9e-7); camlir now decomposes it.
"""

import pytest
import torch
import torch.nn.functional as F

import camlir

_OPS = {
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), 3.0),
    "gelu": (F.gelu, 3.0),
    "tanh": (torch.tanh, 3.0),
    "sigmoid": (torch.sigmoid, 3.0),
    "silu": (F.silu, 3.0),
    "exp": (torch.exp, 2.0),
    "log": (lambda x: torch.log(x.abs() + 0.1), 3.0),
    "erf": (torch.erf, 2.0),
    "sin": (torch.sin, 3.0),
    "pow3": (lambda x: x ** 3, 2.0),
    "pow2.5": (lambda x: (x.abs() + 0.1) ** 2.5, 2.0),
    "rsqrt": (lambda x: torch.rsqrt(x.abs() + 0.1), 3.0),
    "softplus": (F.softplus, 3.0),
    "elu": (F.elu, 3.0),
    "softmax": (lambda x: F.softmax(x, dim=-1), 3.0),
    "log_softmax": (lambda x: F.log_softmax(x, dim=-1), 3.0),
    "layer_norm": (lambda x: F.layer_norm(x, (x.shape[-1],)), 3.0),
    "gpt2_gelu_new": (lambda x: 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0)))), 3.0),
}


def _grad(fn, x, weights, backend=None):
    x = x.clone().requires_grad_(True)
    loss = (fn(x) * weights.to(x.dtype)).sum()
    if backend is None:
        loss.backward()
    else:
        with camlir.enable(backend=backend):
            loss.backward()
    return x.grad.double()


@pytest.mark.parametrize("name", list(_OPS))
def test_backward_error_within_budget(name):
    fn, scale = _OPS[name]
    torch.manual_seed(0)
    x = torch.randn(64, 256, dtype=torch.float64) * scale
    weights = torch.randn(64, 256, dtype=torch.float64)
    camlir.reset()
    reference = _grad(fn, x, weights)
    eager = (_grad(fn, x.float(), weights) - reference).abs().max().item()
    ours = (_grad(fn, x.float(), weights, backend="cpu") - reference).abs().max().item()
    floor = 1e-7 * (1.0 + reference.abs().max().item())
    assert camlir.counters["fallbacks"] == 0
    assert ours <= 4 * eager + floor, f"{name}: camlir's error {ours:.3g}, eager's {eager:.3g}"
