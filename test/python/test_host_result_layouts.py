"""ca-host-result-layouts: a host op's results that torch lays out permuted (the CPU
flash-attention backward's three gradients) reach the kernels after it as contiguous
permutations, with no copy at the kernel boundary; the table of such ops agrees with torch."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import camlir
from camlir.backends import host_runtime
from camlir.backends.cpu import abi
from passes.host_result_layouts import KNOWN_RESULT_LAYOUTS


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setenv("CAMLIR_GRAPH_CHOICE", "0")  # always camlir's program
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "0")
    camlir.reset()
    yield
    camlir.reset()


def _flash_inputs(b=2, h=3, length=8, d=16):
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, length, d) for _ in range(3))
    out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False)
    return torch.randn_like(out), q, k, v, out, lse


@pytest.mark.parametrize("name", sorted(KNOWN_RESULT_LAYOUTS))
def test_table_agrees_with_the_real_op(name):
    """Each listed result, from a real call on contiguous inputs, is contiguous once permuted
    by its entry (a torch whose kernel changed the layout fails here)."""
    aten = torch.ops.aten
    calls = {
        "torch.aten._scaled_dot_product_flash_attention_for_cpu":
            lambda: aten._scaled_dot_product_flash_attention_for_cpu(*_flash_inputs()[1:4], 0.0, False),
        "torch.aten._scaled_dot_product_flash_attention_for_cpu_backward":
            lambda: aten._scaled_dot_product_flash_attention_for_cpu_backward(*_flash_inputs(), 0.0, False),
    }
    results = calls[name]()
    for index, perm in KNOWN_RESULT_LAYOUTS[name].items():
        r = results[index]
        assert not r.is_contiguous() and r.permute(perm).is_contiguous(), (index, r.stride())


class _Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, length, dim = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, length, dim))


@pytest.fixture
def kernel_args(monkeypatch):
    """Every kernel call's tensor arguments' contiguity, in call order (a False is a copy
    at the kernel boundary)."""
    seen = []
    call = abi.Kernel.__call__

    def recording(self, args):
        seen.append([a.is_contiguous() for a in args if isinstance(a, torch.Tensor)])
        return call(self, args)

    monkeypatch.setattr(abi.Kernel, "__call__", recording)
    return seen


def _grads(model, x, scope=None):
    model.zero_grad(set_to_none=True)
    loss = model(x).pow(2).sum()
    if scope is None:
        loss.backward()
    else:
        with scope:
            loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_attention_gradients_reach_the_kernels_without_a_copy(kernel_args):
    torch.manual_seed(0)
    model = nn.Sequential(_Attention(), nn.GELU(), _Attention())
    x = torch.randn(2, 8, 32)
    eager = _grads(model, x)
    for _ in range(2):  # capture, then compile
        _grads(model, x, camlir.enable(backend="cpu", wait=True))
    del kernel_args[:]
    got = _grads(model, x, camlir.enable(backend="cpu", wait=True))
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["interpreted"] == 0
    assert len(kernel_args) >= 3, "the backward did not compile to kernels around the two attention backwards"
    assert all(all(call) for call in kernel_args), f"operands copied at a kernel boundary: {kernel_args}"


def test_a_result_in_another_layout_is_copied_not_misread(monkeypatch, kernel_args):
    """If the table were wrong (torch handing a contiguous result), the host's view is not
    contiguous and the kernel boundary copies it: the same gradients, only slower."""
    resolve = host_runtime.resolve_op

    def contiguous_results(target):
        op = resolve(target)
        if target != "aten._scaled_dot_product_flash_attention_for_cpu_backward":
            return op
        wrapped = lambda *a, **k: tuple(r.contiguous() for r in op(*a, **k))  # noqa: E731
        wrapped._schema = op._schema
        return wrapped

    monkeypatch.setattr(host_runtime, "resolve_op", contiguous_results)
    torch.manual_seed(0)
    model = _Attention()
    x = torch.randn(2, 8, 32)
    eager = _grads(model, x)
    for _ in range(3):
        del kernel_args[:]
        got = _grads(model, x, camlir.enable(backend="cpu", wait=True))
        for a, b in zip(got, eager):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert any(not all(call) for call in kernel_args), "the contiguous results did not reach the kernel"
