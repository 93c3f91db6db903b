"""bf16 matmuls through MKL's bf16 GEMM (ca-bf16-matmuls, `camlir_gemm_bf16`): gradients of
an autocast model equal eager's at bf16's tolerance, with and without the CPU's bf16 units."""

import glob
import os

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


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.GELU(), torch.nn.Linear(160, 64),
                               torch.nn.LayerNorm(64), torch.nn.Linear(64, 8))


def _step(model, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(x).float().pow(2).mean()


def _blas_stage(tmp_path) -> str:
    (path,) = glob.glob(os.path.join(str(tmp_path), "graph*", "*-blas.mlir"))
    return open(path).read()


@pytest.mark.parametrize("native", [True, False])
def test_autocast_mlp_gradients_match_eager(tmp_path, monkeypatch, native):
    if native and not jit.native_bf16_gemm():
        pytest.skip("this CPU has no bf16 units (avx512_bf16 / amx_bf16): sgemm serves bf16 matmuls")
    monkeypatch.setattr(jit, "_BF16", [native])
    model, x = _model(), torch.randn(48, 96)
    _step(model, x).backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    camlir.compile_backward(_step(model, x))
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1.6e-2, atol=2e-2 * w.abs().max().item())
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0
    blas = _blas_stage(tmp_path)
    assert ("call @camlir_gemm_bf16(" in blas) == native
    assert "call @camlir_gemm_f32(" in blas or native
