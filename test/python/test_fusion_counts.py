"""Kernel counts before and after ca-fuse-elementwise, on captured backwards."""

import re

import pytest
import torch
import torch.nn as nn
from torch_mlir import ir

import camlir
from camlir.context import make_context
from camlir.passes.fuse_elementwise import count_kernels
from camlir.passes.pipeline import run_pipeline

LOWER = "ca-inline-hooks,ca-flatten-nodes,ca-outline-kernels,ca-lower-to-linalg"


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.reset()


def _captured(model, x, hook=None):
    if hook is not None:
        for p in model.parameters():
            p.register_hook(hook)
    with camlir.enable(backend="cpu"):
        model(x).sum().backward()
    [(_, text)] = camlir.captured_graphs()
    return text


def _counts(text):
    with make_context():
        module = ir.Module.parse(text)
        run_pipeline(module, LOWER)
        before = count_kernels(module.operation)
        run_pipeline(module, "ca-fuse-elementwise")
        after = count_kernels(module.operation)
        return before, after, str(module)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))


def test_mlp_gelu_backward_fuses():
    before, after, text = _counts(_captured(_mlp(), torch.randn(16, 32)))
    assert after < before, (before, after)
    # The loss gradient's broadcast fuses into the first GELU backward: no generic that
    # only copies a scalar survives.
    assert text.count("linalg.matmul") == 5  # 3 layers: 1 + 2 + 2 matmuls, all kept


def test_hook_carrying_backward_fuses_hook_math(tmp_path, monkeypatch):
    # The module as the trace-hooks stage left it, from the stage dumps (CA_DUMP_DIR).
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path))
    _captured(_mlp(), torch.randn(16, 32), hook=lambda g: g * 0.5)
    [dumped] = (tmp_path / "graph1").glob("*-trace-hooks.mlir")
    text = dumped.read_text()
    assert "ca.hook" in text and "@hook_" in text  # the hooks were traced for inlining
    before, after, lowered = _counts(text)
    assert after < before, (before, after)
    assert "ca.alpha = 5.000000e-01" in lowered  # weight hooks became BLAS alpha
    assert "ca.hook" not in lowered


def test_weight_gradient_of_a_3d_input_reads_the_gradient_transposed(tmp_path, monkeypatch):
    # A Linear on (batch, tokens, features): its weight gradient is `t(view(g)) @ x`, which
    # torch-mlir lowers as a 3-D transpose behind a collapse_shape. The matmul must read `g`
    # with BLAS's transpose flag instead of a copied transpose (W3's 1024x1024 one cost
    # 5.4 ms of a 12.4 ms kernel), and the gradients must match eager's.
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path))
    torch.manual_seed(0)
    # No bias, an input that needs no gradient: the view of `g` has the transpose as its only
    # user, and the canonicalizer then moves the collapse behind a 3-D transpose.
    model, reference = nn.Linear(12, 20, bias=False), nn.Linear(12, 20, bias=False)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(3, 5, 12)
    seen = []

    def loss(m):
        y = m(x)
        # A Python hook with a side effect stays a call: the gradient of `y` enters the
        # next kernel as an argument, as W3's did, instead of being computed inside it.
        y.register_hook(lambda g: seen.append(g.shape) or g)
        return (y.relu() * 2).sum()

    with camlir.enable(backend="cpu"):
        loss(model).backward()
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["interpreted"] == 0
    loss(reference).backward()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad)
    assert len(seen) == 2
    [kernels] = (tmp_path / "graph1").glob("*-kernels.mlir")
    assert "torch.aten.t " in kernels.read_text(), "the pattern this test is about"
    [linalg] = (tmp_path / "graph1").glob("*-linalg.mlir")
    bodies = [f for f in linalg.read_text().split("func.func")[1:] if "attributes {ca.kernel}" in f.splitlines()[0]]
    assert bodies and not any("linalg.transpose" in k for k in bodies), linalg.read_text()


def test_attention_in_projection_weight_gradient_matches_eager(tmp_path, monkeypatch):
    # The in-projection's weight gradient reads q, k and v's gradients stacked as x[s, a, b, j]
    # with rows (s, j): ca-fuse-elementwise now feeds BLAS the transpose of the order
    # (a, b, s, j), a copy in contiguous runs of j, instead of a strided one. Exercise it
    # natively and compare with eager.
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path))
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    reference = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(3, 10, 32)
    with camlir.enable(backend="cpu", fullgraph=True):
        (layer(x) ** 2).sum().backward()
    (reference(x) ** 2).sum().backward()
    for p, r in zip(layer.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5)
    [blas] = (tmp_path / "graph1").glob("*-blas.mlir")
    assert "permutation = [0, 4, 3, 1, 2]" not in blas.read_text(), "the strided copy is gone"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_bmm_reads_transposed_operands_with_blas_flags(tmp_path, monkeypatch, dtype):
    # `q @ k.transpose(-1, -2)` and `p @ v`: their backward multiplies by the saved operands
    # transposed in their last two dims. Those transposes must become the batch_matmul's
    # maps (BLAS flags), not copies, and the batch must reach `?gemm_batch_` in one call.
    # The gradients must match eager's, including a batch whose matrices BLAS cannot read
    # as they are (strided in both dims: the per-matrix loop, packing).
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 5, dtype=dtype, requires_grad=True) for _ in range(3))
    w = torch.randn(6, 9, 10, dtype=dtype, requires_grad=True)

    def loss(q, k, v, w):
        p = (q @ k.transpose(-1, -2)).softmax(-1)
        both_strided = torch.bmm(w[:, ::3, ::2], w[:, 1::3, 1::2].transpose(1, 2))
        return ((p @ v) ** 2).sum() + both_strided.square().sum()

    ours = [t.detach().clone().requires_grad_() for t in (q, k, v, w)]
    with camlir.enable(backend="cpu", fullgraph=True):
        loss(*ours).backward()
    loss(q, k, v, w).backward()
    for mine, theirs in zip(ours, (q, k, v, w)):
        torch.testing.assert_close(mine.grad, theirs.grad)
    [linalg] = (tmp_path / "graph1").glob("*-linalg.mlir")
    text = linalg.read_text()
    transposed = re.findall(r"(%\w+) = linalg\.transpose .* permutation = \[0, 2, 1\]", text)
    bmm_ins = " ".join(re.findall(r"linalg\.batch_matmul .*ins\(([^:]*):", text))
    assert bmm_ins and not [t for t in transposed if re.search(re.escape(t) + r"\b", bmm_ins)], text
    [llvm] = (tmp_path / "graph1").glob("*-llvm.mlir")
    assert ("@sgemm_batch_" if dtype == torch.float32 else "@dgemm_batch_") in llvm.read_text()
