"""The model zoo: every backward captured, imported into `ca`, run by the reference backend
and by the cpu backend, and compared with PyTorch's eager engine."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import camlir
from helpers import assert_grads_equal, eager_and_camlir


# Every case runs on the reference interpreter and on the cpu backend (conftest.py).
pytestmark = pytest.mark.usefixtures("each_backend")


def _no_fallbacks():
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["interpreted"] == 0  # the cpu backend compiled every graph
    assert camlir.counters["compiles"] >= 1


def test_mlp_gelu():
    eager, ours = eager_and_camlir(
        lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4)),
        lambda: [torch.randn(8, 16)], lambda m, x: m(x).pow(2).mean(), steps=2)
    assert_grads_equal(eager, ours)
    _no_fallbacks()


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(self.drop(x.flatten(1)))


def test_cnn_conv_batchnorm_relu_maxpool_dropout_cross_entropy():
    target = torch.randint(0, 10, (4,))
    eager, ours = eager_and_camlir(SmallCNN, lambda: [torch.randn(4, 3, 8, 8)],
                                   lambda m, x: F.cross_entropy(m(x), target), steps=2)
    assert_grads_equal(eager, ours)
    _no_fallbacks()


def test_transformer_encoder_layer():
    eager, ours = eager_and_camlir(
        lambda: nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True),
        lambda: [torch.randn(2, 5, 16)], lambda m, x: m(x).sum())
    assert_grads_equal(eager, ours, rtol=1e-4, atol=1e-5)
    _no_fallbacks()


class EmbedAttend(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.norm = nn.LayerNorm(16)
        self.qkv = nn.Linear(16, 48)

    def forward(self, tokens):
        h = self.norm(self.emb(tokens))
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / 4.0
        mask = torch.triu(torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def test_embedding_layernorm_masked_attention():
    eager, ours = eager_and_camlir(EmbedAttend, lambda: [torch.randint(0, 20, (2, 6))],
                                   lambda m, t: m(t).square().mean())
    assert_grads_equal(eager, ours)
    _no_fallbacks()


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 8)
        self.out = nn.Linear(8, 12, bias=False)
        self.out.weight = self.emb.weight  # one parameter used twice

    def forward(self, tokens):
        return self.out(torch.tanh(self.emb(tokens)))


def test_weight_tying():
    eager, ours = eager_and_camlir(Tied, lambda: [torch.randint(0, 12, (3, 4))],
                                   lambda m, t: F.cross_entropy(m(t).flatten(0, 1), t.flatten()))
    assert_grads_equal(eager, ours)
    _no_fallbacks()


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


class WithCustomFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return Cube.apply(self.lin(x)).sum()


def test_custom_autograd_function():
    eager, ours = eager_and_camlir(WithCustomFunction, lambda: [torch.randn(3, 6)], lambda m, x: m(x))
    assert_grads_equal(eager, ours)
    _no_fallbacks()


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(lambda t: torch.sigmoid(self.a(t)), x, use_reentrant=False)
        return self.b(h).sum()


def test_activation_checkpointing():
    """Non-reentrant checkpointing recomputes the forward in a saved-tensor unpack hook.
    camlir compiles the backward around the hooks (Python calls inside it): the first call
    of a graph runs PyTorch's graph to learn what the hooks return, later calls run the
    compiled program; `fullgraph=True` allows that first call (docs/training.md)."""
    eager, ours = eager_and_camlir(Checkpointed, lambda: [torch.randn(4, 8)], lambda m, x: m(x), steps=3)
    assert_grads_equal(eager, ours)
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["compiles"] >= 1
    eager, ours = eager_and_camlir(Checkpointed, lambda: [torch.randn(4, 8)], lambda m, x: m(x), steps=3,
                                   fullgraph=True)
    assert_grads_equal(eager, ours)


def test_float64():
    eager, ours = eager_and_camlir(lambda: nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double(),
                                   lambda: [torch.randn(3, 5, dtype=torch.float64)], lambda m, x: m(x).sum())
    assert_grads_equal(eager, ours)
    assert ours[0][0].dtype == torch.float64
    _no_fallbacks()


def test_non_contiguous_inputs():
    def inputs():
        base = torch.randn(10, 12, requires_grad=True)
        return [base]

    def loss(m, base):
        x = base.t()[2:9:2]  # (4, 10): a transposed, strided view
        assert not x.is_contiguous()
        return (m(x) * torch.arange(3.0)).sum() + (x * x.flip(0)).sum()

    eager, ours = eager_and_camlir(lambda: nn.Linear(10, 3), inputs, loss, steps=2)
    assert_grads_equal(eager, ours)
    _no_fallbacks()


class PartlyUsed(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.used(self.frozen(x)).sum()


def test_parameters_without_gradient():
    eager, ours = eager_and_camlir(PartlyUsed, lambda: [torch.randn(2, 4)], lambda m, x: m(x))
    assert_grads_equal(eager, ours)
    assert ours[0][2] is None  # unused.weight stays without .grad
    _no_fallbacks()


def test_loss_going_through_many_ops():
    """Reductions, views, permutes, expands, slices, cat and index ops in one backward."""
    def loss(m, x):
        y = m(x)                              # (4, 6)
        z = torch.cat([y[:, :3].exp(), y[:, 3:].sigmoid()], dim=1)
        z = z.view(2, 2, 6).permute(2, 0, 1).expand(6, 2, 2) * 2
        idx = torch.tensor([0, 2, 5])
        return z[idx].logsumexp(0).sum() + z.amax() + F.log_softmax(y, -1).mean()

    eager, ours = eager_and_camlir(lambda: nn.Linear(5, 6), lambda: [torch.randn(4, 5)], loss)
    assert_grads_equal(eager, ours)
    _no_fallbacks()
