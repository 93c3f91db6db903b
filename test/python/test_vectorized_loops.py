"""Loops that used to stay scalar or narrow (ca-index-as-input, ca-narrow-scalar-inputs):
gradients equal eager's, and the loops stage vectorizes them at the machine's width."""

import glob
import math
import os
import re

import pytest
import torch

import camlir
from camlir.backends.cpu import jit


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("CAMLIR_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "0")
    camlir.reset()
    yield
    camlir.reset()


def _loops_stage(tmp_path) -> str:
    (path,) = sorted(glob.glob(os.path.join(str(tmp_path), "graph*", "*-loops.mlir")))[-1:]
    return open(path).read()


def _check(fn, *leaves):
    fn(*leaves).backward()
    want = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    camlir.compile_backward(fn(*leaves))
    for t, w in zip(leaves, want):
        torch.testing.assert_close(t.grad, w, rtol=1e-5, atol=1e-6)
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0


def test_cross_entropy_with_ignored_targets_vectorizes_its_one_hot(tmp_path):
    torch.manual_seed(0)
    logits = torch.randn(64, 1000, requires_grad=True)  # past the parallel-loop threshold: nests of their own
    target = torch.randint(0, 1000, (64,))
    target[::5] = -100  # ignored positions: their row of the gradient is zero

    _check(lambda z: torch.nn.functional.cross_entropy(z * 1.5, target), logits)
    loops = _loops_stage(tmp_path)
    nests = re.split(r"\n  func\.func @", loops)[1:]
    outlined = [n for n in nests if "__par" in n.split("(")[0]]
    scalar = [n.split("(")[0] for n in outlined if not re.search(r"vector<\d+x", n)]
    assert len(outlined) >= 2 and not scalar, f"scalar loop nests: {scalar} of {len(outlined)}"


def test_a_python_float_divisor_keeps_the_full_vector_width(tmp_path):
    torch.manual_seed(0)
    q = torch.randn(4, 16, 32, requires_grad=True)
    k = torch.randn(4, 16, 32, requires_grad=True)

    def attention(q, k):  # Hugging Face BERT's scaling: a tensor divided by a Python float
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(32)
        return (scores.softmax(-1) * scores.tanh()).sum()

    _check(attention, q, k)
    loops = _loops_stage(tmp_path)
    width = int(re.search(r"virtual-vector-size=(\d+)", loops.splitlines()[0]).group(1))
    assert width == jit.vector_width(), loops.splitlines()[0]
    assert "xf64>" not in loops


def test_a_python_float_under_bf16_autocast_keeps_the_full_vector_width(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(64, 256, requires_grad=True)
    w = torch.randn(256, 256, requires_grad=True)

    def step(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = (x @ w) * 0.125  # a Python float in the bf16 region
            return (h.tanh() / math.sqrt(3.0)).float().sum()

    step(x, w).backward()
    want = [x.grad.clone(), w.grad.clone()]
    x.grad = w.grad = None
    camlir.compile_backward(step(x, w))
    for got, ref in zip((x.grad, w.grad), want):
        torch.testing.assert_close(got, ref, rtol=1.6e-2, atol=2e-2 * ref.abs().max().item())
    loops = _loops_stage(tmp_path)
    width = int(re.search(r"virtual-vector-size=(\d+)", loops.splitlines()[0]).group(1))
    assert width == jit.vector_width(), loops.splitlines()[0]
