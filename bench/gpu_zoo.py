"""The small model zoo the gpu backend is checked on (test_gpu_backend.py, bench/gpu_check.py).

Imports only torch, so the GPU machine (no camlir there) can rebuild the same models with the
same seeds and compute eager CUDA gradients and times. Each case: `make()` -> (model, inputs,
loss function), deterministic under `torch.manual_seed(0)`.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp_gelu():
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 10))
    return model, [torch.randn(32, 64)], lambda m, x: m(x).pow(2).mean()


class GeluLayerNormBlock(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def gelu_layernorm_block():
    return GeluLayerNormBlock(), [torch.randn(4, 16, 64)], lambda m, x: m(x).square().mean()


def softmax_cross_entropy():
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10))
    target = torch.randint(0, 10, (16,))
    return model, [torch.randn(16, 32)], lambda m, x: F.cross_entropy(m(x), target)


def transformer_layer():
    model = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    return model, [torch.randn(2, 8, 32)], lambda m, x: m(x).sum()


ZOO = {
    "mlp_gelu": mlp_gelu,
    "gelu_layernorm_block": gelu_layernorm_block,
    "softmax_cross_entropy": softmax_cross_entropy,
    "transformer_layer": transformer_layer,
}


def build(name: str):
    """(model, inputs, loss_fn) of case `name`, seeded."""
    torch.manual_seed(0)
    return ZOO[name]()
