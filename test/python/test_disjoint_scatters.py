"""ca-disjoint-scatters on real backwards: gradients of tensors split by indexing (`x[0]`,
`x[1]`, ...: select backwards summed into one gradient) equal eager's, and the sum is one
scatter chain (passes/disjoint_scatters.py)."""

import pytest
import torch
from torch_mlir import ir

import camlir
from camlir.context import make_context
from camlir.passes.disjoint_scatters import disjoint_scatters
from camlir.passes.flatten_nodes import FlattenNodes


@pytest.fixture(autouse=True)
def _fresh():
    camlir.reset()
    yield
    camlir.reset()


def _rewrites_in_last_graph() -> int:
    _, text = camlir.captured_graphs()[-1]
    context = make_context()
    module = ir.Module.parse(text, context)
    with context, ir.Location.unknown():
        FlattenNodes().run(module.operation)
        return disjoint_scatters(module.operation)


def _check(fn, *shapes, dtype=torch.float32):
    torch.manual_seed(0)
    leaves = [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]
    fn(*leaves).sum().backward()
    want = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    camlir.compile_backward(fn(*leaves).sum())
    for t, w in zip(leaves, want):
        torch.testing.assert_close(t.grad, w, rtol=1e-5, atol=1e-6)
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0


def test_packed_projection_split_by_index():
    def fn(x):
        q, k, v = x[0], x[1], x[2]
        return (q * k).tanh() + v.sin()

    _check(fn, (3, 4, 5))
    assert _rewrites_in_last_graph() == 2


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_selects_along_any_dim_with_negative_indices(dim):
    def fn(x):
        return x.select(dim, -1).exp() * 2 + x.select(dim, 0).cos() + x.select(dim, 1) ** 2

    _check(fn, (3, 3, 4))
    assert _rewrites_in_last_graph() == 2


def test_the_same_index_twice_is_summed():
    def fn(x):
        return x[1].exp() + x[1].sin() * x[0]

    _check(fn, (2, 6))
    # x[1]'s two uses give one select backward each: those two must be added, not chained
    assert _rewrites_in_last_graph() <= 1


def test_multihead_attention_matches_eager():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 16)
    layer(x).pow(2).sum().backward()
    want = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    camlir.compile_backward(layer(x).pow(2).sum())
    for p, w in zip(layer.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-5)
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0
