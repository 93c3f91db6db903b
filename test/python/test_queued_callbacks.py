"""Callbacks a hook or custom backward queues on the autograd engine run under camlir as on
the eager engine: once per backward, when it ends (capture/engine.py,
`_CallbackKeepingEngine`). PyTorch's compiled autograd drops them (torch 2.13); FSDP- and
DDP-style reducers finish their work in one."""

import pytest
import torch

import camlir
from camlir.capture import engine

_queue = lambda fn: torch.autograd.Variable._execution_engine.queue_callback(fn)  # noqa: E731


@pytest.fixture(autouse=True)
def _fresh():
    camlir.reset()
    yield
    camlir.reset()


def _steps(mode, backend, make_loss, steps=3):
    seen = []
    for step in range(steps):
        torch.manual_seed(step)
        x = torch.randn(5, requires_grad=True)
        loss = make_loss(x, seen)
        if mode == "camlir":
            with camlir.enable(backend=backend):
                loss.backward()
        else:
            loss.backward()
    return seen


@pytest.mark.parametrize("backend", ["cpu", "eager"])
def test_a_hook_that_queues_a_callback_has_it_run_after_the_gradients(backend):
    def make_loss(x, seen):
        def hook(g):
            # the callback reads x.grad: it must run after the whole backward accumulated it
            _queue(lambda: seen.append(x.grad.clone()))
            return g * 2

        y = x * 3
        y.register_hook(hook)
        return (y * y).sum()

    eager = _steps("eager", backend, make_loss)
    ours = _steps("camlir", backend, make_loss)
    assert camlir.counters["compiles"] == 1 and camlir.counters["cache_hits"] == 2
    assert len(ours) == len(eager) == 3
    for e, o in zip(eager, ours):
        torch.testing.assert_close(o, e)


class _Finishes(torch.autograd.Function):
    """A custom backward that queues its own end-of-backward work through a helper (so its
    bytecode shows no write outside itself). Traced, the callback was queued once, at trace
    time, and never by the compiled program; the trace now refuses it and the node becomes a
    host call: its backward runs in Python on every call, queueing its callbacks, and the
    rest of the graph is compiled."""

    seen = []

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        _queue(lambda: _Finishes.seen.append("outer"))
        _queue(lambda: _queue(lambda: _Finishes.seen.append("queued by a callback")))
        return g * 2


def test_a_custom_backward_that_queues_callbacks_has_them_all_run_in_order():
    def make_loss(x, seen):
        return _Finishes.apply(x).sum()

    _Finishes.seen = []
    _steps("eager", "cpu", make_loss)
    eager = list(_Finishes.seen)
    _Finishes.seen = []
    _steps("camlir", "cpu", make_loss)
    assert eager == ["outer", "queued by a callback"] * 3
    assert _Finishes.seen == eager
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["compiles"] == 1
    assert [e.what for e in camlir.explain(kind="host_call")] == ["node _FinishesBackward#2"]


def test_pytorchs_engine_is_back_when_camlir_is_off():
    original = engine._original_engine
    assert torch.autograd.Variable._execution_engine is original
    with camlir.enable():
        assert torch.autograd.Variable._execution_engine is not original
    assert torch.autograd.Variable._execution_engine is original
    with pytest.raises(RuntimeError, match="during backward"):  # outside a backward: PyTorch's error
        with camlir.enable():
            _queue(lambda: None)
