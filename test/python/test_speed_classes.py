"""Two classes of cpu-backend slowness (issue 11, "Speed on real models"), checked by what
they looked like and by the gradients:

- `pow` by a constant integer (tanh-GELU's `x**3`, RMSNorm's `x.pow(2)`, every pow's
  backward) became `math.fpowi`; on vectors it has no LLVM form, and the whole kernel
  module fell back to scalar loops. `ca-expand-powers` turns it into multiplications.
- activation backwards torch-mlir cannot lower (hardswish, hardsigmoid, ...) stayed on the
  host, cutting the backward into many kernels; they are decomposed now
  (`capture/decompositions.py`), as are two it lowered wrong (hardtanh's boundaries,
  rrelu in eval mode).
"""

import os

import pytest
import torch
import torch.nn.functional as F
from torch_mlir import ir

import camlir
from camlir.backends.cpu import jit
from camlir.backends.cpu.compiler import loops_and_llvm
from camlir.stages import Dump
from helpers import camlir_logs


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    # Native kernels only: the gradients checked are those of the compiled code.
    monkeypatch.setenv("CAMLIR_KERNEL_CHOICE", "0")
    camlir.reset()
    yield
    camlir.reset()


def _backward(fn, x0, extra=()):
    """(eager grad, camlir cpu grad, camlir log lines) of `(fn(x) * r).sum()`."""
    torch.manual_seed(3)
    r = torch.randn_like(fn(x0, *extra))
    x = x0.clone().requires_grad_()
    (fn(x, *extra) * r).sum().backward()
    expected = x.grad
    x = x0.clone().requires_grad_()
    with camlir_logs("recompiles") as messages:
        camlir.compile_backward((fn(x, *extra) * r).sum(), backend="cpu")
    return expected, x.grad, messages


# --------------------------------------------------------------------------- pow

POW_EXPONENTS = [-2, -1, 0, 1, 2, 3, 4, 0.5, -0.5, 2.0, 3.0, -3, 16]


@pytest.mark.parametrize("exponent", POW_EXPONENTS, ids=repr)
def test_pow_stays_vectorized(exponent, tmp_path, monkeypatch):
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path))
    torch.manual_seed(0)
    x0 = torch.rand(8, 64) * 1.5 + 0.25  # positive: fractional powers, no division by 0
    if isinstance(exponent, int) and exponent >= 0:
        x0[::2] = -x0[::2]  # odd and even integer powers of negative numbers too
    expected, got, messages = _backward(lambda x: x.pow(exponent), x0)
    torch.testing.assert_close(got, expected)
    assert not [m for m in messages if "scalar loops" in m], messages
    llvm = sorted(p for p in tmp_path.rglob("*-llvm.mlir"))
    assert llvm, "no llvm stage dumped"
    text = llvm[-1].read_text()
    assert f"vector<{jit.vector_width()}xf32>" in text and "llvm.intr.powi" not in text


def test_gelu_tanh_by_hand_is_vectorized():
    """HF's NewGELU, written with `x ** 3`: forward and backward both read powers."""
    def new_gelu(x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))

    torch.manual_seed(1)
    expected, got, messages = _backward(new_gelu, torch.randn(16, 64) * 3)
    torch.testing.assert_close(got, expected)
    assert not [m for m in messages if "scalar loops" in m], messages


def test_non_constant_powi_on_vectors_keeps_the_module_vectorized():
    """A `powi` whose exponent is not a constant stays; on vectors it is unrolled per lane
    (`convert-math-to-funcs`) instead of sending the whole module to scalar loops."""
    text = """
    #id = affine_map<(d0) -> (d0)>
    module {
      func.func @k(%x: memref<64xf32>, %y: memref<64xf32>, %n: i64, %out: memref<64xf32>,
                   %out2: memref<64xf32>) attributes {ca.kernel} {
        linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
            ins(%x : memref<64xf32>) outs(%out : memref<64xf32>) {
        ^bb0(%a: f32, %o: f32):
          %p = math.fpowi %a, %n : f32, i64
          linalg.yield %p : f32
        }
        linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]}
            ins(%y : memref<64xf32>) outs(%out2 : memref<64xf32>) {
        ^bb0(%a: f32, %o: f32):
          %e = math.exp %a : f32
          linalg.yield %e : f32
        }
        return
      }
    }
    """
    context = camlir.make_context()
    with context, ir.Location.unknown(), camlir_logs("recompiles") as messages:
        module = ir.Module.parse(text)
        llvm = loops_and_llvm(module, Dump("test"))
    assert not [m for m in messages if "scalar loops" in m], messages
    out = str(llvm)
    assert "llvm.call @__mlir_math_fpowi_f32_i64" in out
    assert f"vector<{jit.vector_width()}xf32>" in out and "llvm.intr.powi" not in out


