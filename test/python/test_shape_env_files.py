"""camlir's stand-in for the ShapeEnv's `uninteresting_files` (capture/shape_env_files.py)
names the same files as PyTorch's, and a capture no longer imports Inductor."""

import subprocess
import sys

from torch.fx.experimental import symbolic_shapes

from camlir.capture import shape_env_files


def test_same_files_as_pytorchs():
    ours = shape_env_files.uninteresting_files()
    pytorchs = shape_env_files._pytorchs()
    assert ours == pytorchs
    assert len(ours) > 20 and "<string>" in ours


def test_installed_over_pytorchs():
    import camlir.capture.engine  # noqa: F401 - installs it

    assert symbolic_shapes.uninteresting_files is shape_env_files.uninteresting_files


def test_a_module_without_a_file_falls_back_to_pytorchs(monkeypatch):
    monkeypatch.setattr(shape_env_files, "_MODULES", shape_env_files._MODULES + ("torch.no_such_module_here",))
    shape_env_files.uninteresting_files.cache_clear()
    try:
        assert shape_env_files.uninteresting_files() == shape_env_files._pytorchs()
    finally:
        shape_env_files.uninteresting_files.cache_clear()


_CAPTURE = r"""
import sys, torch, camlir
lin = torch.nn.Linear(4, 3)
ref = torch.nn.Linear(4, 3)
ref.load_state_dict(lin.state_dict())
x = torch.randn(5, 4)
with camlir.enable(backend="eager", dynamic=True):
    lin(x).sum().backward()
ref(x).sum().backward()
torch.testing.assert_close(lin.weight.grad, ref.weight.grad)
assert camlir.counters["captures"] == 1, camlir.counters
# (torch._dynamo imports the torch._inductor package itself; its sizevars pull in the compiler)
print("inductor" if "torch._inductor.sizevars" in sys.modules else "no inductor",
      "export" if "torch.export._trace" in sys.modules else "no export")
"""


def test_a_capture_with_symbolic_sizes_imports_no_inductor(tmp_path):
    # In a fresh process: the test session itself may have imported Inductor already.
    out = subprocess.run([sys.executable, "-c", _CAPTURE], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "CAMLIR_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["no", "inductor", "no", "export"], out.stdout
