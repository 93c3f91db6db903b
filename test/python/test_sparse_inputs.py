"""A sparse CSR leaf in a backward: camlir compiles strided tensors only, so the graph is
handed back to PyTorch with a reason naming the layout, and the gradients are eager's.
With the disk cache on, keying such a graph raised from `Tensor.stride()` (found by the
OpInfo run on `sparse.sampled_addmm`)."""

import logging

import pytest
import torch

import camlir


def _sampled_addmm(backend):
    torch.manual_seed(0)
    a = torch.randn(4, 4).relu().to_sparse_csr().requires_grad_()
    b = torch.randn(4, 5, requires_grad=True)
    c = torch.randn(5, 4, requires_grad=True)
    out = torch.sparse.sampled_addmm(a, b, c, alpha=0.5, beta=0.3).values()
    loss = (out * torch.arange(out.numel(), dtype=out.dtype)).sum()
    if backend is None:
        loss.backward()
    else:
        with camlir.enable(backend=backend):
            loss.backward()
    return a.grad, b.grad, c.grad


@pytest.mark.parametrize("backend", ["eager", "cpu"])
@pytest.mark.parametrize("disk_cache", ["0", "1"])
def test_sparse_csr_leaf_falls_back_with_eager_gradients(backend, disk_cache, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CAMLIR_DISK_CACHE", disk_cache)
    monkeypatch.setenv("CAMLIR_CACHE_DIR", str(tmp_path))
    camlir.reset()
    expected = _sampled_addmm(None)
    with caplog.at_level(logging.WARNING, logger="camlir"):
        got = _sampled_addmm(backend)
    assert got[0].layout == torch.sparse_csr
    torch.testing.assert_close(got[0].to_dense(), expected[0].to_dense())
    torch.testing.assert_close(got[1], expected[1])
    torch.testing.assert_close(got[2], expected[2])
    assert camlir.counters["fallbacks"] == 1
    assert "sparse_csr tensor" in caplog.text
    camlir.reset()
