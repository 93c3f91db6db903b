"""Regressions found by the ModuleInfo differential run (test/python/moduleinfo_diff.py,
docs/module-coverage.md), each in its own words: the backward through camlir's cpu backend
matches eager's. Cases that hung run in a subprocess with a time limit."""

import os
import subprocess
import sys
import textwrap

import pytest

_SCALAR_SOFTMAX = textwrap.dedent("""
    import sys, torch, camlir
    module = {"softmax": torch.nn.Softmax(0), "log_softmax": torch.nn.LogSoftmax(0)}[sys.argv[1]]
    def grad(backend):
        x = torch.tensor(0.7, requires_grad=True)
        loss = module(x) * 0.3 + module(x * 2.0) * 0.5
        if backend:
            with camlir.enable(backend=backend):
                loss.backward()
        else:
            loss.backward()
        return x.grad
    expected, actual = grad(None), grad("cpu")
    torch.testing.assert_close(actual, expected)
    assert camlir.counters["captures"] == 1 and camlir.counters["fallbacks"] == 0, dict(camlir.counters)
    assert camlir.counters["interpreted"] == 0, dict(camlir.counters)
    print("ok")
""")


@pytest.mark.parametrize("which", ["softmax", "log_softmax"])
def test_softmax_of_a_scalar_compiles(which):
    # torch-mlir's lowering of a 0-d softmax backward never returned (nn.Softmax(0) on a scalar)
    env = dict(os.environ, CAMLIR_DISK_CACHE="0")
    try:
        done = subprocess.run([sys.executable, "-c", _SCALAR_SOFTMAX, which], capture_output=True, text=True,
                              timeout=120, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the backward of a 0-d {which} did not finish in 120 s (the lowering hangs)")
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]


@pytest.mark.parametrize("pad", [(2, 1), (1, -1, 0, 2), (-1, 2, 1, 0, 0, 1)])
def test_padding_backward_compiles_natively(pad):
    # the backward of a padding is a negative padding; torch-mlir's lowering of it failed to
    # bufferize and the graph ran on the reference interpreter
    import torch

    import camlir

    torch.manual_seed(0)
    x0 = torch.randn(2, 3, 4, 5)
    weight = torch.randn(x0.shape)

    def grad(backend):
        x = x0.clone().requires_grad_(True)
        out = torch.nn.functional.pad(x * weight, pad, value=0.5)
        loss = (out * torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)).sum()
        if backend:
            with camlir.enable(backend=backend):
                loss.backward()
        else:
            loss.backward()
        return x.grad

    camlir.reset()
    expected, actual = grad(None), grad("cpu")
    torch.testing.assert_close(actual, expected)
    assert camlir.counters["captures"] == 1
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0, dict(camlir.counters)
