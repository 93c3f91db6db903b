"""Kernels with the same code are compiled once (backends/cpu/same_kernels.py)."""

import pytest
import torch
from torch_mlir import ir

import camlir
from camlir import disk_cache
from camlir.backends.cpu import same_kernels
from camlir.context import make_context
from camlir.dialects.ca.ir_helpers import func_name, funcs

_MODULE = """
module {
  func.func private @k1(%a: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel} {
    %0 = arith.addf %a, %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @k10(%a: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel} {
    %0 = arith.mulf %a, %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @k2(%b: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel} {
    %0 = arith.addf %b, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @k3(%a: tensor<4xf32>) -> tensor<4xf32> attributes {ca.kernel} {
    %0 = arith.mulf %a, %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @k4(%a: tensor<8xf32>) -> tensor<8xf32> attributes {ca.kernel} {
    %0 = arith.addf %a, %a : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
"""


def test_copies_are_dropped_and_point_at_the_first():
    with make_context():
        module = ir.Module.parse(_MODULE)
        shared = same_kernels.merge_identical(module)
        left = [func_name(fn) for fn in funcs(module)]
    # @k2 is @k1 under another name (its argument's name is not printed); @k3 is @k10;
    # @k4 has other shapes. @k1's name is a prefix of @k10's and does not confuse them.
    assert shared == {"k2": "k1", "k3": "k10"}
    assert left == ["k1", "k10", "k4"]


def _blocks():
    """In float64: four batch norms in a row make float32's rounding differences larger than
    the tolerance, with or without shared kernels."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, bias=False),
                                                     torch.nn.BatchNorm2d(8),
                                                     torch.nn.Hardswish()) for _ in range(4)]).double()


def _check(model, x):
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with camlir.enable(backend="cpu"):
        model(x).square().sum().backward()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e, rtol=1e-4, atol=1e-5)


@pytest.fixture
def native(monkeypatch):
    """The compiled kernels themselves: no torch twin, no routing to the eager engine."""
    monkeypatch.setenv("CAMLIR_KERNEL_CHOICE", "0")
    monkeypatch.setenv("CAMLIR_GRAPH_CHOICE", "0")
    camlir.reset()
    yield
    camlir.reset()


def test_repeated_blocks_compile_once_and_give_eager_gradients(native, tmp_path, monkeypatch):
    """Four equal conv + batch-norm + hardswish blocks: the kernels between the convolutions
    (which stay on the host) repeat, and only the first of each kind is compiled."""
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "0")
    model, x = _blocks(), torch.randn(2, 8, 16, 16, dtype=torch.float64)
    _check(model, x)
    [graph] = [d for d in tmp_path.iterdir() if d.is_dir()]
    before = (next(graph.glob("*-split.mlir"))).read_text().count("func.func")
    after = (next(graph.glob("*-same-code.mlir"))).read_text().count("func.func")
    assert after < before, (before, after)
    _check(model, torch.randn(2, 8, 16, 16, dtype=torch.float64))  # the cached program, new values


def test_a_program_with_shared_kernels_comes_back_from_disk(native, tmp_path, monkeypatch):
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "1")
    monkeypatch.setenv("CAMLIR_CACHE_DIR", str(tmp_path / "cache"))
    model, x = _blocks(), torch.randn(2, 8, 16, 16, dtype=torch.float64)
    _check(model, x)
    disk_cache.flush()
    camlir.reset()  # stands for another process: PyTorch's cache and camlir's forgotten
    _check(model, x)
    assert camlir.counters["compiles"] == 0 and camlir.counters["disk_cache_hits"] == 1, camlir.explain_text()
