"""More of the autograd API through camlir (issue 14, "More of the API"):
`torch.autograd.grad` and `backward(inputs=...)` are captured and compiled like
`backward()`; `create_graph=True` and `is_grads_batched=True` run as plain PyTorch with
their reason logged, recorded (`camlir.explain()`) and counted, or raise under fullgraph.
"""

import pytest
import torch
import torch.nn as nn

import camlir
from helpers import camlir_logs


@pytest.fixture(autouse=True)
def _fresh():
    camlir.reset()
    yield
    camlir.reset()


def _model_and_input():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    x = torch.randn(5, 6, requires_grad=True)
    return model, x


def _loss(model, x):
    return model(x).pow(2).mean()


def _compiled():
    """What camlir compiled (or found compiled) since the last reset."""
    return camlir.counters["compiles"] + camlir.counters["cache_hits"] + camlir.counters["disk_cache_hits"]


def test_grad_wrt_parameters_and_input():
    model, x = _model_and_input()
    wrt = list(model.parameters()) + [x]
    expected = torch.autograd.grad(_loss(model, x), wrt)
    with camlir.enable(backend="cpu", fullgraph=True):
        got = torch.autograd.grad(_loss(model, x), wrt)
    assert camlir.counters["captures"] >= 1 and camlir.counters["compiles"] >= 1
    assert camlir.counters["interpreted"] == 0
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    # autograd.grad returns the gradients; nothing is accumulated into .grad
    assert all(p.grad is None for p in wrt)


def test_grad_wrt_an_input_only():
    model, x = _model_and_input()
    (expected,) = torch.autograd.grad(_loss(model, x), x)
    with camlir.enable(backend="cpu", fullgraph=True):
        (got,) = torch.autograd.grad(_loss(model, x), x)
    assert camlir.counters["compiles"] >= 1
    torch.testing.assert_close(got, expected)
    assert x.grad is None and all(p.grad is None for p in model.parameters())


def test_grad_allow_unused():
    model, x = _model_and_input()
    unused = torch.randn(3, requires_grad=True)
    expected = torch.autograd.grad(_loss(model, x), [x, unused], allow_unused=True)
    with camlir.enable(backend="cpu", fullgraph=True):
        got = torch.autograd.grad(_loss(model, x), [x, unused], allow_unused=True)
        assert got[1] is None and expected[1] is None
        materialized = torch.autograd.grad(_loss(model, x), [x, unused], allow_unused=True,
                                           materialize_grads=True)
    assert _compiled() >= 2
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(materialized[0], expected[0])
    torch.testing.assert_close(materialized[1], torch.zeros(3))
    with camlir.enable(backend="cpu"), pytest.raises(RuntimeError, match="appears to not have been used"):
        torch.autograd.grad(_loss(model, x), [x, unused])  # PyTorch's error, as in eager


def test_grad_with_grad_outputs():
    model, x = _model_and_input()
    out = model(x)
    v = torch.randn_like(out)
    expected = torch.autograd.grad(out, [x, model[0].weight], grad_outputs=v)
    with camlir.enable(backend="cpu", fullgraph=True):
        got = torch.autograd.grad(model(x), [x, model[0].weight], grad_outputs=v)
    assert camlir.counters["compiles"] >= 1
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_grad_retain_graph_then_again():
    model, x = _model_and_input()
    wrt = [x, model[2].bias]
    expected = torch.autograd.grad(_loss(model, x), wrt)
    with camlir.enable(backend="cpu", fullgraph=True):
        loss = _loss(model, x)
        first = torch.autograd.grad(loss, wrt, retain_graph=True)
        second = torch.autograd.grad(loss, wrt)  # the same graph, run again
        assert camlir.counters["compiles"] == 1 and camlir.counters["cache_hits"] >= 1
        with pytest.raises(RuntimeError, match="a second time"):
            torch.autograd.grad(loss, wrt)  # freed, as in eager
    for a, b, e in zip(first, second, expected):
        torch.testing.assert_close(a, e)
        torch.testing.assert_close(b, e)


def test_backward_inputs_subset():
    model, x = _model_and_input()
    subset = [model[0].weight, x]
    _loss(model, x).backward(inputs=subset)
    expected = {id(t): t.grad.clone() for t in subset}
    model.zero_grad(set_to_none=True)
    x.grad = None
    with camlir.enable(backend="cpu", fullgraph=True):
        _loss(model, x).backward(inputs=subset)
    assert camlir.counters["compiles"] >= 1
    for t in subset:
        torch.testing.assert_close(t.grad, expected[id(t)])
    others = [p for p in model.parameters() if p is not model[0].weight]
    assert all(p.grad is None for p in others)  # only the subset, as in eager


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
def test_create_graph_falls_back_with_its_reason():
    model, x = _model_and_input()

    def gradient_penalty():
        (gx,) = torch.autograd.grad(_loss(model, x), x, create_graph=True)
        return gx.pow(2).sum()

    gradient_penalty().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    x.grad = None
    with camlir_logs("recompiles") as messages, camlir.enable(backend="cpu"):
        gradient_penalty().backward()  # the outer backward is captured; the inner one is not
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e)
    assert camlir.counters["fallbacks"] == 1 and camlir.counters["compiles"] >= 1
    assert any("create_graph=True" in m for m in messages)
    reasons = [e.reason for e in camlir.explain(kind="fallback")]
    assert len(reasons) == 1 and "torch.autograd.grad() with create_graph=True" in reasons[0]

    # backward(create_graph=True) too; fullgraph refuses instead of falling back
    with camlir.enable(backend="cpu"):
        _loss(model, x).backward(create_graph=True)
    assert model[0].weight.grad.requires_grad
    model.zero_grad(set_to_none=True)  # breaks the parameter <-> gradient cycle
    with camlir.enable(backend="cpu", fullgraph=True), pytest.raises(camlir.UnsupportedError,
                                                                     match="create_graph=True"):
        torch.autograd.grad(_loss(model, x), x, create_graph=True)


def test_batched_grads_fall_back():
    model, x = _model_and_input()
    out = model(x)
    basis = torch.eye(out.numel()).view(-1, *out.shape)
    (expected,) = torch.autograd.grad(out, x, basis, retain_graph=True, is_grads_batched=True)
    with camlir.enable(backend="cpu"):
        (got,) = torch.autograd.grad(out, x, basis, is_grads_batched=True)
    torch.testing.assert_close(got, expected)
    assert camlir.counters["fallbacks"] == 1
    assert "is_grads_batched=True" in camlir.explain(kind="fallback")[0].reason


def test_grad_restored_when_camlir_is_off():
    assert torch.autograd.grad.__module__ == "torch.autograd"
    with camlir.enable():
        assert torch.autograd.grad is not camlir.capture.engine._original_grad
    assert torch.autograd.grad is camlir.capture.engine._original_grad
