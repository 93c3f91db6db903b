"""camlir.save_repro and CAMLIR_REPRO_DIR: a repro folder replays one captured backward in a
fresh process, without the model, through the cpu backend and the reference interpreter."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import camlir
from camlir import repro
from camlir.backends import eager as eager_backend
from camlir.backends.cpu import compiler as cpu_compiler
from camlir.backends.host_runtime import InterpreterError

MATCH = "the cpu backend matches the reference interpreter"


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("CAMLIR_REPRO_DIR", raising=False)
    monkeypatch.setattr(repro, "keep_inputs", False)
    camlir.reset()
    yield
    camlir.reset()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))


def _backward(model, backend="cpu", steps=1):
    x = torch.randn(5, 6)
    for _ in range(steps):
        loss = model(x).pow(2).sum()
        with camlir.enable(backend=backend):
            loss.backward()


def _run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(script))


def test_repro_of_an_mlp_backward_replays_in_a_fresh_process(tmp_path, monkeypatch):
    monkeypatch.setattr(repro, "keep_inputs", True)
    model = _mlp()
    _backward(model, steps=2)  # graph 2 reads the .grads graph 1 made: accumulation adds to them
    script = camlir.save_repro(str(tmp_path / "r"))
    assert sorted(os.listdir(tmp_path / "r")) == ["inputs.pt", "meta.json", "module.mlir", "repro.py"]
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["graph"] == 2 and meta["hooks"] == [] and sum(i.startswith("param") for i in meta["inputs"]) == 4
    result = _run(script)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"camlir repro, graph 2: {MATCH} (4 gradients" in result.stdout
    # With no tolerance at all, the polynomial GELU differs in the last bits: exit status 1.
    exact = _run(script, "--rtol", "0", "--atol", "0")
    if exact.returncode == 0:
        assert "max abs difference 0.00e+00" in exact.stdout
    else:
        assert exact.returncode == 1 and "MISMATCH" in exact.stdout, exact.stdout + exact.stderr


def test_without_kept_inputs_save_repro_says_how_to_keep_them(tmp_path):
    _backward(_mlp())
    with pytest.raises(repro.ReproError, match="keep_inputs"):
        camlir.save_repro(str(tmp_path / "r"))


def test_python_hooks_are_refused_unless_replaced_by_identity(tmp_path, monkeypatch):
    monkeypatch.setattr(repro, "keep_inputs", True)
    model = _mlp()

    def clip(g):
        return g.clamp(-1, 1)

    model[0].weight.register_hook(clip)
    _backward(model)
    with pytest.raises(repro.ReproError, match=r"Python hooks.*hook 0 \(tensor_pre_hook: .*clip\).*identity"):
        camlir.save_repro(str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()
    camlir.save_repro(str(tmp_path / "identity"), hooks="identity")
    meta = json.loads((tmp_path / "identity" / "meta.json").read_text())
    assert meta["hooks_replaced_by_identity"] and meta["hooks"][0]["kind"] == "tensor_pre_hook"
    assert "clip" in meta["hooks"][0]["callable"]
    assert "WARNING" in (tmp_path / "identity" / "repro.py").read_text()


def test_a_graph_that_falls_back_writes_a_repro_under_CAMLIR_REPRO_DIR(tmp_path, monkeypatch):
    monkeypatch.setenv("CAMLIR_REPRO_DIR", str(tmp_path))

    def refuse(work):
        raise InterpreterError("aten.fake", "made up by the test")

    monkeypatch.setattr(eager_backend, "interpret", refuse)
    _backward(_mlp(), backend="eager")
    assert camlir.counters["fallbacks"] == 1
    folder = tmp_path / "graph1"
    assert sorted(os.listdir(folder)) == ["inputs.pt", "meta.json", "module.mlir", "repro.py"]
    meta = json.loads((folder / "meta.json").read_text())
    assert "made up by the test" in meta["reason"]
    monkeypatch.undo()  # the repro runs in a fresh process with the real interpreter
    result = _run(str(folder / "repro.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "made up by the test" in result.stdout and MATCH in result.stdout


def test_a_cpu_compile_failure_writes_a_repro_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CAMLIR_REPRO_DIR", str(tmp_path))

    def broken(*args, **kwargs):
        raise RuntimeError("the jit exploded")

    monkeypatch.setattr(cpu_compiler, "make_native", broken)
    _backward(_mlp(), steps=3)  # graph 1 (no .grad yet), graph 2 twice
    assert camlir.counters["interpreted"] == 2 and camlir.counters["captures"] == 2
    assert sorted(os.listdir(tmp_path)) == ["graph1", "graph2"]
    meta = json.loads((tmp_path / "graph1" / "meta.json").read_text())
    assert "RuntimeError: the jit exploded" in meta["reason"]
    assert (tmp_path / "graph1" / "module.mlir").read_text().startswith("module")
