"""camlir.draw and `python -m camlir.drawing`: an SVG of a captured backward that says which
autograd nodes became which native kernels, which stayed host ops or Python hooks, where
gradients accumulate, and which nodes come from AOT regions."""

import glob
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.nn as nn

import camlir
from camlir import drawing as draw_module

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.reset()


def _boxes(path) -> dict:
    """label -> (classes, [texts]) of every box (accumulations keyed by their second line),
    plus all the SVG's texts under ''."""
    root = ET.parse(path).getroot()
    assert root.tag == SVG + "svg"
    boxes = {"": (set(), [t.text or "" for t in root.iter(SVG + "text")])}
    for g in root.iter(SVG + "g"):
        texts = [t.text or "" for t in g.iter(SVG + "text")]
        classes = set(g.get("class").split())
        key = texts[1] if "accumulate" in classes else g.get("data-label") or texts[0]
        assert key not in boxes, key
        boxes[key] = (classes, texts)
    return boxes


class Solve(nn.Module):
    """A Linear with a hook that stays a Python call (it prints), then a triangular solve,
    whose backward's `linalg_solve_triangular` the cpu backend keeps on the host."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.eye(4) + 0.1 * torch.randn(4, 4).triu())
        self.lin = nn.Linear(4, 4)
        self.lin.weight.register_hook(lambda g: print("a Python hook") or g)

    def forward(self, x):
        return (torch.linalg.solve_triangular(self.w, self.lin(x).T, upper=True).sin() * 2).sum()


def test_mlp_backward_shows_nodes_kernels_and_accumulations(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
    with camlir.enable(backend="cpu"):
        model(torch.randn(5, 6)).sum().backward()
    path = camlir.draw(str(tmp_path / "mlp.svg"))
    boxes = _boxes(path)
    kernels = sorted(camlir.compiled_programs()[-1][2].kernels)
    for name in ("SumBackward0#1", "AddmmBackward0#2", "GeluBackward0#5", "TBackward0#7"):
        classes, texts = boxes[name]
        assert {"ca-node", "kernel"} <= classes and texts[1].startswith("@backward_kernel_"), (name, texts)
    all_text = " ".join(boxes[""][1])
    assert all(f"@{k}" in all_text for k in kernels)
    accumulations = [texts for classes, texts in boxes.values() if "accumulate" in classes]
    # the parameters by their module path (issue 31, point 7), not `arg8`
    assert len(accumulations) == 4 and all(t[0] == "accumulate_grad" and t[1].startswith(".grad of ")
                                           and ".grad of arg" not in t[1] for t in accumulations), accumulations
    assert "accumulation into .grad" in all_text


def test_hook_and_host_op_are_marked(tmp_path, capsys):
    torch.manual_seed(0)
    model = Solve()
    with camlir.enable(backend="cpu"):
        model(torch.randn(3, 4)).backward()
    boxes = _boxes(camlir.draw(str(tmp_path / "solve.svg")))
    classes, texts = boxes["hook 0 (tensor_pre_hook)"]
    assert "python-hook" in classes and "Python call" in texts[1]
    classes, texts = boxes["LinalgSolveTriangularBackward0#4"]
    assert "host-op" in classes and "host: aten.linalg_solve_triangular" in texts[1]
    assert "kernel" in boxes["AddmmBackward0#6"][0]


def test_aot_nodes_are_dashed_and_labelled():
    text = """module {
  func.func @backward(%arg0: !torch.vtensor<[4],f32>, %arg1: !torch.vtensor<[4],f32>) {
    %0 = "ca.node"(%arg0) ({
    ^bb0(%a: !torch.vtensor<[4],f32>):
      %1 = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
      "ca.yield"(%1) : (!torch.vtensor<[4],f32>) -> ()
    }) {aot = 0 : i64, index = 1 : i64, node = "NegBackward0"} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
    "ca.accumulate_grad"(%arg1, %0) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
    return
  }
}"""
    pic = draw_module.picture(text)
    [node] = [it for it in pic.items.values() if it.kind == "node"]
    assert node.aot == 0 and node.detail.startswith("aot0") and node.kernels == ["backward_kernel_0"]
    svg = draw_module.to_svg(pic)
    root = ET.fromstring(svg)
    [g] = [g for g in root.iter(SVG + "g") if "aot" in g.get("class").split()]
    assert g.find(SVG + "rect").get("stroke-dasharray")
    assert len(pic.edges) == 1


def test_cli_draws_a_dumped_module_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path / "dump"))
    torch.manual_seed(0)
    with camlir.enable(backend="cpu"):
        Solve()(torch.randn(3, 4)).backward()
    [module_file] = glob.glob(str(tmp_path / "dump" / "graph1" / "*-import.mlir"))
    [linalg_file] = glob.glob(str(tmp_path / "dump" / "graph1" / "*-linalg.mlir"))
    out = tmp_path / "cli.svg"
    result = subprocess.run([sys.executable, "-m", "camlir.drawing", module_file, str(out), "--lowered", linalg_file],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "CA_DUMP_DIR": ""})
    assert result.returncode == 0, result.stderr
    assert "7 autograd nodes, 2 kernels" in result.stdout
    boxes = _boxes(out)
    assert "host-op" in boxes["LinalgSolveTriangularBackward0#4"][0]
    assert "python-hook" in boxes["hook 0 (tensor_pre_hook)"][0]
    # Without --lowered, the CLI runs the kernels and linalg stages itself: same picture here.
    in_process = draw_module.picture(open(module_file).read())
    assert "no hook traced" in in_process.source and len(in_process.kernels) == 2
