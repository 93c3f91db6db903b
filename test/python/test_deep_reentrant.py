"""A backward run from inside another, deeper than the autograd engine's reentrant limit
(60): the engine runs the inner backward on a worker thread and waits for it. camlir's
wrapper on that thread did not know it was inside a backward, waited for the lock the
outer backward held, and deadlocked (PyTorch's test_deep_reentrant under camlir)."""

import threading

import pytest
import torch

import camlir


class _DeepReentrant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        with torch.enable_grad():
            ctx.x = x.detach().requires_grad_(True) - 1
        return ctx.x.detach()

    @staticmethod
    def backward(ctx, grad):
        if ctx.x < 0:
            return grad
        with torch.enable_grad():
            _DeepReentrant.apply(ctx.x).sum().backward()
        return grad * 2


def _run(depth, backend):
    v = torch.tensor(float(depth), requires_grad=True)
    if backend is None:
        _DeepReentrant.apply(v).sum().backward()
    else:
        with camlir.enable(backend=backend):
            _DeepReentrant.apply(v).sum().backward()
    return v.grad


@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_reentrant_backward_past_the_engines_depth_limit(backend):
    camlir.reset()
    expected = [_run(d, None) for d in (10, 100)]
    result = {}

    def body():
        result["grads"] = [_run(d, backend) for d in (10, 100)]

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "deadlocked: the backward past depth 60 never finished"
    for g, e in zip(result["grads"], expected):
        torch.testing.assert_close(g, e)
    camlir.reset()
