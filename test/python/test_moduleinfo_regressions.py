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
