"""The gpu backend without a GPU: every zoo backward compiles to PTX that ptxas assembles,
the exported artifact is read back and validated by the torch-only runner (in a process where
camlir, torch-mlir and llvmlite cannot be imported), and `backend="gpu"` says clearly that it
needs CUDA. Tests that run kernels are marked `cuda` and skipped where there is no GPU."""

import json
import os
import subprocess
import sys

import pytest
import torch

import camlir
from camlir.backends.gpu import codegen, export, runner

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import gpu_zoo  # noqa: E402 - bench/ is not a package

needs_ptxas = pytest.mark.skipif(codegen.ptxas_path() is None, reason="ptxas (CUDA toolkit) is not on the PATH")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: kernels cannot run here")


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.reset()


def _export(name, directory):
    model, inputs, loss = gpu_zoo.build(name)
    return export.export_backward(lambda: loss(model, *inputs), str(directory))


@needs_ptxas
@pytest.mark.parametrize("name", sorted(gpu_zoo.ZOO))
def test_zoo_backward_reaches_ptx_that_assembles_for_sm90(name, tmp_path):
    paths = _export(name, tmp_path)
    assert paths
    for path in paths:
        artifact = runner.load(path)  # validates the plan against the PTX
        assert runner.ptx_entries(artifact.ptx), "no device kernels"
        assert ".version 8.0" in artifact.ptx and ".target sm_90" in artifact.ptx
        assert "__nv_cosf" not in artifact.ptx, "uncalled libdevice functions left in the PTX (not internalized)"
        cubin = codegen.assemble(artifact.ptx, "sm_90")
        assert cubin[:4] == b"\x7fELF"
        manifest = json.loads(open(os.path.join(path, "manifest.json")).read())
        launches = [s for plan in manifest["kernels"].values() for s in plan["steps"] if s["op"] == "launch"]
        assert all(s["block"] == [256, 1, 1] for s in launches)
        if name in ("mlp_gelu", "transformer_layer"):  # matmuls are host calls, never loops
            assert any(s["op"] == "gemm" for plan in manifest["kernels"].values() for s in plan["steps"])


@needs_ptxas
def test_sm80_target(ctx):
    from camlir import pipeline
    from camlir.backends.gpu import program as gpu_program
    from camlir.backends.gpu.compiler import GpuBackend
    from camlir.stages import Dump

    w = torch.randn(8, 4, requires_grad=True)
    x = torch.randn(16, 8)
    with gpu_program.recording() as recorded:
        with camlir.enable(backend="gpu", fullgraph=True):
            torch.nn.functional.softplus(x @ w).sum().backward()
    (program, args), = recorded
    again, _ = pipeline.compile(GpuBackend(target="sm_80", require_device=False), program.reference, args, [],
                                Dump("test"))
    assert ".target sm_80" in again.ptx
    codegen.assemble(again.ptx, "sm_80")


def test_stages_are_dumped_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path / "dump"))
    _export("softmax_cross_entropy", tmp_path / "art")
    stages = [f.stem.split("-", 1)[1] for f in sorted((tmp_path / "dump" / "graph1").glob("*"))]
    order = ["kernels", "linalg", "split", "gpu-bufferize", "gpu-matmuls", "gpu-map", "gpu-outline", "nvvm",
             "llvm-ir", "ptx"]
    assert [s for s in stages if s in order] == order, stages


_BLOCKED_RUN = r"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("camlir", "torch_mlir", "llvmlite", "numpy_mlir"):
            raise ImportError("blocked: " + name)
        return None
sys.meta_path.insert(0, Block())
sys.path.insert(0, sys.argv[1])
import runner
art = runner.load(sys.argv[2])
print("kernels", len(art.kernels), "entries", len(runner.ptx_entries(art.ptx)))
print("modules", sorted(m for m in sys.modules if m.split(".")[0] in ("camlir", "torch_mlir", "llvmlite")))
"""


def test_runner_needs_only_torch_and_validates_the_export(tmp_path):
    path, = _export("mlp_gelu", tmp_path)
    assert sorted(os.listdir(path)) == ["inputs.pt", "kernels.ptx", "manifest.json", "runner.py"]
    done = subprocess.run([sys.executable, "-c", _BLOCKED_RUN, path, path], capture_output=True, text=True,
                          cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    assert "modules []" in done.stdout
    assert "kernels 1" in done.stdout

    manifest = json.loads(open(os.path.join(path, "manifest.json")).read())
    assert manifest["format"] == "camlir-gpu/1"
    assert [i["param"] for i in manifest["inputs"]].count(True) == 6  # three Linear layers: w and b
    inputs = torch.load(os.path.join(path, "inputs.pt"))
    assert [list(t.shape) for t in inputs] == [i["shape"] for i in manifest["inputs"]]


def test_runner_rejects_a_broken_artifact(tmp_path):
    path, = _export("softmax_cross_entropy", tmp_path)
    manifest_path = os.path.join(path, "manifest.json")
    good = open(manifest_path).read()
    manifest = json.loads(good)
    plan = next(iter(manifest["kernels"].values()))
    launch = next(s for s in plan["steps"] if s["op"] == "launch")
    launch["entry"] = "no_such_kernel"
    open(manifest_path, "w").write(json.dumps(manifest))
    with pytest.raises(runner.ArtifactError, match="no_such_kernel"):
        runner.load(path)
    manifest = json.loads(good)
    manifest["format"] = "camlir-gpu/0"
    open(manifest_path, "w").write(json.dumps(manifest))
    with pytest.raises(runner.ArtifactError, match="format"):
        runner.load(path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_cuda_the_first_backward_says_so():
    w = torch.randn(4, requires_grad=True)
    with camlir.enable(backend="gpu"):
        with pytest.raises(RuntimeError, match=r"backend 'gpu' needs a CUDA device: torch.cuda.is_available\(\) is False"):
            (w * 3).sum().backward()


def test_python_hooks_cannot_be_exported(tmp_path):
    # export compiles with fullgraph=True, which on the gpu as on the cpu refuses a hook that
    # stays a Python call (it only exists in this process)
    w = torch.randn(4, requires_grad=True)
    w.register_hook(lambda g: print("side effect", g.sum().item()) or g)
    with pytest.raises(camlir.UnsupportedError, match="hook 0 stays a Python call"):
        export.export_backward(lambda: (w.sin() * 2).sum(), str(tmp_path))


@cuda
@pytest.mark.parametrize("name", sorted(gpu_zoo.ZOO))
def test_zoo_on_cuda_matches_eager(name):
    model, inputs, loss = gpu_zoo.build(name)
    model = model.cuda()
    inputs = [i.cuda() for i in inputs]
    loss(model, *inputs).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with camlir.enable(backend="gpu", fullgraph=True):
        loss(model, *inputs).backward()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e, rtol=1e-4, atol=1e-5)


@cuda
def test_exported_artifact_runs_on_cuda(tmp_path):
    model, inputs, loss = gpu_zoo.build("mlp_gelu")
    loss(model, *inputs).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    path, = _export("mlp_gelu", tmp_path)
    artifact = runner.load(path)
    args = [t.cuda() for t in torch.load(os.path.join(path, "inputs.pt"))]
    artifact.run(args)
    grads = [a.grad for a, spec in zip(args, artifact.manifest["inputs"]) if spec["param"]]
    assert len(grads) == len(expected) and all(g is not None and g.is_cuda for g in grads)
    key = lambda t: (tuple(t.shape), float(t.double().sum()))  # noqa: E731 - match by shape, then value
    for g, e in zip(sorted(grads, key=key), sorted(expected, key=key)):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-5)