# --------------------------------------------------------------------------- activations

# Boundaries of every activation below, exactly, and the f32 neighbours of the hardswish
# ones; then values around.
_POINTS = [-20.0, -6.0, -4.0, -3.0000002, -3.0, -2.9999998, -1.0000001, -1.0, -0.99999994,
           -0.5, -0.49999997, 0.0, 0.49999997, 0.5, 0.50000006, 0.99999994, 1.0, 1.0000001,
           2.9999998, 3.0, 3.0000002, 4.0, 5.9999995, 6.0, 6.0000005, 20.0, 21.0, 100.0]


def _boundary_input():
    torch.manual_seed(2)
    points = torch.tensor(_POINTS)
    return torch.cat([points, torch.randn(128 - len(points)) * 4]).reshape(4, 32)


ACTIVATIONS = {
    "hardswish": (F.hardswish, "hardswish_backward"),
    "hardsigmoid": (F.hardsigmoid, "hardsigmoid_backward"),
    "hardtanh": (F.hardtanh, "hardtanh_backward"),
    "relu6": (F.relu6, "hardtanh_backward"),
    "mish": (F.mish, "mish_backward"),
    "logsigmoid": (F.logsigmoid, "log_sigmoid_backward"),
    "softshrink": (F.softshrink, "softshrink_backward"),
    "hardshrink": (F.hardshrink, "hardshrink_backward"),
    "rrelu_eval": (lambda x: F.rrelu(x, training=False), "rrelu_with_noise_backward"),
    "prelu": (lambda x: F.prelu(x, torch.tensor([0.25])), "_prelu_kernel_backward"),
    "glu": (lambda x: F.glu(x, -1), "glu_backward"),
    # Lowered natively before already; checked at the same boundaries.
    "silu": (F.silu, "silu_backward"),
    "elu": (F.elu, "elu_backward"),
    "softplus": (F.softplus, "softplus_backward"),
    "threshold": (lambda x: F.threshold(x, 0.5, 2.0), "threshold_backward"),
    "sigmoid": (torch.sigmoid, "sigmoid_backward"),
    "tanh": (torch.tanh, "tanh_backward"),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_backward_is_native_and_exact(name):
    fn, op = ACTIVATIONS[name]
    expected, got, messages = _backward(fn, _boundary_input())
    torch.testing.assert_close(got, expected)
    assert not [m for m in messages if "kept on the host" in m], messages
    [(_, backend, program)] = camlir.compiled_programs()
    assert backend == "cpu"
    assert f"torch.aten.{op}" not in _host_function(program.lowered_text), program.lowered_text


def _host_function(text: str) -> str:
    """The text of `func.func @backward` (the host program; kernels are other functions)."""
    [host] = [chunk for chunk in text.split("func.func ") if chunk.startswith("@backward(")]
    return host


def test_hardswish_boundaries_exactly():
    """Eager's formula: 0 for x <= -3, grad * (x/3 + 1/2) for -3 < x < 3, grad for x >= 3."""
    x0 = torch.tensor([-3.0, 3.0, -3.0000002, -2.9999998, 2.9999998, 3.0000002] * 4).reshape(3, 8)
    expected, got, _ = _backward(F.hardswish, x0)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_mobilenet_block_is_one_kernel_per_fused_region():
    """conv, batch norm, hardswish: no host op left between the kernels."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                                torch.nn.Hardswish(), torch.nn.Conv2d(16, 8, 1), torch.nn.Hardsigmoid())
    x = torch.randn(2, 8, 8, 8)
    with camlir_logs("recompiles") as messages:
        camlir.compile_backward(block(x).sum(), backend="cpu")
    assert not [m for m in messages if "kept on the host" in m], messages
    ours = [p.grad.clone() for p in block.parameters()]
    for p in block.parameters():
        p.grad = None
    block(x).sum().backward()
    for got, expected in zip(ours, [p.grad for p in block.parameters()]):
        torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)
