"""NaN and zero in the compiled backward behave as in eager.

torch-mlir lowers several ops with compares that drop a NaN eager propagates (ReLU's
backward gave 0 where eager's gradient is NaN: found by the ModuleInfo run on LPPool1d,
whose forward makes NaN from negative inputs), and guards `reciprocal` with an assert that
aborts the process on a 0 element. camlir decomposes those ops before lowering
(camlir/capture/decompositions.py); each case here compiles one backward that meets a NaN
(or a 0) and compares it with eager's.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import camlir

NAN = float("nan")
aten = torch.ops.aten


def _saved_backward(formula):
    """An autograd.Function whose backward is `formula(grad, x)` (x saved by the forward)."""

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return formula(grad, x)

    return Fn.apply


def _grads(fn, inputs, backend=None):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    loss = fn(*leaves).sum()
    if backend is None:
        loss.backward()
    else:
        with camlir.enable(backend=backend):
            loss.backward()
    return [t.grad for t in leaves]


def _check(fn, *inputs, nan_in_grad=True):
    camlir.reset()
    expected = _grads(fn, inputs)
    actual = _grads(fn, inputs, "cpu")
    assert camlir.counters["captures"] >= 1 and camlir.counters["fallbacks"] == 0
    for e, a in zip(expected, actual):
        if nan_in_grad:
            assert any(torch.isnan(e).tolist()), "the case must meet a NaN in eager's gradient"
        torch.testing.assert_close(a, e, equal_nan=True)


X = torch.tensor([0.5, NAN, -1.0, 0.0, 2.0, 0.25])


@pytest.mark.parametrize("name,formula", [
    ("threshold_backward", lambda g, x: aten.threshold_backward(g * x, x, 0)),
    ("softplus_backward", lambda g, x: aten.softplus_backward(g, x, 1.0, 20.0)),
    ("clamp", lambda g, x: torch.clamp(g * x, -0.5, 0.5)),
    ("clamp_min", lambda g, x: torch.clamp_min(g * x, 0.0)),
    ("clamp_max", lambda g, x: torch.clamp_max(g * x, 0.0)),
    ("clamp_tensor", lambda g, x: torch.clamp(g * x, torch.zeros_like(x), torch.ones_like(x))),
    ("hardtanh", lambda g, x: F.hardtanh(g * x)),
    ("relu6", lambda g, x: F.relu6(g * x)),
    ("threshold", lambda g, x: F.threshold(g * x, 0.1, 20.0)),
    ("maximum", lambda g, x: torch.maximum(g * x, torch.full_like(x, 0.3))),
    ("minimum", lambda g, x: torch.minimum(torch.full_like(x, 0.3), g * x)),
    ("smooth_l1_loss_backward", lambda g, x: aten.smooth_l1_loss_backward(g, x, torch.zeros_like(x), 1, 1.0)),
])
def test_nan_flows_through_the_backward_as_in_eager(name, formula):
    _check(_saved_backward(formula), X)


def test_relu_of_a_nan_activation_passes_the_gradient():
    # eager: relu(NaN) = NaN, and its backward passes the gradient (NaN <= 0 is false): -2 at x = -1
    _check(lambda x: torch.relu(x.log()) * 2.0, torch.tensor([0.5, -1.0, 2.0, 1e-3]), nan_in_grad=False)


def test_lppool1d_with_negative_inputs():
    # LPPool's forward takes x ** 1.5: NaN for negative x, then relu and pow of the pooled sums
    torch.manual_seed(0)
    pool = torch.nn.LPPool1d(1.5, 2)
    _check(pool, torch.randn(1, 3, 8))


def test_smooth_l1_loss_with_nan_input():
    _check(lambda x: F.smooth_l1_loss(x, torch.zeros_like(x), reduction="sum", beta=0.5),
           torch.tensor([0.1, NAN, -2.0, 0.3]))


def test_reciprocal_of_zero_does_not_abort():
    # torch-mlir guarded reciprocal with an assert that killed the process on a 0 element
    script = textwrap.dedent("""
        import torch, camlir
        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * 1.0
            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return torch.reciprocal(x) * g
        def grad(backend):
            x = torch.tensor([0.5, 0.0, -2.0, float("nan")], requires_grad=True)
            if backend:
                with camlir.enable(backend=backend):
                    Fn.apply(x).sum().backward()
            else:
                Fn.apply(x).sum().backward()
            return x.grad
        torch.testing.assert_close(grad("cpu"), grad(None), equal_nan=True)
        assert camlir.counters["captures"] == 1 and camlir.counters["fallbacks"] == 0
        print("ok", grad("cpu").tolist())
    """)
    env = dict(os.environ, CAMLIR_DISK_CACHE="0")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ok [2.0, inf, -0.5, nan]" in done.stdout
