"""The backwards the lowering is measured on: the zoo's models and small single-op cases.
Shared by test_lowering_coverage.py and gen_op_coverage.py (which writes docs/op-coverage.md)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import camlir
from test_capture_zoo import EmbedAttend, PartlyUsed, SmallCNN, Tied, WithCustomFunction


def captured_modules(make_model, make_inputs, loss_fn, steps=1) -> list:
    """Runs `steps` backwards through camlir's reference backend; returns the `ca` module
    texts captured (one per distinct graph or shape variant)."""
    camlir.reset()
    torch.manual_seed(0)
    model = make_model()
    with camlir.enable(backend="eager"):
        for step in range(steps):
            torch.manual_seed(100 + step)
            loss_fn(model, *make_inputs(step)).backward()
    texts = [text for _, text in camlir.captured_graphs()]
    camlir.reset()
    return texts


def _many_ops_loss(m, x):
    y = m(x)
    z = torch.cat([y[:, :3].exp(), y[:, 3:].sigmoid()], dim=1)
    z = z.view(2, 2, 6).permute(2, 0, 1).expand(6, 2, 2) * 2
    idx = torch.tensor([0, 2, 5])
    return z[idx].logsumexp(0).sum() + z.amax() + F.log_softmax(y, -1).mean()


def _non_contiguous_loss(m, base):
    x = base.t()[2:9:2]
    return (m(x) * torch.arange(3.0)).sum() + (x * x.flip(0)).sum()


_target = torch.arange(4) % 10

# name -> (make_model, make_inputs(step), loss(model, *inputs), steps)
ZOO = {
    "mlp_gelu": (lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4)),
                 lambda s: [torch.randn(8, 16)], lambda m, x: m(x).pow(2).mean(), 1),
    "cnn": (SmallCNN, lambda s: [torch.randn(4, 3, 8, 8)], lambda m, x: F.cross_entropy(m(x), _target), 1),
    "transformer_encoder": (
        lambda: nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True),
        lambda s: [torch.randn(2, 5, 16)], lambda m, x: m(x).sum(), 1),
    "embedding_layernorm_attention": (EmbedAttend, lambda s: [torch.randint(0, 20, (2, 6))],
                                      lambda m, t: m(t).square().mean(), 1),
    "weight_tying": (Tied, lambda s: [torch.randint(0, 12, (3, 4))],
                     lambda m, t: F.cross_entropy(m(t).flatten(0, 1), t.flatten()), 1),
    "custom_function": (WithCustomFunction, lambda s: [torch.randn(3, 6)], lambda m, x: m(x), 1),
    "float64": (lambda: nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double(),
                lambda s: [torch.randn(3, 5, dtype=torch.float64)], lambda m, x: m(x).sum(), 1),
    "non_contiguous": (lambda: nn.Linear(10, 3), lambda s: [torch.randn(10, 12, requires_grad=True)],
                       _non_contiguous_loss, 1),
    "parameters_without_gradient": (PartlyUsed, lambda s: [torch.randn(2, 4)], lambda m, x: m(x), 1),
    "many_ops": (lambda: nn.Linear(5, 6), lambda s: [torch.randn(4, 5)], _many_ops_loss, 1),
    # Sizes change between steps: the later captures are symbolic (`?` dims, !torch.int sizes).
    "dynamic_embedding_attention": (EmbedAttend, lambda s: [torch.randint(0, 20, (2, 6 + s))],
                                    lambda m, t: m(t).square().mean(), 3),
    "dynamic_cnn": (SmallCNN, lambda s: [torch.randn(2 + s, 3, 8, 8)],
                    lambda m, x: F.cross_entropy(m(x), torch.arange(x.shape[0]) % 10), 3),
}

# Which zoo models are expected to keep an extern op (and which).
EXPECTED_EXTERNS = {
    "transformer_encoder": {"aten._scaled_dot_product_flash_attention_for_cpu_backward"},
}


def _leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


_idx = torch.tensor([0, 2, 1, 2])  # a repeated index: scatter-adds must accumulate

# name -> (function, input makers): the backward of `function(*inputs)`, weighted so that
# no gradient is trivially uniform.
SINGLE_OPS = {
    "softmax": (lambda x: F.softmax(x, -1), lambda: [_leaf(3, 5)]),
    "log_softmax": (lambda x: F.log_softmax(x, -1), lambda: [_leaf(3, 5)]),
    "tanh": (torch.tanh, lambda: [_leaf(3, 5)]),
    "sigmoid": (torch.sigmoid, lambda: [_leaf(3, 5)]),
    "relu": (torch.relu, lambda: [_leaf(3, 5)]),
    "threshold": (lambda x: F.threshold(x, 0.1, 2.0), lambda: [_leaf(3, 5)]),
    "gelu": (F.gelu, lambda: [_leaf(3, 5)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), lambda: [_leaf(3, 5)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (5,), w, b), lambda: [_leaf(3, 5), _leaf(5), _leaf(5)]),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, torch.zeros(4), torch.ones(4), w, b, training=True),
                   lambda: [_leaf(2, 4, 3, 3), _leaf(4), _leaf(4)]),
    "batch_norm_eval": (lambda x, w, b: F.batch_norm(x, torch.zeros(4), torch.ones(4), w, b, training=False),
                        lambda: [_leaf(2, 4, 3, 3), _leaf(4), _leaf(4)]),
    "embedding": (lambda w: F.embedding(_idx, w), lambda: [_leaf(6, 3)]),
    "embedding_padding_idx": (lambda w: F.embedding(_idx, w, padding_idx=2), lambda: [_leaf(6, 3)]),
    "nll_loss": (lambda x: F.nll_loss(F.log_softmax(x, -1), _idx), lambda: [_leaf(4, 5)]),
    "cross_entropy": (lambda x: F.cross_entropy(x, _idx), lambda: [_leaf(4, 5)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), lambda: [_leaf(1, 2, 4, 4)]),
    "max_pool2d_overlapping": (lambda x: F.max_pool2d(x, 3, stride=1, padding=1), lambda: [_leaf(1, 2, 4, 4)]),
    "dropout": (lambda x: F.dropout(x, 0.5, training=True), lambda: [_leaf(3, 5)]),
    "cat": (lambda a, b: torch.cat([a, b], 1), lambda: [_leaf(3, 5), _leaf(3, 2)]),
    "index_select": (lambda x: x.index_select(0, _idx), lambda: [_leaf(4, 5)]),
    "gather": (lambda x: x.gather(1, _idx.view(4, 1)), lambda: [_leaf(4, 5)]),
    "advanced_indexing": (lambda x: x[_idx], lambda: [_leaf(4, 5)]),
    "advanced_indexing_2d": (lambda x: x[_idx, _idx], lambda: [_leaf(4, 5)]),
    "slice": (lambda x: x[1:, ::2], lambda: [_leaf(4, 5)]),
    "select": (lambda x: x[1], lambda: [_leaf(4, 5)]),
    "permute_expand": (lambda x: x.permute(1, 0).unsqueeze(0).expand(2, 5, 3), lambda: [_leaf(3, 5)]),
    "sum": (lambda x: x.sum(1), lambda: [_leaf(3, 5)]),
    "mean": (lambda x: x.mean(0), lambda: [_leaf(3, 5)]),
    "amax": (lambda x: x.amax(1), lambda: [_leaf(3, 5)]),
    "mm": (torch.mm, lambda: [_leaf(3, 4), _leaf(4, 5)]),
    "linear": (F.linear, lambda: [_leaf(3, 4), _leaf(5, 4), _leaf(5)]),
    "bmm": (torch.bmm, lambda: [_leaf(2, 3, 4), _leaf(2, 4, 5)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), lambda: [_leaf(1, 2, 5, 5), _leaf(3, 2, 3, 3), _leaf(3)]),
    "sdpa": (F.scaled_dot_product_attention, lambda: [_leaf(1, 2, 4, 8), _leaf(1, 2, 4, 8), _leaf(1, 2, 4, 8)]),
    # Beyond the zoo: common layers and losses.
    "silu": (F.silu, lambda: [_leaf(3, 5)]),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), lambda: [_leaf(3, 5)]),
    "hardtanh": (F.hardtanh, lambda: [_leaf(3, 5)]),
    "elu": (F.elu, lambda: [_leaf(3, 5)]),
    "softplus": (F.softplus, lambda: [_leaf(3, 5)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), lambda: [_leaf(2, 4, 3, 3), _leaf(4), _leaf(4)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (5,), w), lambda: [_leaf(3, 5), _leaf(5)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 1), lambda: [_leaf(1, 2, 4, 4)]),
    "mse_loss": (lambda x: F.mse_loss(x, torch.ones(3, 5)), lambda: [_leaf(3, 5)]),
    "smooth_l1_loss": (lambda x: F.smooth_l1_loss(x, torch.ones(3, 5)), lambda: [_leaf(3, 5)]),
    "bce_with_logits": (lambda x: F.binary_cross_entropy_with_logits(x, torch.full((3, 5), 0.3)), lambda: [_leaf(3, 5)]),
    "split_stack": (lambda x: torch.stack(x.split(2, 1)[:2], 0), lambda: [_leaf(3, 6)]),
    "repeat": (lambda x: x.repeat(2, 3), lambda: [_leaf(3, 5)]),
    "where_clamp": (lambda x: torch.where(x > 0, x, x.clamp(-0.5, 0.5)), lambda: [_leaf(3, 5)]),
    "pad": (lambda x: F.pad(x, (1, 1)), lambda: [_leaf(3, 5)]),
    "upsample_nearest": (lambda x: F.interpolate(x, scale_factor=2), lambda: [_leaf(1, 2, 4, 4)]),
    "topk": (lambda x: x.topk(2, 1).values, lambda: [_leaf(3, 5)]),
    "addmm": (torch.addmm, lambda: [_leaf(3, 5), _leaf(3, 4), _leaf(4, 5)]),
    "baddbmm": (torch.baddbmm, lambda: [_leaf(2, 3, 5), _leaf(2, 3, 4), _leaf(2, 4, 5)]),
}

# Backwards that do not lower yet, and what the error names. Not in the zoo; kept so that
# the gap stays visible (a test fails once one of them starts to lower).
KNOWN_GAPS = {
    # torch-mlir has the op but no linalg lowering; PyTorch has no decomposition.
    "avg_pool2d": ((lambda x: F.avg_pool2d(x, 2), lambda: [_leaf(1, 2, 4, 4)]), "aten.avg_pool2d_backward"),
    # torch-mlir's handling of convolution_backward does not cover these (1-d, transposed);
    # PyTorch has no decomposition.
    "conv1d": ((lambda x, w: F.conv1d(x, w), lambda: [_leaf(1, 2, 8), _leaf(3, 2, 3)]), "aten.convolution_backward"),
    "conv_transpose2d": ((lambda x, w: F.conv_transpose2d(x, w), lambda: [_leaf(1, 2, 4, 4), _leaf(2, 3, 3, 3)]),
                         "aten.convolution_backward"),
    # The backward is a reversed cumsum: torch-mlir's tm_tensor.scan, which camlir does not
    # rewrite into loops (only tm_tensor.scatter).
    "cumsum": ((lambda x: x.cumsum(1), lambda: [_leaf(3, 5)]), "tm_tensor.scan"),
}


def single_op_modules(name: str) -> list:
    fn, make_inputs = SINGLE_OPS[name] if name in SINGLE_OPS else KNOWN_GAPS[name][0]

    def loss(_model, *inputs):
        out = fn(*inputs)
        weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) / max(out.numel(), 1)
        return (out * weights).sum()

    return captured_modules(lambda: None, lambda s: make_inputs(), loss)
