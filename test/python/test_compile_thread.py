"""The cpu compile runs from the layouts stage on in a thread of its own (compile_thread.py);
hook tracing stays in the backward's thread."""

import contextvars
import threading

import pytest
import torch

import camlir
from camlir.capture import hook_trace
from camlir.backends.cpu import compiler as cpu_compiler
from camlir.compile_thread import run_apart

_setting = contextvars.ContextVar("_setting", default="unset")


def test_run_apart_returns_raises_and_keeps_context_variables():
    token = _setting.set("set here")
    try:
        assert run_apart(lambda a, b=0: (a + b, _setting.get(), threading.current_thread().name), 1, b=2) == \
            (3, "set here", "camlir-compile")

        def fails():
            raise KeyError("from the compile thread")
        with pytest.raises(KeyError, match="from the compile thread"):
            run_apart(fails)
    finally:
        _setting.reset(token)


def test_lowering_runs_apart_and_hooks_are_traced_in_the_backwards_thread(monkeypatch):
    seen = {}
    for module, name in ((hook_trace, "trace_hooks"), (cpu_compiler, "make_native")):
        original = getattr(module, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            seen[_name] = threading.current_thread()
            return _original(*args, **kwargs)
        monkeypatch.setattr(module, name, spy)
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "0")
    camlir.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model[0].weight.register_hook(lambda g: g * 0.5)
    x = torch.randn(5, 6)
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with camlir.enable(backend="cpu"):
        model(x).square().sum().backward()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e)
    assert seen["trace_hooks"] is threading.current_thread()
    assert seen["make_native"].name == "camlir-compile"
    camlir.reset()
