"""`camlir.profile()` splits each kernel's time into its BLAS calls and the rest: the
kernel's own code times every GEMM it hands to MKL and counts its flops
(ca-define-blas-wrappers). The flops are exact (2 m n k per matrix), so they are checked
against the model's shapes, on every way a kernel reaches the process: JIT-compiled here,
compiled in parts and linked, built by a compile worker, loaded from the disk cache."""

import pytest
import torch

import camlir
from camlir import compiled, disk_cache
from camlir.backends.cpu import jit

BATCH = 8
# Linear(32, 64) -> ReLU -> Linear(64, 16), input without grad: the weight gradients of both
# layers and the input gradient of the second are GEMMs.
FLOPS = 2 * BATCH * (16 * 64 + 64 * 16 + 64 * 32)
GEMMS = 3


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setenv("CAMLIR_KERNEL_CHOICE", "0")  # native kernels only: every call runs the GEMMs
    monkeypatch.setenv("CAMLIR_GRAPH_CHOICE", "0")
    camlir.reset()
    yield monkeypatch
    camlir.reset()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))


def _backward(model, compiled=True):
    model.zero_grad(set_to_none=True)
    loss = model(torch.randn(BATCH, 32)).pow(2).sum()
    if compiled:
        with camlir.enable(backend="cpu", wait=True):
            loss.backward()
    else:
        loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def _profiled(model, calls=3):
    _backward(model)  # compiles
    with camlir.profile() as prof:
        for _ in range(calls):
            _backward(model)
    return prof


def _check(prof, calls=3):
    blas = {label: step for label, step in prof.as_dict()["steps"].items() if "blas_calls" in step}
    assert blas, prof.table()
    assert all(label.startswith("kernel @") for label in blas)
    assert sum(s["blas_flops"] for s in blas.values()) == calls * FLOPS
    assert sum(s["blas_calls"] for s in blas.values()) == calls * GEMMS
    for step in blas.values():  # a kernel without GEMMs beside one with them counts none
        assert 0 < step["blas_seconds"] <= step["seconds"] or step["blas_calls"] == step["blas_seconds"] == 0
    table = prof.table()
    assert "BLAS (MKL's gemm)" in table and "GFLOP/s" in table and "the rest (loops, packing)" in table


def test_jit_kernels_count_their_gemms(fresh):
    model = _model()
    prof = _profiled(model)
    _check(prof)
    torch.manual_seed(5)
    expected = _backward(model, compiled=False)
    torch.manual_seed(5)
    for g, e in zip(_backward(model), expected):  # counting changes no value
        torch.testing.assert_close(g, e)


def test_no_blas_no_split(fresh):
    torch.manual_seed(0)
    w = torch.randn(64, requires_grad=True)
    with camlir.enable(backend="cpu", wait=True):
        (w.tanh() * 3).sum().backward()
    with camlir.profile() as prof:
        with camlir.enable(backend="cpu", wait=True):
            w.grad = None
            (w.tanh() * 3).sum().backward()
    assert prof.steps and not prof.blas
    assert "BLAS" not in prof.table()


def test_parts_linked_into_one_library_share_one_count(fresh, tmp_path):
    fresh.setattr(jit, "PARALLEL_MIN_OPS", 0)
    fresh.setenv("CAMLIR_JIT_WORKERS", "2")
    fresh.setenv("CAMLIR_DISK_CACHE", "1")
    fresh.setenv("CAMLIR_CACHE_DIR", str(tmp_path / "cache"))
    model = _model()
    # A Python hook between the layers cuts the backward into two kernels: two parts.
    model[2].register_full_backward_hook(lambda m, gi, go: None)
    _check(_profiled(model))
    disk_cache.flush()
    camlir.reset()  # another process, as far as camlir's caches go: the program is loaded
    prof = _profiled(model)
    assert camlir.counters["compiles"] == 0 and camlir.counters["disk_cache_hits"] == 1
    _check(prof)


def test_kernels_from_a_compile_worker_count_their_gemms(fresh):
    fresh.setenv("CAMLIR_COMPILE_WORKERS", "1")
    camlir.reset()
    prof = _profiled(_model())
    programs = [p for _, backend, p in compiled.compiled_programs() if backend == "cpu"]
    assert programs and isinstance(programs[-1].kernels[next(iter(programs[-1].kernels))]._engine,
                                   jit.SharedKernels)  # the worker's library, loaded here
    _check(prof)
    assert camlir.wait(120)
