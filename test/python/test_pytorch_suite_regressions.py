"""Regressions found by running PyTorch's own compiled-autograd tests with camlir as the
compiler (`test/python/pytorch_ca_suite.py`, docs/pytorch-suite.md). Each test says the
class of bug in our words; gradients are compared with eager PyTorch."""

import pytest
import torch

import camlir

BACKENDS = ["eager", "cpu"]


@pytest.fixture(autouse=True)
def _fresh():
    camlir.reset()
    yield
    camlir.reset()


@pytest.mark.parametrize("backend", BACKENDS)
def test_error_while_running_the_graph_is_raised_not_retried_eagerly(backend):
    # Anomaly mode makes compiled autograd check for NaNs when it starts running a captured
    # graph, after it has released the graph's saved tensors. Its error must reach the
    # caller; retrying the backward eagerly (what camlir does for a failed capture) can only
    # fail with "backward through the graph a second time" and hides the real message.
    with torch.autograd.detect_anomaly():
        a = torch.randn(5, 5, requires_grad=True)
        a.grad = torch.full((5, 5), float("nan"))
        loss = torch.matmul(a, torch.randn(5, 5)).sum()
        with pytest.raises(AssertionError, match="already having NaN gradient"):
            with camlir.enable(backend=backend):
                loss.backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_anomaly_mode_without_nans_still_compiles_exactly(backend):
    # The same path without a NaN: the graph runs through camlir, gradients as eager.
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(2, 4)

    def step():
        return (torch.matmul(x, w).sin() * 3).sum()

    step().backward()
    expected = w.grad.clone()
    w.grad = None
    with torch.autograd.detect_anomaly(), camlir.enable(backend=backend):
        step().backward()
    torch.testing.assert_close(w.grad, expected)
    assert camlir.counters["fallbacks"] == 0
